"""Extraction throughput on a dask.distributed cluster: 1 worker vs 2 workers, in one run (prints JSON).

    python benchmarks/dask_workers.py [--scale tiny] [--datasets ar tad] [--shard-size 20] [--checkpoint DIR]

The real path: Dagster runs of extract_latents (one per shard, all submitted at once as the daemon
would) through the dask engine of pipeline/executors.py, each against a fresh store. Per config:

    1_worker_2_threads   one worker process, torch and decode with 2 threads: all of a 2-core machine
    1_worker_1_thread    one worker process, 1 torch thread, 1 decode thread
    2_workers_1_thread   two worker processes, 1 torch thread and 1 decode thread each

ratio = 2_workers_1_thread / 1_worker_2_threads (same cores, split into processes instead of threads).
Cluster start-up and the workers' first import of the code location happen before the clock starts
and are reported on their own (`startup_s`).
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import tempfile
import threading
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")  # the benchmark process only orchestrates

import dagster as dg  # noqa: E402

from assets.resources import EncoderResource, StoreResource  # noqa: E402
from pipeline.executors import code_location_job, run_config_for  # noqa: E402
from pipeline.runner import ingest  # noqa: E402
from splavu_core.extract.encoders.vfm import DEMO_CHECKPOINT  # noqa: E402

CONFIGS = {"1_worker_2_threads": (1, 2), "1_worker_1_thread": (1, 1), "2_workers_1_thread": (2, 1)}


def extract_all(instance, address: str, root: Path, shards: list[str], encoder: dict) -> float:
    """Seconds for one extract_latents run per shard, all in flight at once, on the cluster at `address`."""
    engine = {"dask": {"cluster": {"existing": {"address": address}}}}
    errors = []

    def one(shard):
        with dg.execute_job(code_location_job("extract_latents"), instance, tags={"dagster/partition": shard},
                            run_config=run_config_for(engine, str(root), encoder=encoder)) as res:
            if not res.success:
                errors.append(shard)

    threads = [threading.Thread(target=one, args=(s,)) for s in shards]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    secs = time.perf_counter() - t0
    if errors:
        raise SystemExit(f"extract_latents failed for shards {errors} (store {root})")
    return secs


def measure(name: str, workers: int, threads: int, data: Path, datasets: list[str], shard_size: int,
            checkpoint: str, work: Path) -> dict:
    from distributed import Client, LocalCluster

    t0 = time.perf_counter()
    cluster = LocalCluster(n_workers=workers, threads_per_worker=1, processes=True, host="127.0.0.1",
                           dashboard_address=None)
    try:
        with Client(cluster) as client:  # what a long-lived cluster has done before any run: import the code
            client.run(__import__, "pipeline.definitions")
        startup = time.perf_counter() - t0
        home = work / name / "dagster_home"
        home.mkdir(parents=True)
        instance = dg.DagsterInstance.local_temp(str(home))
        try:
            root = work / name / "store"
            shards = [k for d in datasets for k in ingest(instance, StoreResource(root=str(root)), d,
                                                          str(data / d / "manifest.csv"), shard_size)]
            encoder = {"checkpoint": checkpoint, "threads": threads, "decode_threads": threads}
            secs = extract_all(instance, cluster.scheduler_address, root, shards, encoder)
        finally:
            instance.dispose()
    finally:
        cluster.close()
    from splavu_core.store.feature_store import FeatureStore

    store = FeatureStore(root)
    k = EncoderResource().static_k  # static clips per training video
    clips = sum(store.committed(s)["clips"] + store.committed(s)["static_videos"] * k for s in shards)
    return {"workers": workers, "torch_threads_per_worker": threads, "decode_threads_per_worker": threads,
            "shards": len(shards), "clips_encoded": clips, "seconds": round(secs, 2),
            "clips_per_s": round(clips / secs, 2), "startup_s": round(startup, 2)}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", help="a folder from `splavu synth` (default: generate one)")
    ap.add_argument("--scale", default="tiny")
    ap.add_argument("--datasets", nargs="+", default=["ar", "tad"])
    ap.add_argument("--shard-size", type=int, default=20)
    ap.add_argument("--checkpoint", default=str(DEMO_CHECKPOINT))
    ap.add_argument("--configs", nargs="+", default=list(CONFIGS), choices=list(CONFIGS))
    args = ap.parse_args(argv)

    with tempfile.TemporaryDirectory(prefix="splavu_dask_bench_") as tmp:
        work = Path(tmp)
        data = Path(args.data) if args.data else work / "data"
        if not args.data:
            from splavu_core.ingest.synth.datasets import generate

            generate(data, args.scale, seed=0, workers=2)
        results = {n: measure(n, *CONFIGS[n], data, args.datasets, args.shard_size, args.checkpoint, work)
                   for n in args.configs}
    out = {"benchmark": "extract_latents on a dask.distributed LocalCluster (dagster-dask executor)",
           "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
           "data": {"scale": args.scale if not args.data else args.data, "datasets": args.datasets,
                    "shard_size": args.shard_size, "checkpoint": Path(args.checkpoint).name},
           "configs": results}
    if {"1_worker_2_threads", "2_workers_1_thread"} <= set(results):
        out["ratio_2_workers_vs_1_worker"] = round(results["2_workers_1_thread"]["clips_per_s"]
                                                  / results["1_worker_2_threads"]["clips_per_s"], 3)
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
