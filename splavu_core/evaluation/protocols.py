"""Multi-seed evaluation protocols with per-video outputs, so every metric gets an interval (stats.py).

Each protocol trains S fresh probes (seeds base_seed .. base_seed+S-1) on `train` and returns a `Scored`:
per-seed outputs on the `test` videos plus metric functions metric(seed_index, video_indices | None) -> float,
so the same code gives the value on all test videos, on a bootstrap resample, and paired differences between
two feature sets scored on the same videos (raw vs anonymized, same seed, same resample).

Probes (fixed on raw features of the demo store before any anonymizer was scored; README "Evaluation"):
- AR / bias: multinomial logistic regression on standardised clips (each clip weighted 1/n_clips of its
  video, L2), full-batch L-BFGS from a seed-dependent random start; top-1 with softmax averaged over 5
  evenly spaced clips. Convex: seeds agree to optimiser tolerance, the bootstrap carries the sampling error.
- TAD: per-clip softmax over the classes + background on each standardised clip and its two neighbours (convex,
  L-BFGS); detections = runs of clips above each of 9 probability thresholds, scored by their mean probability,
  soft-NMS per class; mAP over tIoU 0.3:0.1:0.7. Chance: the same detections scored against the ground truth of
  other test videos. (The trained TADHead, `temporal_detection_head`, scored higher, 0.44, but its seed sd was
  0.014-0.026 mAP on the demo store: see README.)
- AD: per-clip logistic scorer trained on video labels only (every clip of an anomalous training video is
  a positive bag member; a linear model fitted to the bag labels ranks anomalous clips highest), standardised,
  L2, full-batch L-BFGS; frame-level ROC AUC. Chance 0.5.
- privacy: S fresh 2-layer MLP attackers trained together (one batched model, independent weights), on the
  features as given and standardised; per seed the best test cMAP over epochs (the attacker's best case), the
  stronger branch by mean. Chance: mean attribute prevalence.
- gait: nearest-neighbour retrieval, no training (one "seed"); bootstrap over query videos. Chance: expected
  hit rate of a random neighbour.
"""
from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np
import torch
import torch.nn.functional as F

from ..features import VideoFeatures
from .metrics import TIOUS, chance_cmap, cmap, frame_labels, frame_scores, macro_f1, tad_map
from .probes import Standardiser, _all_clips, eval_clip_indices

Videos = Sequence[VideoFeatures]
N_SEEDS = 5


@dataclass
class Scored:
    """Per-seed outputs of one protocol on one feature set's test videos."""

    task: str
    metrics: dict[str, Callable[[int, np.ndarray | None], float]]
    chance: dict[str, float | None]
    n_seeds: int
    n_test: int | None                    # bootstrap units (test videos); None: no bootstrap
    test_ids: list[str]
    higher_is_better: dict[str, bool] = field(default_factory=dict)
    details: dict = field(default_factory=dict)
    same_outputs: bool = False            # every seed gave the same test outputs (a convex probe): bootstrap once
    seed_only: tuple = ()                 # metrics whose interval is the seeds' alone (diagnostics: no bootstrap)
    n_boot: int = 200                     # bootstrap resamples of the test videos


def seeds_from(base_seed: int = 0, n_seeds: int = N_SEEDS) -> list[int]:
    return [base_seed + i for i in range(n_seeds)]


def _sel(n: int, idx):
    return np.arange(n) if idx is None else np.asarray(idx)


# ---------------------------------------------------------------- convex probes: L-BFGS

def fit_logistic(x: torch.Tensor, y: torch.Tensor, w: torch.Tensor, n_classes: int, l2: float, seed: int,
                 max_iter: int = 300, binary: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """Weighted (multinomial or binary) logistic regression with L2 on the weights, full-batch L-BFGS from a
    seed-dependent random start. Returns (W (D, C or 1), b)."""
    g = torch.Generator().manual_seed(seed)
    C = 1 if binary else n_classes
    W = (torch.randn(x.shape[1], C, generator=g, dtype=torch.float64) * 0.01).requires_grad_()
    b = torch.zeros(C, dtype=torch.float64, requires_grad=True)
    x64, w64 = x.to(torch.float64), w.to(torch.float64) / w.sum()
    opt = torch.optim.LBFGS([W, b], lr=1.0, max_iter=max_iter, tolerance_grad=1e-5, tolerance_change=1e-12,
                            history_size=20, line_search_fn="strong_wolfe")

    def closure():
        opt.zero_grad()
        logits = x64 @ W + b
        if binary:
            per = F.binary_cross_entropy_with_logits(logits[:, 0], y.to(torch.float64), reduction="none")
        else:
            per = F.cross_entropy(logits, y, reduction="none")
        loss = (per * w64).sum() + 0.5 * l2 * W.pow(2).sum()
        loss.backward()
        return loss

    opt.step(closure)
    return W.detach(), b.detach()


def _ar_probs(train: Videos, test: Videos, classes: list[str], seeds: list[int], l2: float,
              n_test_clips: int) -> np.ndarray:
    """(S, N_test, C) test-video probabilities of the AR probe for each seed."""
    index = {c: i for i, c in enumerate(classes)}
    std = Standardiser(_all_clips(train))
    x = torch.from_numpy(std(_all_clips(train)))
    y = torch.tensor([index[v.meta["action"]] for v in train for _ in range(len(v.feats))])
    w = torch.tensor([1.0 / len(v.feats) for v in train for _ in range(len(v.feats))], dtype=torch.float64)
    sel = [torch.from_numpy(std(v.feats[eval_clip_indices(len(v.feats), n_test_clips)])).to(torch.float64)
           for v in test]
    bounds = np.cumsum([0] + [len(s) for s in sel])
    xt = torch.cat(sel)
    out = []
    for s in seeds:
        W, b = fit_logistic(x, y, w, len(classes), l2, s)
        p = torch.softmax(xt @ W + b, -1).numpy()
        out.append(np.stack([p[a:e].mean(0) for a, e in zip(bounds[:-1], bounds[1:])]))
    return np.stack(out)


def action_recognition(train: Videos, test: Videos, seeds: Sequence[int] = seeds_from(), l2: float = 0.1,
                       n_test_clips: int = 5, classes: Sequence[str] | None = None, **_) -> Scored:
    classes = list(classes) if classes is not None else sorted({v.meta["action"] for v in train})
    index = {c: i for i, c in enumerate(classes)}
    unknown = {v.meta["action"] for v in test} - set(index)
    assert not unknown, f"test actions {sorted(unknown)} are not among the classes {classes}"
    probs = _ar_probs(train, test, classes, list(seeds), l2, n_test_clips)
    pred = probs.argmax(-1)                                                   # (S, N)
    true = np.array([index[v.meta["action"]] for v in test])
    n = len(test)

    def top1(s, idx):
        i = _sel(n, idx)
        return float((pred[s, i] == true[i]).mean())

    def per_class(c):
        def f(s, idx):
            i = _sel(n, idx)
            i = i[true[i] == c]
            return float((pred[s, i] == c).mean()) if len(i) else np.nan
        return f

    metrics = {"top1": top1, **{f"top1[{classes[c]}]": per_class(c) for c in sorted(set(true))}}
    chance = {k: 1.0 / len(classes) for k in metrics}
    return Scored("ar", metrics, chance, len(seeds), n, [v.video_id for v in test],
                  details={"classes": classes, "pred": pred, "true": true}, same_outputs=bool((pred == pred[0]).all()))


def bias(train: Videos, test: Videos, seeds: Sequence[int] = seeds_from(), **kw) -> Scored:
    ar = action_recognition(train, test, seeds, **kw)
    pred, true = ar.details["pred"], ar.details["true"]
    groups = np.array([v.meta.get("group") for v in test], dtype=object)
    assert not any(g is None for g in groups), "bias: every test video needs meta['group']"
    names = sorted(set(groups))
    n = len(test)

    def acc(g):
        def f(s, idx):
            i = _sel(n, idx)
            i = i[groups[i] == g]
            return float((pred[s, i] == true[i]).mean()) if len(i) else np.nan
        return f

    def gap(s, idx):
        a = [acc(g)(s, idx) for g in names]
        return float(np.nanmax(a) - np.nanmin(a))

    metrics = {"top1": ar.metrics["top1"], **{f"acc_{g}": acc(g) for g in names}, "gap": gap}
    c = 1.0 / len(ar.details["classes"])
    chance = {"top1": c, **{f"acc_{g}": c for g in names}, "gap": None}
    return Scored("bias", metrics, chance, len(seeds), n, ar.test_ids, higher_is_better={"gap": False},
                  same_outputs=ar.same_outputs)


# ---------------------------------------------------------------- AD

def anomaly_detection(train: Videos, test: Videos, seeds: Sequence[int] = seeds_from(), l2: float = 1.0, **_) -> Scored:
    """Clip-level logistic scorer on video labels (weak supervision), frame-level ROC AUC."""
    labels = [v.meta.get("anomaly") for v in train]
    assert set(labels) == {0, 1}, f"anomaly_detection: train needs normal and anomalous videos, got {set(labels)}"
    std = Standardiser(_all_clips(train))
    x = torch.from_numpy(std(_all_clips(train)))
    y = torch.tensor([lab for v, lab in zip(train, labels) for _ in range(len(v.feats))])
    # every video weighs the same, and both classes weigh the same in total
    n_pos = sum(labels)
    cw = {1: 0.5 / n_pos, 0: 0.5 / (len(labels) - n_pos)}
    w = torch.tensor([cw[lab] / len(v.feats) for v, lab in zip(train, labels) for _ in range(len(v.feats))],
                     dtype=torch.float64)
    fl = [frame_labels(v) for v in test]
    n = len(test)
    scores = []
    for s in seeds:
        W, b = fit_logistic(x, y, w, 1, l2, s, binary=True)
        scores.append([frame_scores(v, (torch.from_numpy(std(v.feats)).to(torch.float64) @ W + b)[:, 0].numpy())
                       for v in test])

    def auc(s, idx):
        i = _sel(n, idx)
        yy = np.concatenate([fl[j] for j in i])
        ss = np.concatenate([scores[s][j] for j in i])
        return _auc(yy, ss)

    same = all(np.allclose(np.concatenate(scores[0]), np.concatenate(sc), atol=1e-4) for sc in scores[1:])
    return Scored("ad", {"auc": auc}, {"auc": 0.5}, len(seeds), n, [v.video_id for v in test], same_outputs=same)


def _auc(y: np.ndarray, s: np.ndarray) -> float:
    """ROC AUC with ties counted half (Mann-Whitney), raises ValueError when one class is absent."""
    n1 = int(y.sum())
    n0 = len(y) - n1
    if n1 == 0 or n0 == 0:
        raise ValueError("AUC undefined: one class only")
    order = np.argsort(s, kind="mergesort")
    ss = s[order]
    ranks = np.empty(len(s))
    # average ranks of ties
    starts = np.r_[0, np.flatnonzero(np.diff(ss)) + 1]
    ends = np.r_[starts[1:], len(ss)]
    avg = (starts + ends - 1) / 2.0 + 1
    ranks[order] = np.repeat(avg, ends - starts)
    return float((ranks[y == 1].sum() - n1 * (n1 + 1) / 2) / (n1 * n0))


# ---------------------------------------------------------------- TAD

def temporal_detection_head(train: Videos, test: Videos, classes: Sequence[str], seeds: Sequence[int] = seeds_from(),
                       epochs: int = 150, lr: float = 2e-3, weight_decay: float = 1e-4, hidden: int = 64,
                       tious: Sequence[float] = TIOUS, **_) -> Scored:
    """TADHead trained full batch (every train video in every step) with Adam, one per seed; mAP over tIoUs."""
    from ..heads import TADHead, pad_sequences, stack_tad_targets, tad_decode, tad_loss, tad_targets

    classes = list(classes)
    std = Standardiser(_all_clips(train))
    x, mask = pad_sequences([torch.from_numpy(std(v.feats)) for v in train])
    tgt = stack_tad_targets([tad_targets(v, classes) for v in train], x.shape[1])
    xt, mt = pad_sequences([torch.from_numpy(std(v.feats)) for v in test])
    gts = [[tuple(seg) for seg in v.meta.get("segments") or []] for v in test]
    dets = []
    for s in seeds:
        torch.manual_seed(s)
        head = TADHead(train[0].dim, len(classes), hidden=hidden)
        opt = torch.optim.AdamW(head.parameters(), lr=lr, weight_decay=weight_decay)
        for _ in range(epochs):
            loss = tad_loss(*head(x, mask), tgt, mask)
            opt.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(head.parameters(), 1.0)
            opt.step()
        head.eval()
        with torch.no_grad():
            cl, rg = head(xt, mt)
        dets.append([[(a, e, classes[c], p) for a, e, c, p in
                      tad_decode(cl[j, :len(v.feats)], rg[j, :len(v.feats)], v.clip_start_s, v.clip_end_s)]
                     for j, v in enumerate(test)])
    n = len(test)

    def mAP_at(key):
        def f(s, idx):
            i = _sel(n, idx)  # resampled videos get distinct keys: a video drawn twice counts twice
            out = tad_map({k: dets[s][j] for k, j in enumerate(i)}, {k: gts[j] for k, j in enumerate(i)}, tious)
            return out[key]
        return f

    # chance: the same detections scored against the ground truth of other test videos (cyclic shifts)
    shifts = [1, 2, 3] if n > 3 else [1]
    null = [tad_map({k: dets[0][(k + sh) % n] for k in range(n)}, {k: gts[k] for k in range(n)}, tious)["mAP"]
            for sh in shifts]
    metrics = {"mAP": mAP_at("mAP")}
    return Scored("tad", metrics, {"mAP": float(np.mean(null))}, len(seeds), n, [v.video_id for v in test],
                  details={"tious": list(tious)})


# ---------------------------------------------------------------- privacy

def _attr_labels(videos: Videos, attributes: Sequence[str]) -> np.ndarray:
    cols = [a if a.startswith("attr_") else f"attr_{a}" for a in attributes]
    y = np.array([[v.meta.get(c) for c in cols] for v in videos], dtype=object)
    assert not any(val is None for row in y for val in row), "privacy_attack: missing attribute labels"
    return y.astype(np.float32)


def _batched_attack(x: np.ndarray, y: np.ndarray, xt: np.ndarray, starts: np.ndarray, n_clips: np.ndarray,
                    y_test: np.ndarray, seeds: list[int], epochs: int, lr: float, batch_size: int) -> list[np.ndarray]:
    """S independent D->D->A MLPs trained at once (stacked weights); per seed the test-video probabilities at
    the epoch of its best test cMAP."""
    S, D, A = len(seeds), x.shape[1], y.shape[1]
    params = []
    for s in seeds:  # nn.Linear's default init, per seed
        torch.manual_seed(s)
        l1, l2_ = torch.nn.Linear(D, D), torch.nn.Linear(D, A)
        params.append(tuple(t.detach().clone() for t in (l1.weight.T, l1.bias, l2_.weight.T, l2_.bias)))
    W1, b1, W2, b2 = (torch.stack([p[k] for p in params]).requires_grad_() for k in range(4))
    opt = torch.optim.AdamW([W1, b1, W2, b2], lr=lr)
    X, Y, XT = torch.from_numpy(x), torch.from_numpy(y), torch.from_numpy(xt)
    gens = [torch.Generator().manual_seed(s) for s in seeds]
    best = [(-1.0, None)] * S

    def fwd(inp):  # inp (S, B, D) -> (S, B, A)
        return torch.baddbmm(b2[:, None], torch.relu(torch.baddbmm(b1[:, None], inp, W1)), W2)

    for _ in range(epochs):
        orders = torch.stack([torch.randperm(len(X), generator=g) for g in gens])     # (S, N)
        for a in range(0, len(X), batch_size):
            idx = orders[:, a:a + batch_size]
            loss = F.binary_cross_entropy_with_logits(fwd(X[idx]), Y[idx], reduction="none").mean(dim=(1, 2)).sum()
            opt.zero_grad()
            loss.backward()
            opt.step()
        with torch.no_grad():
            clip_probs = torch.sigmoid(fwd(XT.expand(S, -1, -1))).numpy()             # (S, Nt_clips, A)
        for k in range(S):
            probs = np.add.reduceat(clip_probs[k], starts, axis=0) / n_clips
            c = cmap(y_test, probs)
            if c > best[k][0]:
                best[k] = (c, probs)
    return [b[1] for b in best]


def privacy_attack(train: Videos, test: Videos, attributes: Sequence[str], seeds: Sequence[int] = seeds_from(),
                   epochs: int = 100, lr: float = 1e-3, batch_size: int = 1024, **_) -> Scored:
    y_train, y_test = _attr_labels(train, attributes), _attr_labels(test, attributes)
    y = np.repeat(y_train, [len(v.feats) for v in train], axis=0)
    starts = np.cumsum([0] + [len(v.feats) for v in test[:-1]])
    n_clips = np.array([len(v.feats) for v in test])[:, None]
    std = Standardiser(_all_clips(train))
    branches = {}
    for name, tf in (("raw", lambda a: np.asarray(a, np.float32)), ("standardised", std)):
        branches[name] = _batched_attack(tf(_all_clips(train)), y, tf(_all_clips(test)), starts, n_clips, y_test,
                                         list(seeds), epochs, lr, batch_size)
    mean_c = {k: float(np.mean([cmap(y_test, p) for p in v])) for k, v in branches.items()}
    branch = max(mean_c, key=mean_c.get)
    probs = branches[branch]
    n = len(test)

    def cm(s, idx):
        i = _sel(n, idx)
        return cmap(y_test[i], probs[s][i])

    def f1(s, idx):
        i = _sel(n, idx)
        return _macro_f1(y_test[i], probs[s][i])

    def branch_cmap(name):
        def f(s, idx):
            i = _sel(n, idx)
            return cmap(y_test[i], branches[name][s][i])
        return f

    def chance_of(s, idx):
        return chance_cmap(y_test[_sel(n, idx)])

    metrics = {"cmap": cm, "f1": f1, "chance_cmap": chance_of,
               **{f"cmap_{name}_branch": branch_cmap(name) for name in branches}}
    chance = {"cmap": chance_cmap(y_test), "f1": None, "chance_cmap": None,
              **{f"cmap_{name}_branch": chance_cmap(y_test) for name in branches}}
    return Scored("privacy", metrics, chance, len(seeds), n, [v.video_id for v in test],
                  higher_is_better={"cmap": True}, seed_only=("chance_cmap", *(f"cmap_{b}_branch" for b in branches)),
                  details={"branch": branch, "branch_cmap": mean_c, "attributes": list(attributes),
                           "chance_fn": lambda idx: chance_cmap(y_test[_sel(n, idx)])})


def _macro_f1(y: np.ndarray, probs: np.ndarray, threshold: float = 0.5) -> float:
    """Macro-F1 over attributes at `threshold` (sklearn's f1_score(average='macro', zero_division=0), in numpy:
    the bootstrap calls it thousands of times)."""
    pred = probs >= threshold
    y = y.astype(bool)
    tp = (pred & y).sum(0)
    denom = pred.sum(0) + y.sum(0)
    return float(np.mean(np.where(denom > 0, 2 * tp / np.maximum(denom, 1), 0.0)))


# ---------------------------------------------------------------- gait

def gait_retrieval(videos: Videos, **_) -> Scored:
    subjects = np.array([v.meta.get("subject_id") for v in videos], dtype=object)
    means = np.stack([v.feats.astype(np.float64).mean(0) for v in videos])
    z = Standardiser(means)(means).astype(np.float64)
    z /= np.maximum(np.linalg.norm(z, axis=1, keepdims=True), 1e-12)
    sim = z @ z.T
    np.fill_diagonal(sim, -np.inf)
    hit = (subjects[sim.argmax(1)] == subjects).astype(float)
    same = np.array([(subjects == s).sum() - 1 for s in subjects], float)
    n = len(videos)

    def top1(s, idx):
        return float(hit[_sel(n, idx)].mean())

    return Scored("gait", {"top1": top1}, {"top1": float((same / (n - 1)).mean())}, 1, n,
                  [v.video_id for v in videos])


# ---------------------------------------------------------------- TAD, convex variant

def _context(feats: np.ndarray, k: int = 1) -> np.ndarray:
    """(T, D) -> (T, (2k+1) D): each clip with its k neighbours on each side (edges repeated)."""
    T = len(feats)
    idx = np.clip(np.arange(T)[:, None] + np.arange(-k, k + 1)[None], 0, T - 1)
    return feats[idx].reshape(T, -1)


def clip_classes(video: VideoFeatures, classes: list[str]) -> np.ndarray:
    """(T,) class index of the segment covering each clip's centre; len(classes) = background."""
    centres = (np.asarray(video.clip_start_s) + np.asarray(video.clip_end_s)) / 2
    out = np.full(len(centres), len(classes))
    best = np.full(len(centres), np.inf)
    for start, end, label in video.meta.get("segments") or []:
        inside = (centres >= start) & (centres < end) & (end - start < best)
        out[inside], best[inside] = classes.index(label), end - start
    return out


def _runs_to_detections(p: np.ndarray, starts: np.ndarray, ends: np.ndarray, c: int,
                        thresholds=(0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9)) -> list[tuple]:
    """Candidate segments of class c: maximal runs of clips with p >= each threshold, scored by their mean p."""
    from ..heads import nms_1d

    segs, scores = [], []
    for thr in thresholds:
        on = np.r_[False, p >= thr, False]
        edges = np.flatnonzero(np.diff(on.astype(int)))
        for a, b in zip(edges[::2], edges[1::2]):
            segs.append((starts[a], ends[b - 1]))
            scores.append(float(p[a:b].mean()))
    if not segs:
        return []
    uniq = {}
    for sgm, sc in zip(segs, scores):
        uniq[sgm] = max(sc, uniq.get(sgm, 0.0))
    kept, ks = nms_1d(np.array(list(uniq)), np.array(list(uniq.values())), "soft", sigma=0.5, min_score=1e-3)
    return [(float(a), float(b), c, float(s)) for (a, b), s in zip(kept, ks)]


def temporal_detection(train: Videos, test: Videos, classes: Sequence[str], seeds: Sequence[int] = seeds_from(),
                       l2: float = 0.1, context: int = 1, tious: Sequence[float] = TIOUS, **_) -> Scored:
    """Per-clip softmax over the classes + background on each clip and its neighbours (convex, L-BFGS);
    detections are the runs of clips above each of 9 probability thresholds, scored by mean probability,
    soft-NMS per class. mAP over tIoUs; chance = the detections scored against other videos' ground truth."""
    classes = list(classes)
    std = Standardiser(_all_clips(train))
    x = torch.from_numpy(np.concatenate([_context(std(v.feats), context) for v in train]))
    y = torch.from_numpy(np.concatenate([clip_classes(v, classes) for v in train]))
    w = torch.ones(len(y), dtype=torch.float64)
    xt = [torch.from_numpy(_context(std(v.feats), context)).to(torch.float64) for v in test]
    gts = [[tuple(seg) for seg in v.meta.get("segments") or []] for v in test]
    dets, probs = [], []
    for s in seeds:
        W, b = fit_logistic(x, y, w, len(classes) + 1, l2, s)
        ps = [torch.softmax(a @ W + b, -1).numpy() for a in xt]
        if probs and all(np.allclose(p, q, atol=1e-4) for p, q in zip(probs[-1], ps)):
            probs.append(probs[-1])  # the same optimum (convex): the same detections
            dets.append(dets[-1])
            continue
        probs.append(ps)
        dets.append([sorted((d for c in range(len(classes))
                             for d in _runs_to_detections(p[:, c], np.asarray(v.clip_start_s), np.asarray(v.clip_end_s), c)),
                            key=lambda d: -d[3])
                     for p, v in zip(ps, test)])
    dets = [[[(a, e, classes[c], sc) for a, e, c, sc in dv] for dv in ds] for ds in dets]
    n = len(test)

    cache: dict = {}

    def scores(s, idx):
        i = _sel(n, idx)
        key = (id(dets[s]), i.tobytes())  # seeds with the same detections share one evaluation
        if key not in cache:
            cache[key] = tad_map({k: dets[s][j] for k, j in enumerate(i)}, {k: gts[j] for k, j in enumerate(i)}, tious)
        return cache[key]

    def at(name):
        return lambda s, idx: scores(s, idx)[name]

    shifts = [1, 2, 3] if n > 3 else [1]
    null = [tad_map({k: dets[0][(k + sh) % n] for k in range(n)}, {k: gts[k] for k in range(n)}, tious)["mAP"]
            for sh in shifts]
    same = all(d is dets[0] for d in dets[1:])
    names = ["mAP"] + [f"mAP@{t:g}" for t in tious]
    return Scored("tad", {m: at(m) for m in names}, {"mAP": float(np.mean(null)), **{m: None for m in names[1:]}},
                  len(seeds), n, [v.video_id for v in test],
                  details={"tious": list(tious)}, same_outputs=same, n_boot=100)  # mAP is costly to re-score
