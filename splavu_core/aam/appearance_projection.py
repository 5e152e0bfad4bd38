"""Closed-form, label-free removal of the directions in which a video's *appearance* lives: the appearance projection.

Two static clips of one video share who and where (skin, clothes, face, scene) and nothing temporal.
So appearance is what varies *between* videos' static clips but not *within* a video's static clips:

    S_app  = covariance of the per-video mean static clip                    (between videos)
    S_keep = mean within-video covariance of static clips                    (pose, frame to frame)
             + w_action * between-class covariance of action clips           (what actions need)
             + w_temporal * mean within-video covariance of moving clips     (what changes over time:
                                                                              detection, anomalies)
             + ridge * tr(S_keep) / D * I

In the metric of S_keep (z = S_keep^{-1/2} (x - mu)) the top-k eigenvectors U of the whitened S_app are
the directions with the most appearance per unit of kept signal; removing them there and mapping back is
the oblique projection  e(x) = x - ((x - mu) R) L^T  with  R = S_keep^{-1/2} U,  L = S_keep^{1/2} U.
After it, no direction carries more than lambda_{k+1} units of between-video static variance per unit
of kept variance: a guarantee against linear read-outs, and the non-linear adapter trained after it is
kept from re-adding what was removed by the learned critic. Action labels are a utility signal (allowed);
private-attribute labels are never read.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np


@dataclass
class ProjectionFit:
    mean: np.ndarray        # (D,)
    read: np.ndarray        # (D, k)
    write: np.ndarray       # (D, k)
    eigenvalues: np.ndarray  # (D,) whitened appearance-to-kept ratios, descending


def _sym_power(m: np.ndarray, p: float) -> np.ndarray:
    w, v = np.linalg.eigh(m)
    return (v * np.clip(w, 1e-12, None) ** p) @ v.T


def fit_projection(static: np.ndarray, rank: int, action_clips: np.ndarray | None = None,
                   action_labels: Sequence | None = None, w_action: float = 1.0, ridge: float = 1e-3,
                   video_clips: Sequence[np.ndarray] = (), w_temporal: float = 0.0) -> ProjectionFit:
    """static: (V, K, D) static clips of training videos; action_clips (N, D) + labels (N,): optional;
    video_clips: each training video's moving clips (n_i, D), in order (videos with one clip add nothing)."""
    assert static.ndim == 3 and static.shape[1] >= 2, f"need (V, K>=2, D) static clips, got {static.shape}"
    V, K, D = static.shape
    assert 0 < rank < D, f"rank must be in (0, {D}), got {rank}"
    x = static.astype(np.float64)
    mu = x.reshape(-1, D).mean(0)
    means = x.mean(1)                                                   # (V, D)
    s_app = np.cov(means, rowvar=False)                                  # (D, D) between videos
    within = (x - means[:, None]).reshape(-1, D)
    s_keep = within.T @ within / max(1, len(within) - V)                 # (D, D) within videos
    if action_clips is not None and w_action > 0:
        a = np.asarray(action_clips, np.float64)
        labels = np.asarray(list(action_labels))
        centres = np.stack([a[labels == c].mean(0) for c in np.unique(labels)])  # (C, D)
        s_keep = s_keep + w_action * np.cov(centres, rowvar=False)
    multi = [np.asarray(c, np.float64) for c in video_clips if len(c) >= 2]
    if multi and w_temporal > 0:
        dev = np.concatenate([c - c.mean(0) for c in multi])
        s_keep = s_keep + w_temporal * dev.T @ dev / max(1, len(dev) - len(multi))
    s_keep = s_keep + ridge * np.trace(s_keep) / D * np.eye(D)
    inv_half, half = _sym_power(s_keep, -0.5), _sym_power(s_keep, 0.5)
    w, u = np.linalg.eigh(inv_half @ s_app @ inv_half)
    order = np.argsort(w)[::-1]
    u = u[:, order[:rank]]                                               # (D, k) orthonormal in z-space
    return ProjectionFit(mean=mu.astype(np.float32), read=(inv_half @ u).astype(np.float32),
                         write=(half @ u).astype(np.float32), eigenvalues=w[order])


def apply_projection(fit: ProjectionFit, x: np.ndarray) -> np.ndarray:
    return (x - ((x - fit.mean) @ fit.read) @ fit.write.T).astype(np.float32)
