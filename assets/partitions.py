"""Shards are dynamic partitions: registering a dataset (CLI or inbox sensor) adds its shard keys."""
import dagster as dg

shards = dg.DynamicPartitionsDefinition(name="shards")
