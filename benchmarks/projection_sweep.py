"""How much leakage the label-free appearance projection alone removes, per rank (prints JSON).

    python benchmarks/projection_sweep.py --store store --ranks 48 96 [--w-temporal 0 1] [--tasks privacy clip_privacy ar]

No adapter training: the projection is fitted on the training videos' static clips (and the AR classes'
spread, which it keeps), exactly as `aam_model` fits its first stage, then the store's evaluation sets are
projected in memory and scored like the report (scoring.score_sets: the attacker suite's strongest member, 5 probe
seeds + a bootstrap, every change paired with raw). Fresh-critic pair matching on held-out training videos is
reported beside it.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time

from splavu_core.aam.appearance_projection import apply_projection
from splavu_core.aam.diagnostics import heldout_split, pair_matching_report
from splavu_core.aam.closed_form import fit_appearance_projection
from splavu_core.aam.training_data import load_training_data
from splavu_core.evaluation.scoring import score_sets
from splavu_core.evaluation.suite import RAW, load_feature_sets, metric_value
from splavu_core.ingest.datasets import task_datasets
from splavu_core.store.feature_store import FeatureStore

KEYS = {"privacy": "cmap", "clip_privacy": "cmap", "ar": "top1", "tad": "mAP", "ad": "auc"}


def scores(rows) -> dict:
    out = {t: metric_value(rows, t, m) for t, m in KEYS.items()}
    for t in ("privacy", "clip_privacy"):
        out[f"{t}_leakage_removed"] = metric_value(rows, t, "leakage_removed")
    return {k: (None if v is None else round(v, 4)) for k, v in out.items()}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--store", default="store")
    ap.add_argument("--ranks", type=int, nargs="+", default=[48, 96])
    ap.add_argument("--w-temporal", type=float, nargs="+", default=[0.0])
    ap.add_argument("--tasks", nargs="+", default=list(KEYS))
    ap.add_argument("--seed", type=int, default=0, help="the held-out split of the pair matching")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4], help="probe seeds")
    args = ap.parse_args()
    store = FeatureStore(args.store)
    data = load_training_data(store)
    fit_idx, held_idx = heldout_split(len(data.static), 0.2, args.seed)
    ds = task_datasets(store)
    sets = load_feature_sets(store, args.tasks, "raw", datasets=ds)
    ref: dict = {}  # raw is scored once, reused for every rank
    raw_rows = [r for r in score_sets({RAW: sets}, args.tasks, ds, seeds=args.seeds, reference_cache=ref)]
    result = {"store": str(store.root), "raw": scores(raw_rows),
              "raw_pair_matching": pair_matching_report(data.static, data.static_actions, fit_idx, held_idx),
              "projected": []}
    for rank in args.ranks:
        for wt in args.w_temporal:
            t0 = time.perf_counter()
            fit = fit_appearance_projection(data, fit_idx, rank, w_temporal=wt)
            projected = {d: [dataclasses.replace(v, feats=apply_projection(fit, v.feats)) for v in vs]
                         for d, vs in sets.items()}
            name = f"projection_{rank}"
            rows = [r for r in score_sets({RAW: sets, name: projected}, args.tasks, ds, seeds=args.seeds,
                                          reference_cache=ref) if r["feature_set"] == name]
            pm = pair_matching_report(data.static, data.static_actions, fit_idx, held_idx,
                                      transform=lambda x: apply_projection(fit, x))
            result["projected"].append({"rank": rank, "w_temporal": wt, **scores(rows), "pair_matching": pm,
                                     "ratio_at_rank": round(float(fit.eigenvalues[rank - 1]), 4),
                                     "seconds": round(time.perf_counter() - t0, 1)})
            print(json.dumps(result["projected"][-1]), file=sys.stderr, flush=True)
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
