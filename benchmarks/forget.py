"""What an erasure costs in a large store (prints JSON): forget one video, then one subject.

    python benchmarks/forget.py [--clips 1000000] [--clips-per-shard 2560] [--dim 192] [--out DIR]

A synthetic store (random latents written through the store's own shard commit, no video, no encoder): videos of
10 clips, two static clips each, --clips-per-shard clips a shard (2,560 = the demo's 256 videos a shard), a
manifest and labels per shard, one published AAM version (random 14-wide rows in the anonymized table), subjects of
five videos spread over different shards. Then the library's erasure (splavu_core.forget: resolve, open_request,
run_request; the Dagster job around it adds only the run's bookkeeping), timed, with what it rewrote: the raw shards
replaced (from the receipt) against the mean committed shard size, the neighbour index (rebuilt whole: it is one
matrix per version) and every other file rewritten. The check inside
the request reads every file of the store back; its time is reported apart (`check_seconds`). No refit: no dataset
is registered, so no version is fitted on the videos (the refit is the closed-form fit, timed by `splavu train`).
"""
from __future__ import annotations

import argparse
import json
import platform
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa

from splavu_core import forget as fg
from splavu_core.publish.anonymized_tables import _anonymized_table, anonymized_key
from splavu_core.serve.neighbors import write_index
from splavu_core.store.feature_store import QUARANTINE_SCHEMA, FeatureStore, ShardLatents
from splavu_core.store.ledger import record_version

CLIPS_PER_VIDEO, STATIC_K, VIDEOS_PER_SUBJECT, KEEP = 10, 2, 5, 14
FP, VERSION = "bench-encoder", "benchversion0001"


def build(root: Path, clips: int, per_shard: int, dim: int) -> FeatureStore:
    store = FeatureStore(root)
    rng = np.random.default_rng(0)
    per_shard -= per_shard % CLIPS_PER_VIDEO
    n_shards = -(-clips // per_shard)
    n_videos = clips // CLIPS_PER_VIDEO
    subjects = n_videos // VIDEOS_PER_SUBJECT
    for s in range(n_shards):
        shard = f"bench-{s:04d}"
        first = s * per_shard // CLIPS_PER_VIDEO
        vids = [f"bv_{v:07d}" for v in range(first, min(first + per_shard // CLIPS_PER_VIDEO, n_videos))]
        n = len(vids) * CLIPS_PER_VIDEO
        ci = np.tile(np.arange(CLIPS_PER_VIDEO, dtype=np.int32), len(vids))
        index = pa.table({"video_id": np.repeat(vids, CLIPS_PER_VIDEO), "clip_index": ci,
                          "start_frame": ci * 16, "end_frame": ci * 16 + 16,
                          "start_s": ci * 0.64, "end_s": ci * 0.64 + 0.64, "split": ["train"] * n},
                         schema=pa.schema([("video_id", pa.string()), ("clip_index", pa.int32()),
                                           ("start_frame", pa.int32()), ("end_frame", pa.int32()),
                                           ("start_s", pa.float64()), ("end_s", pa.float64()), ("split", pa.string())]))
        static_index = pa.table({"video_id": np.repeat(vids, STATIC_K), "k": np.tile(np.arange(STATIC_K, dtype=np.int32),
                                 len(vids)), "frame_index": np.tile(np.arange(STATIC_K, dtype=np.int32) * 8, len(vids))})
        store.write_shard(shard, ShardLatents(rng.standard_normal((n, dim), np.float32), index,
                                              rng.standard_normal((len(vids), STATIC_K, dim), np.float32), static_index,
                                              QUARANTINE_SCHEMA.empty_table()), {"encoder_fingerprint": FP}, "bench")
        # subjects spread over shards: video v belongs to subject v % subjects (five shards apart)
        store.write_shard_manifest_table(shard, pa.table({
            "video_id": vids, "path": [f"videos/{v}.mp4" for v in vids], "split": ["train"] * len(vids),
            "subject_id": [f"subject_{int(v[3:]) % subjects:06d}" for v in vids],
            "attr_skin": rng.integers(0, 2, len(vids))}))
        feats = rng.standard_normal((n, KEEP), np.float32)
        store.files.write_parquet(anonymized_key(VERSION, shard), _anonymized_table(index, feats, VERSION, FP))
    record_version(store, VERSION, {"encoder_fingerprint": FP, "config": {"dim": dim, "keep": KEEP}}, {})
    write_index(store, VERSION)  # as feature_catalog does: `splavu neighbors` reads it
    return store


def shard_bytes(store: FeatureStore) -> float:
    sizes = [store.files.size(f"latents/{s}") for s in store.committed_shards()]
    return float(np.mean(sizes))


def forget(store: FeatureStore, **what) -> dict:
    t0 = time.perf_counter()
    targets, _ = fg.resolve(store, **what)
    journal = fg.open_request(store, targets, "benchmark", subjects=what.get("subjects", ()))
    summary = fg.run_request(store, journal["request_id"], log=lambda m: print(m, file=sys.stderr))
    secs = time.perf_counter() - t0
    totals = fg.layer_totals(summary["receipt"])
    raw = totals.get("raw_latents", {})
    return {"videos": len(targets), "seconds": round(secs, 2), "check_seconds": round(summary["check"]["seconds"], 2),
            "shards_rewritten": raw.get("items", 0), "latents_bytes_rewritten": raw.get("bytes_written", 0),
            "neighbor_index_bytes_rewritten": totals.get("neighbor_index", {}).get("bytes_written", 0),
            "bytes_written_total": sum(t["bytes_written"] for t in totals.values()),
            "rows_removed": {k: t["rows_removed"] for k, t in totals.items()},
            "files_read_back": summary["check"]["files"], "check_clean": summary["check"]["clean"]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--clips", type=int, default=1_000_000)
    ap.add_argument("--clips-per-shard", type=int, default=2560)
    ap.add_argument("--dim", type=int, default=192)
    ap.add_argument("--out", help="store folder (default: a temporary one, deleted after)")
    args = ap.parse_args()
    root = Path(args.out) if args.out else Path(tempfile.mkdtemp(prefix="forget-bench-")) / "store"
    shutil.rmtree(root, ignore_errors=True)
    try:
        t0 = time.perf_counter()
        store = build(root, args.clips, args.clips_per_shard, args.dim)
        built = time.perf_counter() - t0
        res = {"clips": args.clips, "dim": args.dim, "shards": len(store.committed_shards()),
               "shard_bytes_mean": shard_bytes(store), "store_bytes": store.files.size(""),
               "build_seconds": round(built, 1), "cpu": platform.processor() or platform.machine()}
        video = store.read_shard(store.committed_shards()[len(store.committed_shards()) // 2],
                                 with_static=False).index["video_id"][0].as_py()
        res["forget_video"] = forget(store, videos=[video])
        res["forget_subject"] = forget(store, subjects=["subject_000001"])
        print(json.dumps(res, indent=1))
    finally:
        if not args.out:
            shutil.rmtree(root.parent, ignore_errors=True)


if __name__ == "__main__":
    main()
