"""VideoFeatures from a store: each shard's clips grouped by video, with its manifest row as labels.

Raw latents load here; an anonymized table loads through the same grouping (publish.anonymized_tables), so a head
never knows which it reads.
"""
from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from splavu_core.ingest.datasets import dataset_of
from splavu_core.store.feature_store import FeatureStore, StoreError
from splavu_core.tasks.features import VideoFeatures

JSON_COLUMNS = ("segments", "anomaly_intervals")
META_DEFAULTS = ("path", "action", "segments", "anomaly", "anomaly_intervals", "subject_id", "group")


def shard_manifest_rows(store: FeatureStore, shard: str) -> dict[str, dict]:
    rows = {}
    for r in store.read_shard_manifest(shard).to_pylist():
        meta = {k: None for k in META_DEFAULTS}
        for k, v in r.items():
            meta[k] = json.loads(v) if k in JSON_COLUMNS and isinstance(v, str) else v
        rows[r["video_id"]] = meta
    return rows


def group_videos(shard: str, index: pa.Table, feats: np.ndarray, manifest: dict[str, dict]) -> list[VideoFeatures]:
    order = pc.sort_indices(index, [("video_id", "ascending"), ("clip_index", "ascending")]).to_numpy()
    vids = index["video_id"].to_numpy(zero_copy_only=False)[order]
    cols = {c: index[c].to_numpy(zero_copy_only=False)[order] for c in ("start_s", "end_s", "end_frame", "split")}
    bounds = np.flatnonzero(np.r_[True, vids[1:] != vids[:-1], True])
    found = {}
    for a, b in zip(bounds[:-1], bounds[1:]):
        vid = vids[a]
        if vid not in manifest:
            raise StoreError(f"shard {shard!r}: video {vid!r} has clips but no row in its manifest")
        end_s, end_frame = cols["end_s"][a:b], cols["end_frame"][a:b]
        meta = {**manifest[vid], "dataset": dataset_of(shard), "shard": shard}
        meta.pop("video_id", None), meta.pop("split", None)
        found[vid] = VideoFeatures(video_id=vid, split=cols["split"][a], feats=np.ascontiguousarray(feats[order[a:b]]),
                                   clip_start_s=cols["start_s"][a:b].astype(np.float64), clip_end_s=end_s.astype(np.float64),
                                   n_frames=int(end_frame[-1]), fps=float(end_frame[0] / end_s[0]), meta=meta)
    return [found[v] for v in manifest if v in found]  # manifest order: deterministic


def chosen_shards(store: FeatureStore, available, source: str, datasets: list[str] | None = None,
                  shards: list[str] | None = None) -> list[str]:
    """The shards of `available` to load: `shards` (each must be available) and only `datasets`' (None: all)."""
    available = list(available)
    if shards is not None:
        missing = sorted(set(shards) - set(available))
        if missing:
            raise StoreError(f"no {source} features for shards {missing} in {store.root}")
        available = [s for s in available if s in set(shards)]
    if datasets is not None:
        available = [s for s in available if dataset_of(s) in set(datasets)]
    return available


def load_raw_features(store: FeatureStore, datasets: list[str] | None = None,
                      shards: list[str] | None = None) -> list[VideoFeatures]:
    """Every video of the chosen committed shards (all by default) as VideoFeatures from the raw latents."""
    videos = []
    for shard in chosen_shards(store, store.committed_shards(), "raw", datasets, shards):
        data = store.read_shard(shard, with_static=False)
        videos += group_videos(shard, data.index, data.clips, shard_manifest_rows(store, shard))
    return videos
