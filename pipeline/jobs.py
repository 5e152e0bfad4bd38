"""Jobs: what a data engineer or a schedule runs."""
import dagster as dg

from assets.baselines import pixel_baselines
from assets.partitions import shards

extract_job = dg.define_asset_job(
    "extract_latents", selection=dg.AssetSelection.assets("video_manifest", "clip_latents", "static_latents"),
    partitions_def=shards, description="Validate a shard's manifest rows and extract its raw latents.")

train_aam_job = dg.define_asset_job(
    "train_aam", selection=dg.AssetSelection.assets("aam_model"),
    description="Train an AAM from the cached clip and static latents (the encoder is never loaded); "
                "`reanonymize` then publishes it.")

evaluate_job = dg.define_asset_job(
    "evaluate", selection=dg.AssetSelection.groups("evaluation"),
    description="Score raw and anonymized features on every task and write the privacy-utility report.")

pixel_baselines_job = dg.define_asset_job(
    "pixel_baselines", selection=dg.AssetSelection.groups("baselines"), partitions_def=pixel_baselines,
    description="Re-extract the evaluation datasets through one pixel-space anonymizer per partition (blur, blacken, "
                "2x/4x downsampling) into its own store; then run `evaluate` to score them beside raw and splavu.")

forget_job = dg.define_asset_job(
    "forget", selection=dg.AssetSelection.assets("forget_request", "forget_refit"),
    description="Forget videos or a subject (config: videos / subjects and a reason, or the request_id `splavu forget` "
                "opened): remove them from every layer, retire the AAM versions fitted on them, check, log the "
                "receipt; then, when the current version was fitted on them, refit it without them, publish it to "
                "every shard through both gates, check again and complete the receipt. `splavu forget` launches it.")
