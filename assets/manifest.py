"""video_manifest: the validated manifest rows of one shard."""
import dagster as dg

from assets.partitions import shards
from assets.resources import StoreResource
from splavu_core.ingest.datasets import write_shard_manifest


@dg.asset(partitions_def=shards, group_name="ingest", kinds={"parquet"},
          description="Validated manifest rows of one shard (video_id, path, split, labels, attr_*).")
def video_manifest(context: dg.AssetExecutionContext, store: StoreResource) -> dg.MaterializeResult:
    table = write_shard_manifest(store.store(), context.partition_key)
    splits = {}
    for s in table.column("split").to_pylist():
        splits[s] = splits.get(s, 0) + 1
    return dg.MaterializeResult(metadata={"videos": table.num_rows, "splits": dg.MetadataValue.json(splits),
                                          "path": dg.MetadataValue.path(str(store.store().shard_manifest_path(context.partition_key)))})
