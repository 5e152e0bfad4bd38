"""Why splavu computes some metrics by hand: each hand-written metric beside the scikit-learn call it equals
(tests/test_metric_references.py checks that they agree), timed at the demo's sizes.

    python benchmarks/metric_speed.py [--videos 450] [--attributes 7] [--boot 200] [--frames 300] [--repeats 3]

- cmap_resamples (tasks/metrics.py): the cMAP of every bootstrap resample at once (rows ranked once, resamples as
  weights) vs average_precision_score per resample and attribute;
- auc_resamples (evaluation/protocols.py): the frame AUC of every resample at once vs roc_auc_score per resample
  (on `videos // 4` AD test videos of `frames` frames each); _auc vs roc_auc_score on one set;
- _macro_f1_resamples: macro-F1 of every resample from counts vs f1_score(average="macro") per resample;
- fit_logistic (evaluation/protocols.py, torch L-BFGS) vs sklearn's LogisticRegression (lbfgs) on the same objective,
  at the convex probes' sizes (AR: 1,500 clips x 192 x 15 classes; TAD: 1,000 x 576 x 16; AD: 1,600 x 192, binary).

Prints one JSON object: seconds per call (best of --repeats) and the ratio sklearn / splavu for each.
"""
from __future__ import annotations

import argparse
import json
import time

import numpy as np
import torch
from sklearn.linear_model import LogisticRegression
from sklearn.metrics import average_precision_score, f1_score, roc_auc_score

from splavu_core.evaluation import protocols as P
from splavu_core.evaluation import stats
from splavu_core.tasks.metrics import cmap_resamples


def best_of(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def pair(hand, ref, repeats: int) -> dict:
    a, b = best_of(hand, repeats), best_of(ref, repeats)
    return {"splavu_s": round(a, 5), "sklearn_s": round(b, 5), "sklearn_over_splavu": round(b / a, 1)}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--videos", type=int, default=450)
    ap.add_argument("--attributes", type=int, default=7)
    ap.add_argument("--boot", type=int, default=stats.N_BOOT)
    ap.add_argument("--frames", type=int, default=300)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--fit-scale", type=float, default=1.0, help="multiplies the probes' clip counts")
    a = ap.parse_args()
    torch.set_num_threads(1)
    rng = np.random.default_rng(0)
    n, A, B = a.videos, a.attributes, a.boot
    idx = stats.bootstrap_indices(n, B, seed=0)
    out = {"benchmark": "metric_speed", "videos": n, "attributes": A, "resamples": B, "torch_threads": 1}

    y = (rng.random((n, A)) < 0.45).astype(int)
    s = np.round(rng.random((n, A)) + 0.4 * y, 3)

    def ap_loop():
        for row in idx:
            yy, ss = y[row], s[row]
            np.mean([average_precision_score(yy[:, j], ss[:, j]) for j in range(A)])
    out["cmap_resamples"] = pair(lambda: cmap_resamples(y, s, idx), ap_loop, a.repeats)

    probs = rng.random((n, A))
    out["macro_f1_resamples"] = pair(lambda: P._macro_f1_resamples(y, probs, idx),
                                     lambda: [f1_score(y[row], probs[row] >= 0.5, average="macro", zero_division=0)
                                              for row in idx], a.repeats)

    nv = max(4, n // 4)
    fl = [(np.arange(a.frames) % 97 < rng.integers(0, 60)).astype(int) for _ in range(nv)]
    fs = [np.round(rng.normal(size=a.frames) + f, 2) for f in fl]
    yf, sf = np.concatenate(fl), np.concatenate(fs)
    video_of = np.repeat(np.arange(nv), a.frames)
    vidx = stats.bootstrap_indices(nv, B, seed=1)

    def auc_loop():
        for row in vidx:
            yy = np.concatenate([fl[j] for j in row])
            if 0 < yy.sum() < len(yy):
                roc_auc_score(yy, np.concatenate([fs[j] for j in row]))
    out["auc_resamples"] = {**pair(lambda: P.auc_resamples(yf, sf, video_of, vidx), auc_loop, a.repeats),
                            "frames": int(len(yf))}
    out["auc_one_set"] = pair(lambda: P._auc(yf, sf), lambda: roc_auc_score(yf, sf), a.repeats)

    fits = {}
    for name, (clips, dim, classes, binary, l2) in {"ar": (1500, 192, 15, False, 0.1), "tad": (1000, 576, 16, False, 0.1),
                                                   "ad": (1600, 192, 1, True, 1.0)}.items():
        m = max(20, int(clips * a.fit_scale))
        x = rng.normal(size=(m, dim))
        if binary:
            lab = (x[:, 0] + rng.normal(size=m) > 0).astype(np.int64)
        else:
            lab = (x[:, :classes] * 0.5 + rng.gumbel(size=(m, classes))).argmax(1)
            lab[:classes] = np.arange(classes)  # every class present, as in the probes
        w = rng.uniform(0.3, 1.0, m)
        xt, yt, wt = torch.from_numpy(x), torch.from_numpy(lab), torch.from_numpy(w)
        res = {}

        def mine():
            res["mine"] = P.fit_logistic(xt, yt, wt, classes, l2, seed=0, binary=binary)

        def ref():
            res["ref"] = LogisticRegression(C=1 / l2, max_iter=300, tol=1e-5).fit(x, lab, sample_weight=w / w.sum())
        timing = pair(mine, ref, a.repeats)
        W, b = res["mine"]
        logits = xt @ W + b
        p_mine = (torch.sigmoid(logits)[:, 0] if binary else torch.softmax(logits, -1)).numpy()
        p_ref = res["ref"].predict_proba(x)[:, 1] if binary else res["ref"].predict_proba(x)
        fits[name] = {**timing, "clips": m, "dim": dim, "classes": classes,
                      "max_abs_prob_diff": float(np.abs(p_mine - p_ref).max())}
    out["fit_logistic"] = fits
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
