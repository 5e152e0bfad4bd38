"""Stage 4, anonymized tables: the adapter run over cached latents, written per shard and version."""
