"""Jobs: what a data engineer or a schedule runs."""
import dagster as dg

from pipeline.partitions import shards

extract_job = dg.define_asset_job(
    "extract_latents", selection=dg.AssetSelection.assets("video_manifest", "clip_latents", "static_latents"),
    partitions_def=shards, description="Validate a shard's manifest rows and extract its raw latents.")

evaluate_job = dg.define_asset_job(
    "evaluate", selection=dg.AssetSelection.groups("evaluation"),
    description="Score raw and anonymized features on every task and write the privacy-utility report.")
