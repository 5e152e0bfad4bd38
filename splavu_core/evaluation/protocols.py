"""Multi-seed evaluation protocols with per-video outputs, so every metric gets an interval (stats.py).

Each protocol trains S fresh probes (seeds base_seed .. base_seed+S-1) on `train` and returns a `Scored`:
per-seed outputs on the `test` videos plus metric functions metric(seed_index, video_indices | None) -> float,
so the same code gives the value on all test videos, on a bootstrap resample, and paired differences between
two feature sets scored on the same videos (raw vs anonymized, same seed, same resample).

Probes (fixed on raw features of the demo store before any anonymizer was scored; docs/evaluation.md):
- AR / bias: multinomial logistic regression on standardised clips (each clip weighted 1/n_clips of its
  video, L2), full-batch L-BFGS from a seed-dependent random start; top-1 with softmax averaged over 5
  evenly spaced clips. Convex: seeds agree to optimiser tolerance, the bootstrap carries the sampling error.
- TAD: per-clip softmax over the classes + background on each standardised clip and its two neighbours (convex,
  L-BFGS); detections = runs of clips above each of 9 probability thresholds, scored by their mean probability,
  soft-NMS per class; mAP over tIoU 0.3:0.1:0.7. Chance: the same detections scored against the ground truth of
  other test videos. (The trained TADHead, `temporal_detection_head`, scored higher, 0.44, but its seed sd was
  0.014-0.026 mAP on the demo store: see docs/history.md.)
- AD: per-clip logistic scorer trained on video labels only (every clip of an anomalous training video is
  a positive bag member; a linear model fitted to the bag labels ranks anomalous clips highest), standardised,
  L2, full-batch L-BFGS; frame-level ROC AUC. Chance 0.5.
- privacy: the attacker suite (attackers.py: fixed capacity whatever the table's width), the strongest member on
  the features scored quoted as `cmap`, each member as `cmap[<name>]`. Chance: mean attribute prevalence.
  `ap[<attribute>]`: the strongest member's AP on one attribute (chance: its prevalence), so a table says WHICH
  attribute stays readable, not only how much of the mean.
- reid: linking a test person's videos across actions (cosine; LDA learned on the train subjects), rank-1 / mAP.
- gait: nearest-neighbour retrieval, no training (one "seed"); bootstrap over query videos. Chance: expected
  hit rate of a random neighbour.
"""
from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import numpy as np
import torch
import torch.nn.functional as F

from splavu_core.evaluation import attackers as A
from splavu_core.evaluation import stats
from splavu_core.evaluation.attackers import Standardiser
from splavu_core.tasks.features import VideoFeatures
from splavu_core.tasks.metrics import (
    TIOUS,
    chance_cmap,
    cmap,
    cmap_resamples,
    frame_labels,
    frame_scores,
    resample_counts,
    tad_map,
    tad_map_resamples,
    tad_tables,
)
from splavu_core.threads import intra_op_threads

Videos = Sequence[VideoFeatures]
N_SEEDS = 5


def all_clips(videos: Videos) -> np.ndarray:
    return np.concatenate([v.feats for v in videos])              # (sum n_clips, D)


def eval_clip_indices(n_clips: int, k: int = 5) -> np.ndarray:
    """k evenly spaced clip indices (fewer, unique, when the video is shorter)."""
    return np.unique(np.linspace(0, n_clips - 1, k).round().astype(int))


def top1_among(pred: Sequence, true: Sequence, classes: Sequence[str]) -> float | None:
    """Top-1 over the test videos whose true class is in `classes` (None if there are none)."""
    pairs = [(p, t) for p, t in zip(pred, true) if t in set(classes)]
    return float(np.mean([p == t for p, t in pairs])) if pairs else None


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
    signed: tuple = ()                    # metrics in [-1, 1] (a signed difference), not [0, 1]
    n_boot: int = 200                     # bootstrap resamples of the test videos
    clusters: np.ndarray | None = None    # (n_test,) the person of each bootstrap unit (subject_clusters): the
    #                                       bootstrap resamples people; None: no person holds two units
    outputs: tuple | None = None          # (kind, what the probes output): `from_outputs` builds it again (score_cache)


def subject_clusters(videos: Videos) -> np.ndarray | None:
    """The person codes of the scored videos (meta subject_id; unknown: a person of its own) for the bootstrap
    (stats.bootstrap_indices), or None when no person holds two of them. One person's videos are not independent
    draws: resampling videos of 40 people as if they were 450 independent draws gave 95% intervals that held the
    truth 48-80% of the time (tests/test_interval_coverage.py)."""
    return stats.cluster_codes(v.meta.get("subject_id") for v in videos)


def seeds_from(base_seed: int = 0, n_seeds: int = N_SEEDS) -> list[int]:
    return [base_seed + i for i in range(n_seeds)]


def _sel(n: int, idx):
    return np.arange(n) if idx is None else np.asarray(idx)


# ---------------------------------------------------------------- convex probes: L-BFGS

def fit_logistic(x: torch.Tensor, y: torch.Tensor, w: torch.Tensor, n_classes: int, l2: float, seed: int,
                 max_iter: int = 300, binary: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """Weighted (multinomial or binary) logistic regression with L2 on the weights, full-batch L-BFGS from a
    seed-dependent random start. Returns (W (D, C or 1), b).

    The objective is sklearn's LogisticRegression(C=1/l2) with sample weights w / w.sum(), and both reach the same
    optimum (probabilities within 2e-4: tests/test_metric_references.py). It is not here for speed:
    benchmarks/metric_speed.py timed sklearn's lbfgs as fast at the AR probe's size and faster at TAD's and AD's
    (1.4x, 1.6x; one thread). It stays because the probes' figures (docs/results.md) were fitted with it and a
    switch moves them at the solver's tolerance; the random start is moot for a convex problem."""
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
    std = Standardiser(all_clips(train))
    x = torch.from_numpy(std(all_clips(train)))
    y = torch.tensor([index[v.meta["action"]] for v in train for _ in range(len(v.feats))])
    w = torch.tensor([1.0 / len(v.feats) for v in train for _ in range(len(v.feats))], dtype=torch.float64)
    sel = [torch.from_numpy(std(v.feats[eval_clip_indices(len(v.feats), n_test_clips)])).to(torch.float64)
           for v in test]
    bounds = np.cumsum([0] + [len(s) for s in sel])
    xt = torch.cat(sel)
    W, b = fit_logistic(x, y, w, len(classes), l2, seeds[0])  # convex: one optimum stands for every seed
    p = torch.softmax(xt @ W + b, -1).numpy()
    return np.stack([np.stack([p[a:e].mean(0) for a, e in zip(bounds[:-1], bounds[1:])])] * len(seeds))


def action_recognition(train: Videos, test: Videos, seeds: Sequence[int] = seeds_from(), l2: float = 0.1,
                       n_test_clips: int = 5, classes: Sequence[str] | None = None, **_) -> Scored:
    classes = list(classes) if classes is not None else sorted({v.meta["action"] for v in train})
    index = {c: i for i, c in enumerate(classes)}
    unknown = {v.meta["action"] for v in test} - set(index)
    assert not unknown, f"test actions {sorted(unknown)} are not among the classes {classes}"
    probs = _ar_probs(train, test, classes, list(seeds), l2, n_test_clips)
    return ar_scored(probs, test, classes)


def ar_scored(probs: np.ndarray, test: Videos, classes: Sequence[str]) -> Scored:
    """The AR Scored of per-seed test-video class probabilities (S, N, C): top-1, and each test class's top-1 as
    class_top1[<class>]."""
    classes = list(classes)
    index = {c: i for i, c in enumerate(classes)}
    pred = probs.argmax(-1)                                                   # (S, N)
    true = np.array([index[v.meta["action"]] for v in test])
    n = len(test)

    def top1(s, idx):
        i = _sel(n, idx)
        return float((pred[s, i] == true[i]).mean())

    def share_right(s, idx, of):  # every resample at once: right / drawn among the videos `of`, NaN where none drawn
        counts = resample_counts(idx, n)[:, of]                                # (B, n_of)
        drawn = counts.sum(1)
        right = counts[:, pred[s, of] == true[of]].sum(1)
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.where(drawn > 0, right / np.maximum(drawn, 1), np.nan)

    def per_class(c):
        def f(s, idx):
            i = _sel(n, idx)
            i = i[true[i] == c]
            return float((pred[s, i] == c).mean()) if len(i) else np.nan
        return stats.with_resamples(f, lambda s, idx: share_right(s, idx, true == c), remember=False)

    stats.with_resamples(top1, lambda s, idx: share_right(s, idx, np.ones(n, bool)), remember=False)

    metrics = {"top1": top1, **{f"class_top1[{classes[c]}]": per_class(c) for c in sorted(set(true))}}
    chance = {k: 1.0 / len(classes) for k in metrics}
    return Scored("ar", metrics, chance, len(probs), n, [v.video_id for v in test],
                  details={"classes": classes, "pred": pred, "true": true}, same_outputs=bool((pred == pred[0]).all()),
                  clusters=subject_clusters(test), outputs=("ar", {"probs": probs, "classes": classes}))


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

    action, favoured = shortcut(train)
    on_action = true == ar.details["classes"].index(action) if action in ar.details["classes"] else np.zeros(n, bool)

    def shortcut_gap(s, idx):  # signed: favoured - other group on the shortcut action (no |.|, so 0 is centred)
        i = _sel(n, idx)
        i = i[on_action[i]]
        ok = pred[s, i] == true[i]
        fav = groups[i] == favoured
        return float(ok[fav].mean() - ok[~fav].mean()) if fav.any() and (~fav).any() else np.nan

    metrics = {"top1": ar.metrics["top1"], **{f"acc_{g}": acc(g) for g in names}, "gap": gap,
               "shortcut_gap": shortcut_gap}
    c = 1.0 / len(ar.details["classes"])
    chance = {"top1": c, **{f"acc_{g}": c for g in names}, "gap": None, "shortcut_gap": None}
    return Scored("bias", metrics, chance, len(seeds), n, ar.test_ids,
                  higher_is_better={"gap": False, "shortcut_gap": False}, same_outputs=ar.same_outputs,
                  signed=("shortcut_gap",), clusters=ar.clusters,
                  details={"shortcut_action": action, "favoured_group": favoured,
                           "shortcut_test_videos": int(on_action.sum())})


def shortcut(train: Videos) -> tuple[str, str]:
    """The training set's shortcut: the action whose group mix departs most from the whole set's, and the group it
    over-represents (bias_f: clap, 'f'). From the training labels only; two groups."""
    groups = np.array([v.meta["group"] for v in train], dtype=object)
    names = sorted(set(groups))
    assert len(names) == 2, f"bias: the training set needs exactly two groups, got {names}"
    actions = np.array([v.meta["action"] for v in train], dtype=object)
    overall = (groups == names[0]).mean()
    share = {a: (groups[actions == a] == names[0]).mean() for a in sorted(set(actions))}
    action = max(share, key=lambda a: abs(share[a] - overall))
    return action, names[0] if share[action] > overall else names[1]


# ---------------------------------------------------------------- AD

def anomaly_detection(train: Videos, test: Videos, seeds: Sequence[int] = seeds_from(), l2: float = 1.0, **_) -> Scored:
    """Clip-level logistic scorer on video labels (weak supervision), frame-level ROC AUC."""
    labels = [v.meta.get("anomaly") for v in train]
    assert set(labels) == {0, 1}, f"anomaly_detection: train needs normal and anomalous videos, got {set(labels)}"
    std = Standardiser(all_clips(train))
    x = torch.from_numpy(std(all_clips(train)))
    y = torch.tensor([lab for v, lab in zip(train, labels) for _ in range(len(v.feats))])
    # every video weighs the same, and both classes weigh the same in total
    n_pos = sum(labels)
    cw = {1: 0.5 / n_pos, 0: 0.5 / (len(labels) - n_pos)}
    w = torch.tensor([cw[lab] / len(v.feats) for v, lab in zip(train, labels) for _ in range(len(v.feats))],
                     dtype=torch.float64)
    fl = [frame_labels(v) for v in test]
    W, b = fit_logistic(x, y, w, 1, l2, list(seeds)[0], binary=True)  # convex: one optimum stands for every seed
    one = [frame_scores(v, (torch.from_numpy(std(v.feats)).to(torch.float64) @ W + b)[:, 0].numpy()) for v in test]
    return ad_scored([one] * len(seeds), fl, test)


def ad_scored(scores: list[list[np.ndarray]], fl: list[np.ndarray], test: Videos) -> Scored:
    """The AD Scored of per-seed frame scores of each test video (and the videos' frame labels): frame ROC AUC."""
    n = len(test)

    def auc(s, idx):
        i = _sel(n, idx)
        yy = np.concatenate([fl[j] for j in i])
        ss = np.concatenate([scores[s][j] for j in i])
        return _auc(yy, ss)

    y_all = np.concatenate(fl)
    video_of = np.repeat(np.arange(n), [len(f) for f in fl])
    flat = [np.concatenate(sc) for sc in scores]
    same = all(np.allclose(flat[0], f, atol=1e-4) for f in flat[1:])
    fast = stats.with_resamples(auc, lambda s, idx: auc_resamples(y_all, flat[s], video_of, idx))
    return Scored("ad", {"auc": fast}, {"auc": 0.5}, len(scores), n, [v.video_id for v in test], same_outputs=same,
                  clusters=subject_clusters(test), outputs=("ad", {"scores": scores}))


def auc_resamples(y: np.ndarray, s: np.ndarray, video_of: np.ndarray, idx) -> np.ndarray:
    """_auc of every resample of the videos at once: idx, B rows of video indices (stats.bootstrap_indices: videos or
    people) -> (B,), NaN where a resample lacks a class. A resample weights each frame by its video's draw count,
    so frames are ranked once: the Mann-Whitney sum over tie groups of the sorted scores (ties count half), as _auc
    on the concatenated resampled videos, and sklearn's roc_auc_score with those sample weights
    (tests/test_metric_references.py). By hand for speed: 19x a roc_auc_score per resample at the demo's AD size
    (benchmarks/metric_speed.py)."""
    order = np.argsort(s, kind="mergesort")
    ss, yy, vv = s[order], y[order].astype(bool), video_of[order]
    starts = np.r_[0, np.flatnonzero(np.diff(ss)) + 1]                          # tie groups of the sorted scores
    counts = resample_counts(idx, int(video_of.max()) + 1).astype(np.float64)
    w = counts[:, vv]                                                            # (B, N) frame weights
    pos = np.add.reduceat(np.where(yy, w, 0.0), starts, axis=1)                  # (B, G)
    neg = np.add.reduceat(np.where(yy, 0.0, w), starts, axis=1)
    below = np.cumsum(neg, axis=1) - neg
    n1, n0 = pos.sum(1), neg.sum(1)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where((n1 > 0) & (n0 > 0), (pos * (below + 0.5 * neg)).sum(1) / (n1 * n0), np.nan)


def _auc(y: np.ndarray, s: np.ndarray) -> float:
    """ROC AUC with ties counted half (Mann-Whitney), raises ValueError when one class is absent (sklearn's
    roc_auc_score warns and returns NaN there); equal to roc_auc_score otherwise (tests/test_metric_references.py).
    By hand for speed: 7x roc_auc_score on the demo's AD test frames (benchmarks/metric_speed.py), and the
    bootstrap's metric(seed, idx) calls it where auc_resamples does not apply."""
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
    """TADHead trained full batch (every train video in every step) with Adam, one per seed; mAP over tIoUs.

    Each head on one intra-op thread: its convolutions' backward sums in an order that depends on the thread count,
    so on two threads its mAP differed from one thread's by up to a point per seed (a machine's core count changed
    the report), and on two shared cores it ran 1.6x (quiet) to 5x (a core busy) slower than on one. The seeds'
    heads are initialised in order under their seeds, then trained side by side, one per torch thread (training
    draws no random number, so the figures are those of training them one after another)."""
    from splavu_core.tasks.heads import TADHead, pad_sequences, stack_tad_targets, tad_targets

    classes = list(classes)
    std = Standardiser(all_clips(train))
    x, mask = pad_sequences([torch.from_numpy(std(v.feats)) for v in train])
    tgt = stack_tad_targets([tad_targets(v, classes) for v in train], x.shape[1])
    xt, mt = pad_sequences([torch.from_numpy(std(v.feats)) for v in test])
    gts = [[tuple(seg) for seg in v.meta.get("segments") or []] for v in test]
    heads = []
    for s in seeds:
        torch.manual_seed(s)
        heads.append(TADHead(x.shape[-1], len(classes), hidden=hidden))

    def detections(head):
        return _tad_detections(head, x, mask, tgt, xt, mt, test, classes, epochs, lr, weight_decay)

    workers = max(1, min(len(heads), torch.get_num_threads()))  # the process's thread budget, as extraction's
    with intra_op_threads(1), ThreadPoolExecutor(workers) as pool:  # encoder_workers reads it
        dets = list(pool.map(detections, heads))
    return tad_scored(dets, gts, test, tious, n_boot=100)


def _tad_detections(head, x, mask, tgt, xt, mt, test, classes, epochs, lr, weight_decay) -> list:
    """One seed's TADHead, trained on the padded train videos x (B, T, D) -> its detections on each test video."""
    from splavu_core.tasks.heads import tad_decode, tad_loss

    opt = torch.optim.AdamW(head.parameters(), lr=lr, weight_decay=weight_decay)
    for _ in range(epochs):
        loss = tad_loss(*head(x, mask), tgt, mask)
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(head.parameters(), 1.0)
        opt.step()
    head.eval()
    with torch.no_grad():
        cl, rg = head(xt, mt)                                   # (B, T, C), (B, T, 2)
    return [[(a, e, classes[c], p) for a, e, c, p in
             tad_decode(cl[j, :len(v.feats)], rg[j, :len(v.feats)], v.clip_start_s, v.clip_end_s)]
            for j, v in enumerate(test)]


def tad_scored(dets: list, gts: list, test: Videos, tious: Sequence[float], n_boot: int = 100) -> Scored:
    """The TAD Scored of per-seed detections [(start_s, end_s, label, score)] of each test video: mAP over the
    tIoUs and mAP@t at each. Chance: the same detections scored against the ground truth of other test videos
    (cyclic shifts). Seeds whose detections are the same object share their evaluations."""
    n = len(test)
    cache: dict = {}

    def scores(s, idx):
        i = _sel(n, idx)  # resampled videos get distinct keys: a video drawn twice counts twice
        key = (id(dets[s]), i.tobytes())
        if key not in cache:
            cache[key] = tad_map({k: dets[s][j] for k, j in enumerate(i)}, {k: gts[j] for k, j in enumerate(i)}, tious)
        return cache[key]

    tables: dict = {}

    def table(s, idx):  # every resample at once (metrics.tad_map_resamples), its matching done once per seed
        key = id(dets[s])
        if key not in tables:
            tables[key] = tad_tables(dets[s], gts, tious)
        return tad_map_resamples(tables[key], idx, len(tious))

    memo: dict = {}

    def at(name):
        col = (["mAP"] + [f"mAP@{t:g}" for t in tious]).index(name)

        def resamples(s, idx):
            key = (id(dets[s]), stats.resample_key(idx))
            if key not in memo:
                memo[key] = table(s, idx)
            return memo[key][:, col]
        return stats.with_resamples(lambda s, idx: scores(s, idx)[name], resamples, remember=False)

    shifts = [1, 2, 3] if n > 3 else [1]
    null = [tad_map({k: dets[0][(k + sh) % n] for k in range(n)}, {k: gts[k] for k in range(n)}, tious)["mAP"]
            for sh in shifts]
    names = ["mAP"] + [f"mAP@{t:g}" for t in tious]
    return Scored("tad", {m: at(m) for m in names}, {"mAP": float(np.mean(null)), **{m: None for m in names[1:]}},
                  len(dets), n, [v.video_id for v in test], details={"tious": list(tious)},
                  same_outputs=all(d is dets[0] for d in dets[1:]), n_boot=n_boot,  # mAP is costly to re-score
                  clusters=subject_clusters(test),
                  outputs=("tad", {"dets": dets, "tious": list(tious), "n_boot": n_boot}))


def from_outputs(outputs: tuple, test: Videos) -> Scored:
    """The Scored of a protocol's kept outputs (Scored.outputs) on the same test videos: what the protocol returned."""
    kind, o = outputs
    if kind == "ar":
        return ar_scored(o["probs"], test, o["classes"])
    if kind == "ad":
        return ad_scored(o["scores"], [frame_labels(v) for v in test], test)
    if kind == "tad":
        gts = [[tuple(seg) for seg in v.meta.get("segments") or []] for v in test]
        return tad_scored(o["dets"], gts, test, o["tious"], o["n_boot"])
    raise ValueError(f"from_outputs: unknown kind {kind!r}")


# ---------------------------------------------------------------- privacy

def _attr_labels(videos: Videos, attributes: Sequence[str]) -> np.ndarray:
    cols = [a if a.startswith("attr_") else f"attr_{a}" for a in attributes]
    y = np.array([[v.meta.get(c) for c in cols] for v in videos], dtype=object)
    assert not any(val is None for row in y for val in row), "privacy_attack: missing attribute labels"
    return y.astype(np.float32)


def attack_data(train: Videos, test: Videos, attributes: Sequence[str]) -> A.AttackData:
    y_train, y_test = _attr_labels(train, attributes), _attr_labels(test, attributes)
    return A.AttackData(x=np.asarray(all_clips(train), np.float32),
                        y=np.repeat(y_train, [len(v.feats) for v in train], axis=0),
                        train_starts=np.cumsum([0] + [len(v.feats) for v in train[:-1]]), y_train=y_train,
                        xt=np.asarray(all_clips(test), np.float32),
                        starts=np.cumsum([0] + [len(v.feats) for v in test[:-1]]),
                        n_clips=np.array([len(v.feats) for v in test])[:, None], y_test=y_test)


def privacy_attack(train: Videos, test: Videos, attributes: Sequence[str], seeds: Sequence[int] = seeds_from(),
                   epochs: int = 100, lr: float = 1e-3, batch_size: int = 1024,
                   attackers: Sequence[str] = tuple(a.name for a in A.ALL), **_) -> Scored:
    """Every attacker of the suite (evaluation/attackers.py) trained fresh on `train`, scored on `test`.
    Metrics: cmap / f1 of the STRONGEST suite member on these features (highest mean cMAP), cmap[<attacker>]
    of each, ap[<attribute>] of the strongest, chance_cmap. details: strongest, each attacker's mean cMAP and
    capacity."""
    d = attack_data(train, test, attributes)
    probs_by = A.run_attackers(d, list(seeds), attackers, epochs=epochs, lr=lr, batch_size=batch_size)
    y_test = d.y_test
    mean_c = {k: float(np.mean([cmap(y_test, p) for p in v])) for k, v in probs_by.items()}
    best = A.strongest(mean_c)
    n = len(test)

    def of(name, fn, fn_resamples):
        def f(s, idx):
            i = _sel(n, idx)
            return fn(y_test[i], probs_by[name][s][i])
        return stats.with_resamples(f, lambda s, idx: fn_resamples(y_test, probs_by[name][s], idx))

    def chance_of(s, idx):
        return chance_cmap(y_test[_sel(n, idx)])

    def column(j):  # one attribute's AP: cMAP of its column alone
        return (lambda y, p: cmap(y[:, [j]], p[:, [j]]), lambda y, p, idx: cmap_resamples(y[:, [j]], p[:, [j]], idx))

    names = [a.removeprefix("attr_") for a in attributes]

    metrics = {"cmap": of(best, cmap, cmap_resamples), "f1": of(best, _macro_f1, _macro_f1_resamples),
               "chance_cmap": chance_of, **{f"cmap[{name}]": of(name, cmap, cmap_resamples) for name in probs_by},
               **{f"ap[{a}]": of(best, *column(j)) for j, a in enumerate(names)}}
    chance = {"cmap": chance_cmap(y_test), "f1": None, "chance_cmap": None,
              **{f"cmap[{name}]": chance_cmap(y_test) for name in probs_by},
              **{f"ap[{a}]": float(y_test[:, j].mean()) for j, a in enumerate(names)}}
    same = all(all(p is v[0] for p in v[1:]) for v in probs_by.values())  # every attacker deterministic
    return Scored("privacy", metrics, chance, len(seeds), n, [v.video_id for v in test],
                  higher_is_better={"cmap": True}, seed_only=("chance_cmap",), same_outputs=same,
                  clusters=subject_clusters(test),
                  details={"strongest": best, "attacker_cmap": mean_c, "attributes": list(attributes),
                           "capacity": {k: A.capacity(k, train[0].dim) for k in probs_by},
                           "chance_fn": lambda idx: chance_cmap(y_test[_sel(n, idx)])})


def _macro_f1(y: np.ndarray, probs: np.ndarray, threshold: float = 0.5) -> float:
    """Macro-F1 over attributes at `threshold`: the mean over attributes of each one's positive-class F1, 0 where an
    attribute has neither a positive nor a positive prediction. sklearn's f1_score(average='macro', zero_division=0)
    on the (N, A) indicators (for one attribute, its average='binary': sklearn reads an (N, 1) indicator as one binary
    target and would average both classes' F1), in numpy; tests/test_metric_references.py checks it. By hand for
    the bootstrap, which scores every resample (_macro_f1_resamples): over 1000x an f1_score per resample at the
    demo's size (benchmarks/metric_speed.py)."""
    return float(_macro_f1_rows(y, probs, threshold))


def _macro_f1_resamples(y: np.ndarray, probs: np.ndarray, idx, threshold: float = 0.5) -> np.ndarray:
    """_macro_f1 of each resample of the rows (idx: B index rows, stats.bootstrap_indices) -> (B,): counts of true
    positives, predictions and positives weighted by how often each row was drawn."""
    counts = resample_counts(idx, len(y)).astype(np.float64)            # (B, N)
    pred, yy = probs >= threshold, np.asarray(y).astype(bool)
    tp, denom = counts @ (pred & yy), counts @ pred + counts @ yy          # (B, A)
    return np.mean(np.where(denom > 0, 2 * tp / np.maximum(denom, 1), 0.0), axis=-1)


def _macro_f1_rows(y: np.ndarray, probs: np.ndarray, threshold: float) -> np.ndarray:
    """_macro_f1 over the last two axes (..., N, A)."""
    pred = probs >= threshold                                           # (..., N, A)
    y = y.astype(bool)
    tp = (pred & y).sum(-2)
    denom = pred.sum(-2) + y.sum(-2)
    return np.mean(np.where(denom > 0, 2 * tp / np.maximum(denom, 1), 0.0), axis=-1)


# ---------------------------------------------------------------- re-identification

REID_ATTACKERS = ("cosine", "lda")   # training-free; a metric learned on the training subjects


def _unit(x: np.ndarray) -> np.ndarray:
    return x / np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-12)


def _video_means(videos: Videos) -> np.ndarray:
    return np.stack([v.feats.astype(np.float64).mean(0) for v in videos])


def reid_embeddings(train: Videos, test: Videos) -> dict[str, np.ndarray]:
    """attacker -> (N_test, d) unit embeddings of the test videos. cosine: standardised video means (statistics
    from the training videos, label-free); lda: shrinkage LDA fitted on the TRAINING subjects' video means
    (the subjects scored are disjoint), as many components as it has (<= subjects - 1, <= D)."""
    from sklearn.discriminant_analysis import LinearDiscriminantAnalysis

    tr, te = _video_means(train), _video_means(test)
    a, b = A.standardise(tr, te)
    out = {"cosine": _unit(b.astype(np.float64))}
    subjects = np.array([str(v.meta.get("subject_id")) for v in train])
    names, counts = np.unique(subjects, return_counts=True)
    fit = np.isin(subjects, names[counts >= 2])           # a subject seen once says nothing of within-person spread
    if len(set(subjects[fit])) >= 3:
        lda = LinearDiscriminantAnalysis(solver="eigen", shrinkage="auto").fit(a[fit], subjects[fit])
        out["lda"] = _unit(lda.transform(b).astype(np.float64))
    return out


def reidentification(train: Videos, test: Videos, chance_perms: int = 50, **_) -> Scored:
    """Link a test person's videos across ACTIONS: each test video queries the other test videos whose action
    differs from its own (the action held out of the gallery, so only the person can link them); rank-1 and
    mAP of the same subject, per attacker, and the strongest (highest rank-1). Queries with no same-subject video
    in their gallery are not scored. Deterministic (one 'seed'); the bootstrap is over query videos. Chance: a
    random ranking of the same galleries (rank-1: the share of same-subject videos; mAP: averaged over
    `chance_perms` random orders)."""
    subj = np.array([str(v.meta.get("subject_id")) for v in test], dtype=object)
    act = np.array([str(v.meta.get("action")) for v in test], dtype=object)
    n = len(test)
    gallery = (act[:, None] != act[None, :]) & ~np.eye(n, dtype=bool)          # (Nq, Ng)
    same = subj[:, None] == subj[None, :]
    pos = gallery & same
    q = np.flatnonzero(pos.any(1))                                             # scorable queries
    assert len(q) >= 2, "reidentification: needs >= 2 test videos whose subject appears in another action"
    emb = reid_embeddings(train, test)
    rng = np.random.default_rng(0)

    def score(sim: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        r1, ap = np.zeros(len(q)), np.zeros(len(q))
        for k, i in enumerate(q):
            g = np.flatnonzero(gallery[i])
            order = g[np.argsort(-sim[i, g], kind="stable")]
            hits = pos[i, order].astype(float)
            r1[k] = hits[0]
            prec = np.cumsum(hits) / np.arange(1, len(hits) + 1)
            ap[k] = (prec * hits).sum() / hits.sum()
        return r1, ap

    per = {name: score(e @ e.T) for name, e in emb.items()}
    chance_r1 = float(np.mean([pos[i].sum() / gallery[i].sum() for i in q]))
    chance_map = float(np.mean([score(rng.random((n, n)))[1].mean() for _ in range(chance_perms)]))
    mean_r1 = {k: float(v[0].mean()) for k, v in per.items()}
    best = max(REID_ATTACKERS, key=lambda k: mean_r1.get(k, -1.0))

    def of(name, j):
        return lambda s, idx: float(per[name][j][_sel(len(q), idx)].mean())

    metrics = {"rank1": of(best, 0), "map": of(best, 1),
               **{f"rank1[{k}]": of(k, 0) for k in per}, **{f"map[{k}]": of(k, 1) for k in per}}
    chance = {m: (chance_r1 if m.startswith("rank1") else chance_map) for m in metrics}
    return Scored("reid", metrics, chance, 1, len(q), [test[i].video_id for i in q], same_outputs=True,
                  clusters=subject_clusters([test[i] for i in q]),
                  details={"strongest": best, "attacker_rank1": mean_r1, "gallery": "other actions",
                           "n_subjects": len(set(subj[q]))})


# ---------------------------------------------------------------- gait

GAIT_FOLDS = 4
GAIT_ATTACKERS = ("cosine", "lda")


def gait_folds(subjects: np.ndarray, folds: int = GAIT_FOLDS) -> np.ndarray:
    """(n,) fold of each walk: the people dealt round-robin in the order of their id's hash (whole people, the same
    fold whatever the walks' order), at most one fold per two people."""
    people = sorted(set(subjects), key=lambda p: hashlib.sha256(str(p).encode()).hexdigest())
    k = max(1, min(folds, len(people) // 2))
    return np.array([people.index(p) % k for p in subjects])


def gait_retrieval(videos: Videos, folds: int = GAIT_FOLDS, **_) -> Scored:
    """Re-identify a person across walks (clothes, hat and scene change between walks; body and gait do not). The
    people are split into `folds`; each fold's walks are embedded with statistics (cosine: standardised video means)
    and a shrinkage LDA (lda) fitted on the OTHER folds' people, a metric learned on people never queried as
    re-identification learns on its training subjects, and each walk queries the other walks of its fold. top1 per
    attacker and the strongest's; walks whose person has no other walk in the fold are not scored. Deterministic
    (one 'seed'); the bootstrap resamples people. Chance: the share of the same person's walks in each gallery.
    (Nearest neighbour on standardised means alone read the demo store's walks at chance.)"""
    subjects = np.array([str(v.meta.get("subject_id")) for v in videos], dtype=object)
    fold = gait_folds(subjects, folds)
    n = len(videos)
    hits = {a: np.zeros(n) for a in GAIT_ATTACKERS}
    ran = set(GAIT_ATTACKERS)                                 # an attacker counts only if it ran in every fold
    chance = np.zeros(n)
    scorable = np.zeros(n, bool)
    for f in np.unique(fold):
        te, tr = np.flatnonzero(fold == f), np.flatnonzero(fold != f)
        same = (subjects[te][:, None] == subjects[te][None]) & ~np.eye(len(te), dtype=bool)
        scorable[te] = same.any(1)
        chance[te] = same.sum(1) / max(len(te) - 1, 1)
        # re-identification's embeddings, learned on the other folds' people (one fold: the statistics of the walks
        # themselves, and no LDA, which would be fitted on the people it queries)
        emb = reid_embeddings([videos[i] for i in (tr if len(tr) else te)], [videos[i] for i in te])
        if not len(tr):
            emb.pop("lda", None)
        ran &= set(emb)
        for name, e in emb.items():
            sim = e @ e.T
            np.fill_diagonal(sim, -np.inf)
            hits[name][te] = same[np.arange(len(te)), sim.argmax(1)]
    q = np.flatnonzero(scorable)
    assert len(q) >= 2, "gait_retrieval: needs >= 2 walks whose person walks again in the same fold"
    ran = [a for a in GAIT_ATTACKERS if a in ran]
    mean = {a: float(hits[a][q].mean()) for a in ran}
    best = max(ran, key=lambda a: (mean[a], -GAIT_ATTACKERS.index(a)))

    def of(name):
        return lambda s, idx: float(hits[name][q][_sel(len(q), idx)].mean())

    metrics = {"top1": of(best), **{f"top1[{a}]": of(a) for a in ran}}
    c = float(chance[q].mean())
    return Scored("gait", metrics, {m: c for m in metrics}, 1, len(q), [videos[i].video_id for i in q],
                  same_outputs=True, clusters=subject_clusters([videos[i] for i in q]),
                  details={"strongest": best, "attacker_top1": mean, "folds": int(len(np.unique(fold)))})


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
    from splavu_core.tasks.heads import nms_1d

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
    std = Standardiser(all_clips(train))
    x = torch.from_numpy(np.concatenate([_context(std(v.feats), context) for v in train]))
    y = torch.from_numpy(np.concatenate([clip_classes(v, classes) for v in train]))
    w = torch.ones(len(y), dtype=torch.float64)
    xt = [torch.from_numpy(_context(std(v.feats), context)).to(torch.float64) for v in test]
    gts = [[tuple(seg) for seg in v.meta.get("segments") or []] for v in test]
    W, b = fit_logistic(x, y, w, len(classes) + 1, l2, list(seeds)[0])  # convex: one optimum stands for every seed
    ps = [torch.softmax(a @ W + b, -1).numpy() for a in xt]
    one = [[(a, e, classes[c], sc) for a, e, c, sc in sorted(
        (d for c in range(len(classes))
         for d in _runs_to_detections(p[:, c], np.asarray(v.clip_start_s), np.asarray(v.clip_end_s), c)),
        key=lambda d: -d[3])] for p, v in zip(ps, test)]
    dets = [one] * len(seeds)
    return tad_scored(dets, gts, test, tious)
