"""How much the gradient-boosting attacker's score moves when the published rows move by float rounding (JSON lines).

    python benchmarks/gbdt_stability.py --store store_action [--draws 5] [--eps 1e-6]

The gate scores the default's published close-ups with the attacker suite; gbdt is deterministic, so it is fitted once
and its interval holds the test sampling only. Here the default is refitted from the store's cached latents, its
validation close-ups published in memory, and the rows multiplied by (1 + eps N(0, 1)) for each draw (draw -1: as
published). Per draw: the suite's gbdt as it is (one fit) and a seeded variant (one fit per probe seed, each on a
seeded bootstrap of the training people's videos, the scores averaged over seeds: the proposed fix), their cMAP on
the validation close-ups, and the MLP-free reference of the linear attacker. A stable attacker gives the same cMAP for
every draw. Measured 2026-12-05: docs/history.md, "The gradient-boosting attacker's figure".
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import time

import numpy as np

from splavu_core.aam.config import TrainConfig
from splavu_core.aam.train import train_aam
from splavu_core.aam.training_data import load_training_data
from splavu_core.evaluation import attackers as A
from splavu_core.evaluation.protocols import attack_data
from splavu_core.evaluation.scoring import privacy_attributes, task_split
from splavu_core.evaluation.suite import anonymize_videos, load_feature_sets
from splavu_core.ingest.datasets import task_datasets
from splavu_core.store.feature_store import FeatureStore
from splavu_core.tasks.metrics import cmap


def seeded_gbdt(d: A.AttackData, seeds) -> np.ndarray:
    """Mean over seeds of gbdt fitted on a seeded bootstrap of the training videos (the suite's capacity)."""
    from sklearn.ensemble import HistGradientBoostingClassifier

    ends = np.r_[d.train_starts[1:], len(d.x)]
    out = []
    for s in seeds:
        pick = np.random.default_rng(s).integers(len(d.train_starts), size=len(d.train_starts))
        rows = np.concatenate([np.arange(d.train_starts[i], ends[i]) for i in pick])
        cols = []
        for a in range(d.y.shape[1]):
            y = d.y[rows, a].astype(int)
            if len(set(y)) < 2:
                cols.append(np.full(len(d.xt), y[0], np.float64))
                continue
            m = HistGradientBoostingClassifier(max_iter=A.GBDT_ROUNDS, max_leaf_nodes=A.GBDT_LEAVES,
                                               learning_rate=0.1, early_stopping=False, random_state=0)
            cols.append(m.fit(d.x[rows], y).predict_proba(d.xt)[:, 1])
        out.append(d.video_mean(np.stack(cols, 1)))
    return np.mean(out, 0)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--store", required=True)
    ap.add_argument("--draws", type=int, default=5)
    ap.add_argument("--eps", type=float, default=1e-6)
    ap.add_argument("--seeds", type=int, default=5, help="fits of the seeded variant")
    args = ap.parse_args(argv)
    store = FeatureStore(args.store)
    ds = task_datasets(store, {})
    raw = load_feature_sets(store, ["privacy"], "raw", datasets=ds)[ds["privacy"]]
    adapter, _, _ = train_aam(load_training_data(store), TrainConfig(), log=None)
    published = anonymize_videos(adapter, raw)
    attrs = privacy_attributes(raw)
    found = {"gbdt": [], "gbdt_seeded": [], "linear": []}
    for draw in range(-1, args.draws):
        rng = np.random.default_rng(1000 + draw)
        videos = published if draw < 0 else [
            dataclasses.replace(v, feats=(v.feats * (1 + args.eps * rng.standard_normal(v.feats.shape)))
                                .astype(np.float32)) for v in published]
        train, test = task_split(videos, "val", "privacy")
        d = attack_data(train, test, attrs)
        t = time.perf_counter()
        line = {"draw": draw, "gbdt": cmap(d.y_test, A.run_attackers(d, [0], ["gbdt"])["gbdt"][0])}
        t1 = time.perf_counter()
        line["gbdt_seeded"] = cmap(d.y_test, seeded_gbdt(d, range(args.seeds)))
        t2 = time.perf_counter()
        line["linear"] = cmap(d.y_test, A.run_attackers(d, [0], ["linear"])["linear"][0])
        line |= {"seconds_gbdt": round(t1 - t, 2), "seconds_gbdt_seeded": round(t2 - t1, 2)}
        for k in found:
            found[k].append(line[k])
            line[k] = round(line[k], 4)
        print(json.dumps(line), flush=True)
    print(json.dumps({"summary": "cmap over draws", "eps": args.eps,
                      **{k: {"min": round(min(v), 4), "max": round(max(v), 4), "sd": round(float(np.std(v)), 4)}
                         for k, v in found.items()}}))


if __name__ == "__main__":
    main()
