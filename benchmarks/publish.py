"""Publishing throughput and analyst-query latency, measured in one run (prints JSON).

    python benchmarks/publish.py [--clips 100000] [--dim 192] [--rows-meta 1000000] [--repeats 3]

A synthetic store (random latents, no video, no encoder) holds one shard of --clips clips of
width --dim; the adapter is a default AAMConfig(dim=D) whose zero-initialised output projections
got random weights (it looks trained, and is not the identity, so the publishing guards pass).

- anonymize: splavu_core.publish.anonymized_tables.anonymize_shard, end to end: read the shard's latents (Zarr) and
  index, run the adapter, the identity / no-raw-latent guards, write the zstd Parquet table;
- parquet_only: the same path without the adapter and the guards: read the same shard, build the
  very same table (publish.anonymized_schema, the raw features in the `feature` column), write it
  to zstd Parquet the same way (atomic write).
  Target: anonymize clips/s / parquet_only clips/s >= 0.5 (the adapter must not dominate).
  `anonymize_breakdown` times the pieces of the anonymize path once, separately.
- DuckDB, through the store's catalog (<store>/catalog.duckdb, built by build_catalog):
  metadata_aggregate: SELECT split, count(*), avg(end_s - start_s) FROM clips GROUP BY split over
  --rows-meta clip-index rows (the shard's own index plus extra index-only shards);
  cosine_top10: top-10 array_cosine_similarity over the --clips anonymized features (FLOAT[D]);
  neighbors: `splavu neighbors VIDEO --k 10` (catalog.neighbors: the video's clips, then the search).
  Each query: one untimed warm-up, then the median of --query-runs runs, in ms, each on a fresh
  read-only connection (as `splavu sql` does); `warm_connection_ms` reuses one connection.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import torch

from splavu_core.aam import AAMConfig, AnonymizingAdapter, load_adapter, save_adapter
from splavu_core.aam.config import PREVIOUS_DEFAULT, TrainConfig
from splavu_core.publish import anonymized_tables as pub
from splavu_core.serve import analyst
from splavu_core.serve import catalog as cat
from splavu_core.store import ledger
from splavu_core.store.feature_store import (
    CLIP_INDEX_SCHEMA,
    QUARANTINE_SCHEMA,
    STATIC_INDEX_SCHEMA,
    FeatureStore,
    ShardLatents,
    write_parquet_atomic,
)

FP = "bench-synthetic-encoder"
SHARD = "bench-000"
CLIPS_PER_VIDEO = 8
FPS = 25.0
SPLITS = np.array(["train", "val", "test"])


def clip_index_table(n: int, first_video: int, rng) -> pa.Table:
    """n clip-index rows (CLIP_INDEX_SCHEMA): CLIPS_PER_VIDEO consecutive 16-frame clips per video."""
    i = np.arange(n)
    video = first_video + i // CLIPS_PER_VIDEO
    clip = (i % CLIPS_PER_VIDEO).astype(np.int32)
    per_video = SPLITS[rng.choice(3, size=(video[-1] - first_video + 1) if n else 0, p=[0.7, 0.1, 0.2])]
    split = per_video[video - first_video]  # one split per video, 70 / 10 / 20
    start = clip * 16
    return pa.table({"video_id": pa.array(np.char.add("v", video.astype(str))), "clip_index": clip,
                     "start_frame": start, "end_frame": start + 16,
                     "start_s": start / FPS, "end_s": (start + 16) / FPS, "split": pa.array(split)},
                    schema=CLIP_INDEX_SCHEMA)


def build_store(root: Path, n: int, dim: int, seed: int) -> FeatureStore:
    rng = np.random.default_rng(seed)
    store = FeatureStore(root)
    index = clip_index_table(n, 0, rng)
    data = ShardLatents(clips=rng.standard_normal((n, dim), dtype=np.float32), index=index,
                        static=np.zeros((0, 2, dim), np.float32), static_index=STATIC_INDEX_SCHEMA.empty_table(),
                        quarantine=QUARANTINE_SCHEMA.empty_table())
    store.write_shard(SHARD, data, {"encoder_fingerprint": FP}, manifest_hash="bench")
    vids = index["video_id"].to_numpy(zero_copy_only=False)[::CLIPS_PER_VIDEO]
    splits = index["split"].to_numpy(zero_copy_only=False)[::CLIPS_PER_VIDEO]
    manifest = pa.table({"video_id": vids, "path": np.char.add(vids.astype(str), ".mp4"), "split": splits,
                         "action": np.array(["walk", "run", "wave"])[np.arange(len(vids)) % 3]})
    write_parquet_atomic(manifest, store.shard_manifest_path(SHARD))
    return store


RECENTRE_CLASSES = 15  # the demo world's actions: the recentring stage's centroids (training sets it from the data)


def adapter_config(dim: int, kind: str) -> AAMConfig:
    """'default': what `aam_model` trains by default (aam.config.TrainConfig); 'attention': the
    sub-token attention adapter (3 layers, 8 heads, 8 sub-tokens of width 64), the earlier default."""
    if kind == "attention":
        return AAMConfig(dim=dim)
    cfg = TrainConfig() if kind != "previous" else TrainConfig().replace(**PREVIOUS_DEFAULT, projection_rank=dim // 2)
    fields = cfg.adapter
    fields.setdefault("projection_rank", int(round(cfg.projection.projection_fraction * dim)))
    if fields.get("recentre"):
        fields["centroids"] = RECENTRE_CLASSES
    return AAMConfig(dim=dim, **fields)


def make_adapter(store: FeatureStore, dim: int, seed: int, fingerprint: str = FP, kind: str = "default") -> Path:
    torch.manual_seed(seed)
    cfg = adapter_config(dim, kind)
    adapter = AnonymizingAdapter(cfg)
    with torch.no_grad():  # "trained-looking": random values in the zero-initialised layers and the fitted stages
        for name, p in adapter.named_parameters():
            if name.endswith("proj.weight") or name.startswith("out."):
                p.normal_(0, 0.05)
        if adapter.projection is not None:
            adapter.projection.read.normal_(0, 0.05), adapter.projection.write.normal_(0, 0.05)
        if adapter.keep is not None:  # a random orthonormal k-dim basis
            adapter.keep.proj.copy_(torch.linalg.qr(torch.randn(dim, cfg.keep))[0])
        if adapter.recentre is not None:  # random centroids, unit precision, a gate some videos pass
            adapter.recentre.centroids.normal_(0, 1)
            adapter.recentre.precision.copy_(torch.eye(cfg.keep))
            adapter.recentre.gate.fill_(float(cfg.keep))
    tmp = store.root / "aam" / "tmp-bench"
    version = save_adapter(adapter, cfg, tmp, fingerprint)
    final = store.root / "aam" / version
    tmp.rename(final)
    return final


def parquet_only(store: FeatureStore, out: Path, width: int) -> int:
    """The publish path minus the adapter and the guards: same read, same table (the published width: the first
    `width` raw columns stand in for a keep adapter's k), same write."""
    data = store.read_shard(SHARD, with_static=False)
    clips = np.ascontiguousarray(data.clips[:, :width], np.float32)
    table = pub._anonymized_table(data.index.select(list(pub.INDEX_COLUMNS)), clips, "parquet-only", FP)
    assert table.schema == pub.anonymized_schema(clips.shape[1])
    write_parquet_atomic(table, out)
    return table.num_rows


def anonymize_breakdown(store: FeatureStore, adapter_dir: Path, out: Path) -> dict:
    """The pieces of anonymize_shard, timed one by one (one pass)."""
    t = {}
    t0 = time.perf_counter()
    data = store.read_shard(SHARD, with_static=False)
    clips = np.ascontiguousarray(data.clips, np.float32)
    index = data.index.select(list(pub.INDEX_COLUMNS))
    t["read_s"] = time.perf_counter() - t0
    adapter, cfg, meta = load_adapter(adapter_dir)
    t0 = time.perf_counter()
    feats = pub.run_adapter(adapter, cfg, clips, index["video_id"].to_numpy(zero_copy_only=False),
                             index["clip_index"].to_numpy())
    t["adapter_s"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    table = pub._anonymized_table(index, feats, meta["version"], FP)
    t["build_table_s"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    pub.assert_not_identity(clips, feats)
    pub.assert_no_raw_latents(table, clips)
    t["guards_s"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    write_parquet_atomic(table, out)
    t["write_s"] = time.perf_counter() - t0
    return {k: round(v, 3) for k, v in t.items()}


def add_index_rows(store: FeatureStore, n: int, first_video: int, per_file: int, seed: int) -> int:
    """Extra clip-index rows for the `clips` view: latents/meta-<k>/clips.parquet (index only, no latents)."""
    rng = np.random.default_rng(seed)
    written, k = 0, 0
    while written < n:
        m = min(per_file, n - written)
        t = clip_index_table(m, first_video + written // CLIPS_PER_VIDEO, rng)
        d = store.root / "latents" / f"meta-{k:03d}"
        d.mkdir(parents=True, exist_ok=True)
        pq.write_table(t, d / "clips.parquet", compression="zstd")
        written, k = written + m, k + 1
    return k


def time_query(fn, runs: int) -> dict:
    t0 = time.perf_counter()
    fn()  # warm-up (OS page cache, DuckDB's first parse)
    first = (time.perf_counter() - t0) * 1e3
    ms = []
    for _ in range(runs):
        t0 = time.perf_counter()
        fn()
        ms.append((time.perf_counter() - t0) * 1e3)
    return {"median_ms": round(statistics.median(ms), 1), "min_ms": round(min(ms), 1), "max_ms": round(max(ms), 1),
            "warmup_ms": round(first, 1), "runs": runs}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--clips", type=int, default=100_000, help="clips in the shard to anonymize (and to search)")
    ap.add_argument("--dim", type=int, default=192, help="feature width D (must be a multiple of 8)")
    ap.add_argument("--rows-meta", type=int, default=1_000_000, help="clip-index rows for the metadata aggregate")
    ap.add_argument("--repeats", type=int, default=3, help="timed runs of anonymize and parquet_only (median)")
    ap.add_argument("--query-runs", type=int, default=5)
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--adapter", default="default", choices=["default", "previous", "attention"],
                    help="default: the adapter aam_model trains by default (keep k); previous: the appearance projection + 2 MLP "
                         "blocks default before it; attention: the sub-token attention adapter")
    ap.add_argument("--work", help="folder for the synthetic store (default: a new temp folder, removed at the end)")
    ap.add_argument("--keep", action="store_true", help="keep the synthetic store")
    args = ap.parse_args(argv)
    assert args.clips >= CLIPS_PER_VIDEO and args.repeats >= 1 and args.query_runs >= 1
    if args.threads:
        torch.set_num_threads(args.threads)
    work = Path(args.work) if args.work else Path(tempfile.mkdtemp(prefix="splavu-bench-publish-"))
    root = work / "store"
    if root.exists():
        shutil.rmtree(root)
    try:
        result = run(args, root)
    finally:
        if not args.keep:
            shutil.rmtree(work if not args.work else root, ignore_errors=True)
    print(json.dumps(result, indent=1))


def run(args, root: Path) -> dict:
    t0 = time.perf_counter()
    store = build_store(root, args.clips, args.dim, args.seed)
    adapter_dir = make_adapter(store, args.dim, args.seed, kind=args.adapter)
    version = json.loads((adapter_dir / "adapter.json").read_text())["version"]
    width = adapter_config(args.dim, args.adapter).out_dim  # what both paths write per row
    setup_s = time.perf_counter() - t0

    # (a) anonymize vs. parquet only; alternating, so both see the same cache / machine state.
    # Untimed warm-up first: torch's first forward pass allocates and picks kernels.
    warm, _, _ = load_adapter(adapter_dir)
    with torch.no_grad():
        warm(torch.zeros(16, args.dim))
    out = pub.anonymized_path(store, version, SHARD)
    baseline_out = root / "bench-parquet-only" / f"{SHARD}.parquet"
    anon_s, plain_s = [], []
    for _ in range(args.repeats):
        out.unlink(missing_ok=True)  # anonymize_shard skips a shard that is already published
        t = time.perf_counter()
        info = pub.anonymize_shard(store, SHARD, adapter_dir)
        anon_s.append(time.perf_counter() - t)
        assert not info["skipped"] and info["rows"] == args.clips
        baseline_out.unlink(missing_ok=True)
        t = time.perf_counter()
        assert parquet_only(store, baseline_out, width) == args.clips
        plain_s.append(time.perf_counter() - t)
    anon_cps = args.clips / statistics.median(anon_s)
    plain_cps = args.clips / statistics.median(plain_s)
    breakdown = anonymize_breakdown(store, adapter_dir, root / "bench-breakdown" / f"{SHARD}.parquet")
    sizes = {"anonymized_parquet_mb": round(out.stat().st_size / 2 ** 20, 1),
             "parquet_only_mb": round(baseline_out.stat().st_size / 2 ** 20, 1)}
    shutil.rmtree(root / "bench-parquet-only"), shutil.rmtree(root / "bench-breakdown")

    # (b) DuckDB through the catalog
    ledger.record_version(store, version, json.loads((adapter_dir / "adapter.json").read_text()))
    extra = max(0, args.rows_meta - args.clips)
    n_files = add_index_rows(store, extra, args.clips // CLIPS_PER_VIDEO + 1, 200_000, args.seed + 1)
    built = cat.build_catalog(store)
    assert built["rows"]["anonymized_features"] == args.clips, built["rows"]
    n_meta = built["rows"]["clips"]

    agg_sql = ("SELECT split, count(*) AS clips, avg(end_s - start_s) AS avg_clip_s FROM clips "
               "GROUP BY split ORDER BY split")
    agg = analyst.query(store, agg_sql)
    assert sum(agg["clips"].to_pylist()) == n_meta
    rng = np.random.default_rng(args.seed + 2)
    qvec = rng.standard_normal(width).astype(np.float32).tolist()  # the published width (k for a keep adapter)
    cos_sql = (f"SELECT video_id, clip_index, array_cosine_similarity(feature, ?::FLOAT[{width}]) AS similarity "
               f"FROM anonymized_features ORDER BY similarity DESC LIMIT 10")
    assert analyst.query(store, cos_sql, params=[qvec]).num_rows == 10
    probe_video = "v0"
    queries = {
        "metadata_aggregate": time_query(lambda: analyst.query(store, agg_sql), args.query_runs),
        "cosine_top10": time_query(lambda: analyst.query(store, cos_sql, params=[qvec]), args.query_runs),
        "neighbors": time_query(lambda: analyst.neighbors(store, probe_video, k=10), args.query_runs),
    }
    con = analyst._connect(store)  # the analysts' read-only connection, kept open: the warm figure
    try:
        queries["metadata_aggregate"]["warm_connection_ms"] = time_query(
            lambda: con.sql(agg_sql).fetchall(), args.query_runs)["median_ms"]
        queries["cosine_top10"]["warm_connection_ms"] = time_query(
            lambda: con.sql(cos_sql, params=[qvec]).fetchall(), args.query_runs)["median_ms"]
    finally:
        con.close()
    queries["metadata_aggregate"].update(rows=n_meta, sql=agg_sql, files=built["files"]["clips"],
                                         result=[{k: (round(v, 4) if isinstance(v, float) else v) for k, v in r.items()}
                                                 for r in agg.to_pylist()])
    queries["cosine_top10"].update(rows=args.clips, sql=cos_sql.replace("?", "<query vector>"))
    queries["neighbors"].update(rows=args.clips, video_id=probe_video, clips_of_video=CLIPS_PER_VIDEO)

    import duckdb

    return {
        "benchmark": "publish", "clips": args.clips, "dim": args.dim,
        "adapter": {"kind": args.adapter, **adapter_config(args.dim, args.adapter).to_dict(), "version": version,
                    "published_width": width,
                    "parameters": sum(p.numel() for p in AnonymizingAdapter(adapter_config(args.dim, args.adapter)).parameters()),
                    "chunk_rows": pub.CHUNK_ROWS},
        "torch_threads": torch.get_num_threads(), "cpu_count": os.cpu_count(), "machine": platform.machine(),
        "duckdb": duckdb.__version__, "pyarrow": pa.__version__, "setup_s": round(setup_s, 2),
        "clips_per_s": {"anonymize": round(anon_cps, 1), "parquet_only": round(plain_cps, 1)},
        "seconds": {"anonymize": [round(s, 3) for s in anon_s], "parquet_only": [round(s, 3) for s in plain_s]},
        "ratio_anonymize_vs_parquet_only": round(anon_cps / plain_cps, 3),
        "anonymize_breakdown_s": breakdown, **sizes,
        "duckdb_ms": queries, "index_only_shards": n_files,
        "targets": {"anonymize_vs_parquet_only": 0.5},
    }


if __name__ == "__main__":
    main()
