"""The evaluation protocols (DESIGN.md section 4) on lists of VideoFeatures.

Every probe trains a FRESH, seeded head on exactly the features it is given (raw or anonymized: it cannot
tell), on the CPU, and returns a dict of metrics. Features are standardised with train statistics inside
each probe, so a change of scale can neither help nor pass for privacy. `test=None` means: split `train`
by v.split into 'train' and 'test'.
"""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

from ..features import VideoFeatures, split_of
from ..heads import (ADHead, ARHead, TADHead, ad_mil_loss, ad_segments, pad_sequences, stack_tad_targets,
                     tad_decode, tad_loss, tad_targets)
from .metrics import TIOUS, chance_cmap, cmap, frame_auc, macro_f1, tad_map

Videos = Sequence[VideoFeatures]


# ---------------------------------------------------------------- shared helpers

def _resolve(train: Videos, test: Videos | None) -> tuple[Videos, Videos]:
    if test is None:
        train, test = split_of(list(train), "train"), split_of(list(train), "test")
    assert len(train) and len(test), f"need train and test videos, got {len(train)} / {len(test)}"
    dims = {v.dim for v in list(train) + list(test)}
    assert len(dims) == 1, f"all videos must share one feature width, got {sorted(dims)}"
    return train, test


class Standardiser:
    """Per-dimension (x - mean) / std with statistics from training clips (float64 so tiny scales survive)."""

    def __init__(self, x: np.ndarray):
        x = np.asarray(x, np.float64)                             # (N, D)
        self.mean = x.mean(axis=0)
        std = x.std(axis=0)
        self.std = np.where(std > 0, std, 1.0)                    # constant dims stay constant, not inf

    def __call__(self, x: np.ndarray) -> np.ndarray:
        return ((np.asarray(x, np.float64) - self.mean) / self.std).astype(np.float32)


def _identity(x: np.ndarray) -> np.ndarray:
    return np.asarray(x, np.float32)


def _all_clips(videos: Videos) -> np.ndarray:
    return np.concatenate([v.feats for v in videos])              # (sum n_clips, D)


def _batches(n: int, batch_size: int, gen: torch.Generator):
    order = torch.randperm(n, generator=gen)
    return [order[i : i + batch_size] for i in range(0, n, batch_size)]


def _fresh(seed: int) -> torch.Generator:
    """Seed the head's init and return a generator for shuffling, so a probe is reproducible."""
    torch.manual_seed(seed)
    return torch.Generator().manual_seed(seed)


def eval_clip_indices(n_clips: int, k: int = 5) -> np.ndarray:
    """k evenly spaced clip indices (fewer, unique, when the video is shorter)."""
    return np.unique(np.linspace(0, n_clips - 1, k).round().astype(int))


# ---------------------------------------------------------------- AR

def action_recognition(train: Videos, test: Videos | None = None, classes: Sequence[str] | None = None,
                       epochs: int = 60, seed: int = 0, lr: float = 1e-2, l2: float = 0.1,
                       batch_size: int = 256, n_test_clips: int = 5) -> dict:
    """Linear probe, top-1 with softmax averaged over `n_test_clips` evenly spaced clips.

    Trains on all clips, each weighted 1/n_clips of its video so every video counts once, to (near)
    convergence of CE + l2/2 * ||W||^2. The explicit L2 replaces early stopping (no validation split here):
    with a few hundred videos of D=192 the unpenalised optimum overfits (measured on Gaussian blobs:
    top-1 0.36 at l2=0 vs 0.53 at l2=0.1, on par with sklearn's best-C logistic regression), and a
    converged objective does not depend on how many steps a small or large dataset gives.
    Returns {"top1", "classes", "video_ids", "pred", "true"} (pred/true: class names per test video).
    """
    train, test = _resolve(train, test)
    for v in list(train) + list(test):
        assert v.meta.get("action") is not None, f"{v.video_id}: no 'action' label"
    classes = list(classes) if classes is not None else sorted({v.meta["action"] for v in train})
    index = {c: i for i, c in enumerate(classes)}
    unknown = {v.meta["action"] for v in test} - set(index)
    assert not unknown, f"test actions {sorted(unknown)} are not among the classes {classes}"

    std = Standardiser(_all_clips(train))
    x = torch.from_numpy(std(_all_clips(train)))                                       # (N, D)
    y = torch.tensor([index[v.meta["action"]] for v in train for _ in range(len(v.feats))])
    w = torch.tensor([1.0 / len(v.feats) for v in train for _ in range(len(v.feats))])  # (N,)

    gen = _fresh(seed)
    head = ARHead(x.shape[1], len(classes))
    opt = torch.optim.Adam(head.parameters(), lr=lr)
    for _ in range(epochs):
        for idx in _batches(len(x), batch_size, gen):
            loss = (F.cross_entropy(head(x[idx]), y[idx], reduction="none") * w[idx]).sum() / w[idx].sum()
            loss = loss + 0.5 * l2 * head.fc.weight.pow(2).sum()
            opt.zero_grad()
            loss.backward()
            opt.step()

    head.eval()
    with torch.no_grad():
        probs = np.stack([_video_softmax(head, std(v.feats), n_test_clips) for v in test])  # (N_test, C)
    pred = [classes[i] for i in probs.argmax(1)]
    true = [v.meta["action"] for v in test]
    return {"top1": float(np.mean([p == t for p, t in zip(pred, true)])), "classes": classes,
            "video_ids": [v.video_id for v in test], "pred": pred, "true": true}


def top1_among(pred: Sequence, true: Sequence, classes: Sequence[str]) -> float | None:
    """Top-1 over the test videos whose true class is in `classes` (None when there are none)."""
    pred, true = np.asarray(pred, dtype=object), np.asarray(true, dtype=object)
    m = np.isin(true, list(classes))
    return float((pred[m] == true[m]).mean()) if m.any() else None


def _video_softmax(head: nn.Module, feats: np.ndarray, n_clips: int) -> np.ndarray:
    """Softmax averaged over n_clips evenly spaced clips of one video: (T, D) -> (C,)."""
    clips = torch.from_numpy(feats[eval_clip_indices(len(feats), n_clips)])        # (<= n_clips, D)
    return torch.softmax(head(clips), dim=-1).mean(0).numpy()


def bias(train: Videos, test: Videos | None = None, seed: int = 0, **ar_kwargs) -> dict:
    """AR probe, then accuracy per perceived-gender group (meta['group']) on test.

    Returns {"top1", "acc_<group>" for each group, "gap" = max - min group accuracy (|acc_f - acc_m|)}.
    """
    train, test = _resolve(train, test)
    ar = action_recognition(train, test, seed=seed, **ar_kwargs)
    groups = [v.meta.get("group") for v in test]
    assert None not in groups, "bias: every test video needs meta['group']"
    correct = np.array([p == t for p, t in zip(ar["pred"], ar["true"])])
    acc = {g: float(correct[[x == g for x in groups]].mean()) for g in sorted(set(groups))}
    assert len(acc) >= 2, f"bias: test set has a single group {list(acc)}"
    out = {"top1": ar["top1"], **{f"acc_{g}": a for g, a in acc.items()}}
    out["gap"] = float(max(acc.values()) - min(acc.values()))
    return out


# ---------------------------------------------------------------- privacy attack

def _attribute_labels(videos: Videos, attributes: Sequence[str]) -> np.ndarray:
    cols = [a if a.startswith("attr_") else f"attr_{a}" for a in attributes]
    y = np.array([[v.meta.get(c) for c in cols] for v in videos], dtype=object)        # (N, A)
    missing = [(v.video_id, c) for v, row in zip(videos, y) for c, val in zip(cols, row) if val is None]
    assert not missing, f"privacy_attack: missing attribute labels, e.g. {missing[:3]}"
    return y.astype(np.float32)


def _attack(train: Videos, test: Videos, y_train: np.ndarray, y_test: np.ndarray, transform, epochs: int,
            seed: int, lr: float, batch_size: int) -> dict:
    """One attacker run: fresh D->D->A MLP on all clips; best test cMAP over epochs (attacker's best case)."""
    x = torch.from_numpy(transform(_all_clips(train)))                                  # (N_clips, D)
    y = torch.from_numpy(np.repeat(y_train, [len(v.feats) for v in train], axis=0))     # (N_clips, A)
    x_test = torch.from_numpy(transform(_all_clips(test)))                                # (N_test_clips, D)
    starts = np.cumsum([0] + [len(v.feats) for v in test[:-1]])                         # first clip of each video
    n_clips = np.array([len(v.feats) for v in test])[:, None]
    D = x.shape[1]

    gen = _fresh(seed)
    mlp = nn.Sequential(nn.Linear(D, D), nn.ReLU(), nn.Linear(D, y.shape[1]))
    opt = torch.optim.AdamW(mlp.parameters(), lr=lr)
    best = {"cmap": -1.0, "f1": 0.0, "epoch": -1}
    for epoch in range(epochs):
        mlp.train()
        for idx in _batches(len(x), batch_size, gen):
            loss = F.binary_cross_entropy_with_logits(mlp(x[idx]), y[idx])
            opt.zero_grad()
            loss.backward()
            opt.step()
        mlp.eval()
        with torch.no_grad():  # a video's probability = mean over its clips (labels are per video)
            clip_probs = torch.sigmoid(mlp(x_test)).numpy()                             # (N_test_clips, A)
        probs = np.add.reduceat(clip_probs, starts, axis=0) / n_clips                   # (N_test, A)
        score = cmap(y_test, probs)
        if score > best["cmap"]:
            best = {"cmap": score, "f1": macro_f1(y_test, probs), "epoch": epoch}
    return best


def privacy_attack(train: Videos, test: Videos | None = None, attributes: Sequence[str] = (), seed: int = 0,
                   epochs: int = 100, lr: float = 1e-3, batch_size: int = 1024) -> dict:
    """Fresh MLP attacker predicting private attributes, on the features as given and standardised.

    Returns {"cmap", "f1" (of the stronger branch), "chance_cmap", "branch" ('raw' | 'standardised'),
    "raw": {"cmap", "f1", "epoch"}, "standardised": {...}}.
    """
    train, test = _resolve(train, test)
    assert len(attributes), "privacy_attack: no attributes given"
    y_train, y_test = _attribute_labels(train, attributes), _attribute_labels(test, attributes)
    std = Standardiser(_all_clips(train))
    runs = {name: _attack(train, test, y_train, y_test, transform, epochs, seed, lr, batch_size)
            for name, transform in (("raw", _identity), ("standardised", std))}
    branch = max(runs, key=lambda k: runs[k]["cmap"])
    return {"cmap": runs[branch]["cmap"], "f1": runs[branch]["f1"], "chance_cmap": chance_cmap(y_test),
            "branch": branch, **runs}


def leakage_removed(raw_cmap: float, anon_cmap: float, chance: float) -> float:
    """Share of the above-chance leakage that anonymization removed: (raw - anon) / (raw - chance)."""
    if raw_cmap <= chance:
        raise ValueError(f"raw cMAP {raw_cmap:.4f} is not above chance {chance:.4f}: nothing leaks, nothing to remove")
    return float((raw_cmap - anon_cmap) / (raw_cmap - chance))


def relative_change(raw: float, new: float) -> float:
    """(new - raw) / raw, e.g. cMAP 70.47 -> 49.92 gives -0.29."""
    assert raw != 0, "relative_change: raw is 0"
    return float((new - raw) / raw)


# ---------------------------------------------------------------- TAD

def temporal_detection(train: Videos, test: Videos | None = None, classes: Sequence[str] = (), seed: int = 0,
                       epochs: int = 20, lr: float = 2e-3, weight_decay: float = 1e-4, batch_size: int = 32,
                       hidden: int = 64, tious: Sequence[float] = TIOUS) -> dict:
    """TADHead on per-video clip sequences; returns {"mAP", "mAP@0.3", ..., "mAP@0.7"} on test."""
    train, test = _resolve(train, test)
    classes = list(classes)
    assert classes, "temporal_detection: no classes given"
    std = Standardiser(_all_clips(train))
    seqs = [torch.from_numpy(std(v.feats)) for v in train]
    targets = [tad_targets(v, classes) for v in train]

    gen = _fresh(seed)
    head = TADHead(train[0].dim, len(classes), hidden=hidden)
    opt = torch.optim.AdamW(head.parameters(), lr=lr, weight_decay=weight_decay)
    for _ in range(epochs):
        for idx in _batches(len(seqs), batch_size, gen):
            x, mask = pad_sequences([seqs[i] for i in idx])                    # (B, T, D), (B, T)
            tgt = stack_tad_targets([targets[i] for i in idx], x.shape[1])
            loss = tad_loss(*head(x, mask), tgt, mask)
            opt.zero_grad()
            loss.backward()
            nn.utils.clip_grad_norm_(head.parameters(), 1.0)
            opt.step()

    head.eval()
    detections, ground_truth = {}, {}
    with torch.no_grad():
        for v in test:
            cls_logits, reg = head(torch.from_numpy(std(v.feats))[None])        # (1, T, C), (1, T, 2)
            dets = tad_decode(cls_logits[0], reg[0], v.clip_start_s, v.clip_end_s)
            detections[v.video_id] = [(s, e, classes[c], p) for s, e, c, p in dets]
            ground_truth[v.video_id] = [tuple(seg) for seg in v.meta.get("segments") or []]
            unknown = {seg[2] for seg in ground_truth[v.video_id]} - set(classes)
            assert not unknown, f"{v.video_id}: segment labels {sorted(unknown)} not in classes {classes}"
    return tad_map(detections, ground_truth, tious)


# ---------------------------------------------------------------- AD

def anomaly_detection(train: Videos, test: Videos | None = None, seed: int = 0, epochs: int = 50,
                      lr: float = 1e-3, weight_decay: float = 5e-4, batch_size: int = 64,
                      hidden: int = 128) -> dict:
    """Weakly supervised MIL head trained on video labels (meta['anomaly']) only; returns {"auc"} (frame level)."""
    train, test = _resolve(train, test)
    labels = [v.meta.get("anomaly") for v in train]
    assert None not in labels, "anomaly_detection: every train video needs meta['anomaly']"
    assert set(labels) == {0, 1}, f"anomaly_detection: train needs normal and anomalous videos, got {set(labels)}"
    std = Standardiser(_all_clips(train))
    segs = torch.from_numpy(np.stack([ad_segments(std(v.feats)) for v in train]))    # (N, 32, D)
    y = torch.tensor(labels, dtype=torch.float32)

    gen = _fresh(seed)
    head = ADHead(segs.shape[-1], hidden=hidden)
    opt = torch.optim.AdamW(head.parameters(), lr=lr, weight_decay=weight_decay)
    for _ in range(epochs):
        for idx in _batches(len(segs), batch_size, gen):
            loss = ad_mil_loss(head(segs[idx]), y[idx])
            opt.zero_grad()
            loss.backward()
            opt.step()

    head.eval()
    with torch.no_grad():  # test: score every clip, not the 32 segments
        scored = [(v, head(torch.from_numpy(std(v.feats))).numpy()) for v in test]
    return {"auc": frame_auc(scored)}


# ---------------------------------------------------------------- gait (temporal private attribute)

def gait_retrieval(videos: Videos) -> dict:
    """No training: does each video's nearest neighbour (mean clip feature, standardised over the set,
    L2-normalised, cosine) show the same meta['subject_id']? Returns {"top1"}."""
    assert len(videos) >= 2, "gait_retrieval needs at least two videos"
    subjects = np.array([v.meta.get("subject_id") for v in videos], dtype=object)
    assert not any(s is None for s in subjects), "gait_retrieval: every video needs meta['subject_id']"
    means = np.stack([v.feats.astype(np.float64).mean(0) for v in videos])              # (N, D)
    z = Standardiser(means)(means).astype(np.float64)
    z /= np.maximum(np.linalg.norm(z, axis=1, keepdims=True), 1e-12)
    sim = z @ z.T                                                                        # (N, N) cosine
    np.fill_diagonal(sim, -np.inf)                                                       # never retrieve itself
    return {"top1": float((subjects[sim.argmax(1)] == subjects).mean())}
