"""`splavu neighbors` latency: exact and approximate search side by side, and DuckDB's scan (prints JSON).

    python benchmarks/neighbors.py [--clips 1000000] [--dim 192] [--runs 20] [--duckdb-runs 1] [--data clustered]
                                   [--nprobe 8 32 128]

A synthetic store holds one AAM version's published tables (anonymized_schema Parquet, --shards files,
8 clips per video), with no video, encoder or adapter. Features (--data):
  clustered  videos drawn around 2,000 "scene/action" centres in a 24-dim subspace, plus per-clip noise
             in all D dims and a shared offset (published features have a large common direction:
             cosines of 0.9+ between unrelated clips, as in the demo's table);
  random     isotropic Gaussian rows: no structure (the approximate index's worst case).

The index is written with its faiss IVF part whatever the table's size (write_index(approximate=True)).
Timed, each the median over --queries videos x --runs runs after one warm-up per video:
  exact_warm_ms        neighbors.neighbors(mode="exact"): every row scored, memory-mapped rows, page cache warm
  exact_warm_cpu_ms    the same queries' CPU time (on shared cores wall time includes waiting for a core)
  numpy_floor_ms       plain `rows @ q` + argpartition over the same memory-mapped rows, no ids, no exclusion: the
                       brute-force floor under the same load (the exact search's overhead is the difference)
  approximate[]        per --nprobe: warm ms and recall@10 against the exact answer of the same query
  duckdb_ms            catalog.neighbors (array_cosine_similarity over the catalog view), --duckdb-runs runs
  open_ms              Index.open (what each `splavu neighbors` process adds once)
`same_answer`: the exact search's top-10 ids equal DuckDB's.
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
from datetime import datetime, timezone
from pathlib import Path

import numpy as np
import pyarrow as pa

from splavu_core.publish.anonymized_tables import anonymized_schema
from splavu_core.serve import analyst
from splavu_core.serve import catalog as cat
from splavu_core.serve import neighbors as nn
from splavu_core.store.feature_store import FeatureStore
from splavu_core.store.ledger import record_version

VERSION = "benchneighbors01"
CLIPS_PER_VIDEO = 8


def features(n: int, d: int, kind: str, rng) -> np.ndarray:
    if kind == "random":
        return rng.standard_normal((n, d), dtype=np.float32)
    videos = n // CLIPS_PER_VIDEO + 1
    centres = rng.standard_normal((2000, 24), dtype=np.float32)
    mix = rng.standard_normal((24, d), dtype=np.float32) / np.sqrt(24)
    video = centres[rng.integers(0, 2000, videos)] + 0.5 * rng.standard_normal((videos, 24), dtype=np.float32)
    out = np.empty((n, d), np.float32)
    offset = 2.5 * rng.standard_normal(d, dtype=np.float32)
    for s in range(0, n, 100_000):
        e = min(n, s + 100_000)
        v = np.arange(s, e) // CLIPS_PER_VIDEO
        out[s:e] = video[v] @ mix + 0.35 * rng.standard_normal((e - s, d), dtype=np.float32) + offset
    return out


def write_store(root: Path, n: int, d: int, shards: int, kind: str) -> FeatureStore:
    store = FeatureStore(root)
    rng = np.random.default_rng(0)
    feats = features(n, d, kind, rng)
    per = -(-n // shards)
    now = np.datetime64(datetime.now(timezone.utc).replace(tzinfo=None), "us")
    for i in range(shards):
        s, e = i * per, min(n, (i + 1) * per)
        rows = np.arange(s, e)
        start = (rows % CLIPS_PER_VIDEO) * 16
        table = pa.Table.from_arrays([
            pa.array([f"v{r // CLIPS_PER_VIDEO:07d}" for r in rows]), pa.array(rows % CLIPS_PER_VIDEO, pa.int32()),
            pa.array(start, pa.int32()), pa.array(start + 16, pa.int32()), pa.array(start / 25.0),
            pa.array((start + 16) / 25.0), pa.array(np.array(["train", "val", "test"])[rows // CLIPS_PER_VIDEO % 3]),
            pa.FixedSizeListArray.from_arrays(pa.array(feats[s:e].reshape(-1), pa.float32()), d),
            pa.array([VERSION] * (e - s)), pa.array(["bench-encoder"] * (e - s)),
            pa.array(np.full(e - s, now), pa.timestamp("us", tz="UTC"))], schema=anonymized_schema(d))
        store.files.write_parquet(f"anonymized/{VERSION}/bench-{i:03d}.parquet", table)
    record_version(store, VERSION, {"encoder_fingerprint": None, "config": {"dim": d}}, make_current=True)
    return store


def timed(fn, runs: int, cpu: list | None = None) -> tuple[float, list[float], object]:
    """Median wall ms over `runs` after a warm-up; CPU ms of each run appended to `cpu` (on shared cores the
    wall time also counts waiting for a core, the CPU time does not)."""
    out = fn()  # warm-up
    times = []
    for _ in range(runs):
        c0, t0 = time.process_time(), time.perf_counter()
        out = fn()
        times.append((time.perf_counter() - t0) * 1e3)
        if cpu is not None:
            cpu.append((time.process_time() - c0) * 1e3)
    return statistics.median(times), times, out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--clips", type=int, default=1_000_000)
    ap.add_argument("--dim", type=int, default=192)
    ap.add_argument("--shards", type=int, default=10)
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--duckdb-runs", type=int, default=1)
    ap.add_argument("--data", default="clustered", choices=["clustered", "random"])
    ap.add_argument("--queries", type=int, default=10, help="distinct query videos (warm latency: median over all)")
    ap.add_argument("--nprobe", type=int, nargs="*", default=[8, 32, 128])
    ap.add_argument("--nlist", type=int, help="IVF lists (default: neighbors.default_lists(N), 1,024 at 1M)")
    args = ap.parse_args()

    tmp = Path(tempfile.mkdtemp(prefix="splavu-neighbors-"))
    try:
        t0 = time.perf_counter()
        store = write_store(tmp / "store", args.clips, args.dim, args.shards, args.data)
        write_s = time.perf_counter() - t0
        built = nn.write_index(store, VERSION, approximate=True, nlist=args.nlist)
        cat.build_catalog(store)
        sizes = {p.name: p.stat().st_size for p in Path(built["path"]).iterdir()}

        t_open, _, index = timed(lambda: nn.Index.open(store, VERSION), 3)
        assert index.from_index and index.ivf is not None
        rng = np.random.default_rng(1)
        videos = [f"v{v:07d}" for v in rng.integers(0, args.clips // CLIPS_PER_VIDEO, args.queries)]
        exact, warm, cpu = {}, [], []
        for vid in videos:
            _, times, exact[vid] = timed(lambda: nn.neighbors(store, vid, k=10, index=index, mode="exact"), args.runs, cpu)
            warm += times
        q = np.asarray(index.features[0], np.float32)
        n = len(index.features)
        floor_cpu = []
        floor_ms, _, _ = timed(lambda: np.argpartition(index.features @ q, n - 10)[n - 10:], args.runs * 3, floor_cpu)
        approximate = []
        for nprobe in args.nprobe:
            a_warm, a_cpu, recall = [], [], []
            for vid in videos:
                _, times, got = timed(lambda: nn.neighbors(store, vid, k=10, index=index, mode="approximate",
                                                           nprobe=nprobe), args.runs, a_cpu)
                a_warm += times
                want = set(zip(exact[vid]["video_id"].to_pylist(), exact[vid]["clip_index"].to_pylist()))
                recall.append(len(want & set(zip(got["video_id"].to_pylist(), got["clip_index"].to_pylist()))) / 10)
            approximate.append({"nprobe": nprobe, "warm_ms": round(statistics.median(a_warm), 2),
                                "warm_cpu_ms": round(statistics.median(a_cpu), 2),
                                "recall_at_10": round(float(np.mean(recall)), 3), "recall_min": min(recall)})
        out = {"clips": args.clips, "dim": args.dim, "data": args.data, "shards": args.shards, "k": 10,
               "store_write_s": round(write_s, 1), "index_build_s": round(built["seconds"], 2),
               "ivf_lists": built["ivf_lists"],
               "features_mb": round(sizes["features.npy"] / 1e6, 1), "ivf_mb": round(sizes["ivf.faiss"] / 1e6, 1),
               "index_mb": round(sum(sizes.values()) / 1e6, 1),
               "exact_warm_ms": round(statistics.median(warm), 2),
               "exact_warm_p90_ms": round(float(np.percentile(warm, 90)), 2),
               "exact_warm_cpu_ms": round(statistics.median(cpu), 2),
               "numpy_floor_ms": round(floor_ms, 2), "numpy_floor_cpu_ms": round(statistics.median(floor_cpu), 2),
               "exact_target_ms": 50, "exact_target_met": statistics.median(warm) < 50,
               "approximate": approximate, "open_ms": round(t_open, 2)}
        if args.duckdb_runs:
            duck_ms, _, duck = timed(lambda: analyst.neighbors(store, videos[0], k=10), args.duckdb_runs)
            fast = exact[videos[0]]
            out.update(duckdb_ms=round(duck_ms, 1),
                       same_answer=duck["video_id"].to_pylist() == fast["video_id"].to_pylist()
                       and duck["clip_index"].to_pylist() == fast["clip_index"].to_pylist(),
                       max_similarity_diff=float(np.max(np.abs(duck["similarity"].to_numpy()
                                                               - fast["similarity"].to_numpy()))))
        out.update(queries=len(videos), runs_per_query=args.runs, cpus=os.cpu_count(), load_avg=os.getloadavg(),
                   omp_threads=os.environ.get("OMP_NUM_THREADS"), python=platform.python_version())
        print(json.dumps(out))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
