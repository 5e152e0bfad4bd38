"""How much the privacy gate's verdict depends on recentring's k-means draw, or on erasing one training subject
(prints JSON lines).

    python benchmarks/cluster_seeds.py --store store [--seeds 8] [--probe-seeds 5] [--config JSON]
    python benchmarks/cluster_seeds.py --store store --forget 10 [--config JSON]

The default recentres each video on k-means clusters of the training clips; TrainConfig.seed draws them. Per seed:
the configuration refitted from the store's cached latents (seconds), its anonymized videos made in memory (what a
publish would write), and the gate's parts scored on the validation split (close-ups, action clips, AR) by the
gate's own scoring (score_features: attacker and reader suites, probe seeds, bootstrap over people). Nothing is
published. A last line summarises the close-up part: mean, spread, and how many seeds clear the budget at the
lower end. Measured 2026-12-05 on the demo store: seeds 0-7 gave close-ups 0.517-0.605, only seed 0 passing.

--forget N: instead, N training subjects drawn at random (seeded) are erased one at a time, as `splavu forget
--subject` would: their videos leave the AAM's training data and the AR videos scored, and the configuration is
refitted with its own k-means seed. The re-identification part is scored too (the gate's third privacy part).

Each line says whether the privacy gate would pass (every privacy part's lower end >= the budget), whether the
utility gate would refuse AR (ledger.retention_kept: a loss below the threshold beyond the noise; an undecidable
interval refuses nothing) and whether the fit would publish (privacy passes, AR not refused; AR is the seen task the
utility gate refuses first on these stores, TAD and AD are not scored here); the summary counts each.
"""
from __future__ import annotations

import argparse
import json
import time

import numpy as np

from splavu_core.aam.config import TrainConfig
from splavu_core.aam.train import train_aam
from splavu_core.aam.training_data import load_training_data, without_subjects
from splavu_core.evaluation.scoring import score_features
from splavu_core.evaluation.suite import anonymize_videos, load_feature_sets
from splavu_core.ingest.datasets import task_datasets
from splavu_core.settings import settings
from splavu_core.store.feature_store import FeatureStore
from splavu_core.store.ledger import retention_kept

PARTS = {"closeups": ("privacy", "leakage_removed"), "clips": ("clip_privacy", "leakage_removed"),
         "linking": ("reid", "linkage_removed"), "ar": ("ar", "retention_top1")}
PRIVACY_PARTS = ("closeups", "clips", "linking")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--store", required=True)
    ap.add_argument("--seeds", type=int, default=8, help="k-means seeds 0..N-1")
    ap.add_argument("--probe-seeds", type=int, default=5)
    ap.add_argument("--config", default="{}", help="TrainConfig fields as JSON (default: the default)")
    ap.add_argument("--forget", type=int, default=0, help="erase N training subjects one at a time instead")
    args = ap.parse_args(argv)
    store = FeatureStore(args.store)
    data = load_training_data(store)
    datasets = task_datasets(store, {})
    which = [t for t, _ in PARTS.values() if t in datasets]
    raw = load_feature_sets(store, which, "raw", datasets=datasets)
    budget, utility = settings().privacy_budget, settings().utility_gate
    found = []
    cfg = TrainConfig.from_flat(json.loads(args.config))
    if args.forget:
        subjects = sorted({str(v.meta["subject_id"]) for v in data.ar_train + data.tad_train + data.ad_train
                           if v.meta.get("subject_id") is not None})
        runs = [("subject", s) for s in np.random.default_rng(0).choice(subjects, args.forget, replace=False)]
    else:
        runs = [("seed", seed) for seed in range(args.seeds)]
    for kind, what in runs:
        t = time.perf_counter()
        fit_data, scored = without_subjects(data, raw, {what}) if kind == "subject" else (data, raw)
        adapter, _, _ = train_aam(fit_data, cfg if kind == "subject" else cfg.replace(seed=what), log=None)
        rows = score_features(store, split="val", seeds=range(args.probe_seeds), which=which,
                              features={d: anonymize_videos(adapter, v) for d, v in scored.items()},
                              raw=scored if kind == "subject" else None)
        line = {kind: str(what) if kind == "subject" else what, "seconds": round(time.perf_counter() - t, 1)}
        for part, (task, metric) in PARTS.items():
            hit = [r for r in rows if r["feature_set"] == "candidate" and r["task"] == task and r["metric"] == metric]
            line[part] = [round(hit[0][k], 4) for k in ("value", "ci_low", "ci_high")] if hit else None
        line["privacy_passes"] = all(line[p] is None or line[p][1] >= budget for p in PRIVACY_PARTS)
        # refused only for a loss beyond the noise: an interval that holds 1 is undecidable and refuses nothing
        line["ar_refused"] = line["ar"] is not None and not retention_kept(line["ar"][0], line["ar"][2], utility)
        line["publishes"] = line["privacy_passes"] and not line["ar_refused"]
        found.append(line)
        print(json.dumps(line), flush=True)
    close = np.array([f["closeups"] for f in found if f["closeups"]])
    print(json.dumps({"summary": "closeups", ("subjects" if args.forget else "seeds"): len(found), "budget": budget,
                      "privacy_passing": sum(f["privacy_passes"] for f in found),
                      "publishing": sum(f["publishes"] for f in found),
                      "mean": round(float(close[:, 0].mean()), 4) if len(close) else None,
                      "sd": round(float(close[:, 0].std(ddof=1)), 4) if len(close) > 1 else None,
                      "passing_at_lower_end": int((close[:, 1] >= budget).sum()) if len(close) else 0}))


if __name__ == "__main__":
    main()
