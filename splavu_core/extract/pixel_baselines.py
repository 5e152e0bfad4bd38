"""A pixel baseline's store: the raw store's datasets re-extracted through a pixel transform.

    <root>/baselines/pixel_<name>/      a store of its own (store.json = encoder fingerprint + suffix)
        datasets/, manifests/, latents/<shard>/   same registrations, same shard keys as the raw store
        costs/pixel_<name>/extract/<shard>.json   wall time of each shard (the report's cost section)

Only clip latents are extracted (no static clips: nothing is trained on a baseline's features).
Shards already extracted with the same manifest and transform are skipped, so a rerun resumes.
"""
from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Sequence

from splavu_core.extract.encoders.vfm import FrozenEncoder
from splavu_core.extract.pixel import PixelAnonymizer, baseline_root, feature_set_name
from splavu_core.extract.sampling import ClipSampling
from splavu_core.extract.shards import extract_shard, manifest_hash
from splavu_core.ingest.datasets import dataset_of, register_dataset, registered, shard_rows, write_shard_manifest
from splavu_core.ingest.masks import PixelError
from splavu_core.store import costs
from splavu_core.store.feature_store import FeatureStore, StoreError


def baseline_store(raw: FeatureStore, name: str) -> FeatureStore:
    return FeatureStore(baseline_root(raw.root, name), storage_options=getattr(raw.files, "storage_options", None))


def existing_baselines(raw: FeatureStore) -> dict[str, FeatureStore]:
    """feature-set name (pixel_<name>) -> store, for every baseline store with committed latents
    of the same encoder as `raw`."""
    base = raw.encoder_fingerprint()
    if base is None or not raw.files.isdir("baselines"):
        return {}
    out = {}
    for name in sorted(raw.files.listdir("baselines")):
        if not name.startswith("pixel_"):
            continue
        store = baseline_store(raw, name.removeprefix("pixel_"))
        if store.committed_shards() and store.provenance().get("base_encoder_fingerprint") == base:
            out[name] = store
    return out


def eval_shards(raw: FeatureStore, datasets: Iterable[str]) -> list[str]:
    """The raw store's committed shards of `datasets`."""
    wanted = set(datasets)
    return [s for s in raw.committed_shards() if dataset_of(s) in wanted]


def stale_shards(raw: FeatureStore, baseline: FeatureStore, datasets: Iterable[str]) -> list[str]:
    """Raw shards of `datasets` that the baseline lacks or extracted from another manifest: scoring it then
    would compare different videos."""
    out = []
    for s in eval_shards(raw, datasets):
        b = baseline.committed(s)
        if b is None or b["manifest_hash"] != raw.committed(s)["manifest_hash"]:
            out.append(s)
    return out


def _same_videos_as_raw(raw: FeatureStore, shard: str, data, name: str) -> None:
    """A baseline is scored paired with raw, video by video: a video raw extracted that the transform could not
    (a missing person mask, say) stops the baseline here, before its shard is written, naming the first failure."""
    q = data.quarantine.to_pylist()
    if not q:
        return
    have = set(raw.read_shard(shard, with_static=False).index.column("video_id").to_pylist())
    lost = [r for r in q if r["video_id"] in have]
    if lost:
        raise PixelError(f"pixel baseline {name}, shard {shard}: {len(lost)} of the videos raw extracted failed here "
                         f"(nothing written), e.g. {lost[0]['error']}")


def extract_baseline(raw: FeatureStore, pixel: PixelAnonymizer, encoder: FrozenEncoder, sampling: ClipSampling,
                     datasets: Sequence[str], batch_size: int = 16, decode_threads: int = 2,
                     log: Callable[[str], None] | None = None) -> dict:
    """Extract every shard of `datasets` (registered in `raw`) through `pixel` into the baseline's store.

    Returns {store, fingerprint, shards: {shard: "extracted" | "skipped"}, clips, videos, quarantined, seconds}."""
    regs = registered(raw)
    unknown = [d for d in datasets if d not in regs]
    if unknown:
        raise StoreError(f"dataset(s) {unknown} are not registered in {raw.root} (registered: {sorted(regs)})")
    base_prov = encoder.provenance(sampling)
    if raw.encoder_fingerprint() not in (None, base_prov["encoder_fingerprint"]):
        raise StoreError(f"the raw store {raw.root} belongs to encoder {raw.encoder_fingerprint()}, not "
                         f"{base_prov['encoder_fingerprint']}: a baseline must use the raw store's encoder")
    prov = pixel.provenance(base_prov)
    store = baseline_store(raw, pixel.name)
    store.claim(prov)  # refuses a store of another transform or encoder before any work
    name = feature_set_name(pixel.name)
    out = {"store": str(store.root), "fingerprint": prov["encoder_fingerprint"], "shards": {}, "clips": 0,
           "videos": 0, "quarantined": 0, "seconds": 0.0}
    for ds in datasets:
        reg = regs[ds]
        for shard in register_dataset(store, ds, reg["manifest"], reg["shard_size"]):
            manifest, rows = shard_rows(store, shard)
            write_shard_manifest(store, shard)  # the labels the evaluation joins, as video_manifest writes them
            mhash = manifest_hash(rows)
            done = store.committed(shard)
            if done and done["manifest_hash"] == mhash and done["encoder_fingerprint"] == prov["encoder_fingerprint"]:
                out["shards"][shard] = "skipped"
                continue
            t0 = time.perf_counter()
            data = extract_shard(shard, rows, manifest.root, encoder, sampling, batch_size=batch_size,
                                 decode_threads=decode_threads, static_splits=(), log=log, pixel=pixel)
            _same_videos_as_raw(raw, shard, data, pixel.name)
            marker = store.write_shard(shard, data, prov, mhash)
            secs = time.perf_counter() - t0
            costs.record(store, name, "extract", shard, secs, videos=marker["videos"], clips=marker["clips"])
            out["shards"][shard] = "extracted"
            out["seconds"] += secs
            for k in ("clips", "videos", "quarantined"):
                out[k] += marker[k]
            if log:
                log(f"{name} {shard}: {marker['clips']} clips of {marker['videos']} videos in {secs:.1f} s")
    return out
