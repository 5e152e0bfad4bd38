"""Spread of each evaluation protocol across probe seeds on a store's RAW latents (issue 19).

    python benchmarks/probe_stability.py --store store [--tasks ar tad ad privacy] [--seeds 5]

Prints, per task, the per-seed values, their sd, the 95% interval (seeds + bootstrap over test videos), and the wall
time. (The single-seed probes it once compared against, evaluation/probes.py, are gone: one evaluation stack.)
"""
from __future__ import annotations

import argparse
import json
import time

import numpy as np

from splavu_core.evaluation import stats
from splavu_core.evaluation.scoring import run_task
from splavu_core.evaluation.suite import load_feature_sets
from splavu_core.ingest.datasets import task_datasets
from splavu_core.store.feature_store import FeatureStore

HEAD = {"ar": "top1", "tad": "mAP", "ad": "auc", "privacy": "cmap", "clip_privacy": "cmap"}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--store", default="store")
    ap.add_argument("--tasks", nargs="*", default=["ar", "tad", "ad", "privacy"])
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--split", default="test")
    a = ap.parse_args()
    store = FeatureStore(a.store)
    ds = task_datasets(store)
    feats = load_feature_sets(store, a.tasks, "raw", datasets=ds)
    result = {"benchmark": "probe_stability", "store": str(store.root), "split": a.split, "seeds": a.seeds, "tasks": {}}
    for task in a.tasks:
        videos = feats[ds[task]]
        t0 = time.perf_counter()
        sc, why = run_task(task, videos, a.split, list(range(a.seeds)))
        t1 = time.perf_counter()
        m = HEAD[task]
        vals = [sc.metrics[m](s, None) for s in range(sc.n_seeds)]
        st = stats.interval(sc.metrics[m], sc.n_seeds, sc.n_test, sc.n_boot, same=sc.same_outputs,
                            clusters=sc.clusters, bounded=True)  # as scoring.scored_rows: people resampled
        print(f"{task:8s} seeds {np.round(vals, 4).tolist()} mean {st['value']:.4f} sd {st['sd']:.4f} "
              f"95% CI [{st['ci_low']:.4f}, {st['ci_high']:.4f}] chance {sc.chance[m]} "
              f"[fit {t1 - t0:.1f} s, interval {time.perf_counter() - t1:.1f} s]", flush=True)
        result["tasks"][task] = {"metric": m, "per_seed": [float(v) for v in vals], "sd": st["sd"], "value": st["value"],
                                 "ci_low": st["ci_low"], "ci_high": st["ci_high"], "chance": sc.chance[m],
                                 "fit_s": round(t1 - t0, 2), "n_test": sc.n_test,
                                 "people": None if sc.clusters is None else len(set(sc.clusters.tolist()))}
    print(json.dumps(result))  # the lines above, as one JSON object


if __name__ == "__main__":
    main()
