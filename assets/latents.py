"""clip_latents + static_latents: the frozen encoder's embeddings of one shard (RAW, sensitive)."""
import time

import dagster as dg

from assets.partitions import shards
from assets.resources import EncoderResource, StoreResource
from splavu_core.extract.shards import extract_shard, manifest_hash
from splavu_core.forget import erase_raced
from splavu_core.ingest.datasets import dataset_of, registration, shard_rows, static_clips
from splavu_core.store import costs


@dg.multi_asset(
    specs=[dg.AssetSpec("clip_latents", deps=["video_manifest"], kinds={"zarr"},
                        description="Every non-overlapping clip of every video, mean-pooled tokens: (N, D)."),
           dg.AssetSpec("static_latents", deps=["video_manifest"], kinds={"zarr"},
                        description="K static clips (one frame repeated) per training video: (V, K, D).")],
    partitions_def=shards, group_name="latents", pool="encoder",
)
def extracted_latents(context: dg.AssetExecutionContext, store: StoreResource, encoder: EncoderResource):
    shard = context.partition_key
    feature_store = store.store()
    manifest, rows = shard_rows(feature_store, shard, log=context.log.warning)
    enc = encoder.load()
    sampling = encoder.sampling()
    prov = enc.provenance(sampling)
    feature_store.claim(prov)  # refuses a store of another encoder before any work
    mhash = manifest_hash(rows)
    t0 = time.perf_counter()
    step = max(1, len(rows) // 10)

    def progress(n):
        if n % step == 0 or n == len(rows):
            context.log.info(f"{shard}: {n}/{len(rows)} videos")

    def extract():
        return extract_shard(shard, rows, manifest.root, enc, sampling, batch_size=encoder.batch_size,
                             decode_threads=encoder.decode_threads, static_splits=encoder.static_splits_for(
                                 dataset_of(shard), static_clips(registration(feature_store, dataset_of(shard)))),
                             log=context.log.warning, progress=progress)

    # another writer of this shard (another Dagster instance) goes first; then this one finds its commit and skips
    marker, skipped = feature_store.produce_shard(shard, prov, mhash, extract, on_wait=context.log.warning)
    if skipped:
        context.log.info(f"{shard}: already extracted with this encoder and manifest; nothing to do")
    else:  # an erasure that ran while this extraction encoded (object stores only lock the commit) wins
        marker = erase_raced(feature_store, shard, log=context.log.warning) or marker
    secs = time.perf_counter() - t0
    n_static = 0 if skipped else int(marker["static_videos"]) * sampling.static_k
    encoded = marker["clips"] + n_static  # throughput counts every clip through the encoder
    if not skipped:  # the cost ledger: what producing features from these videos took
        costs.record(feature_store, "raw", "extract", shard, secs, videos=marker["videos"], clips=marker["clips"])
    common = {"encoder_fingerprint": prov["encoder_fingerprint"], "skipped": skipped,
              "path": dg.MetadataValue.path(str(feature_store.shard_dir(shard)))}
    yield dg.MaterializeResult(asset_key="clip_latents", metadata={
        **common, "clips": marker["clips"], "videos": marker["videos"], "dim": marker["dim"],
        "quarantined": marker["quarantined"],
        "clips_per_s": dg.MetadataValue.float(round(encoded / secs, 1) if not skipped and secs > 0 else 0.0)})
    yield dg.MaterializeResult(asset_key="static_latents", metadata={
        **common, "static_videos": marker["static_videos"], "static_k": sampling.static_k,
        "static_clips": n_static})
