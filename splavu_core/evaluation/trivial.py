"""Trivial baselines of the published width: what any projection to k columns removes by being narrow.

A method must beat these to be called an anonymizer. Both are label-free and fitted on the raw TRAINING clips of
the datasets the adapter trains on (AR / TAD / AD), so they see what the adapter sees and nothing private:

    pca_<k>         the top-k principal directions of those clips, z = Qᵀ(x − μ)
    randproj_<k>    a random orthonormal k-frame (seed 0), z = Rᵀ(x − μ)
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from splavu_core.evaluation.scoring import apply_features
from splavu_core.tasks.features import VideoFeatures

TRAINING_TASKS = ("ar", "tad", "ad")
# what the report scores them on
SCORED_TASKS = ("privacy", "clip_privacy", "reid", "ar", "tad", "ad", "bias_f", "bias_m", "gait")


def names(width: int) -> list[str]:
    return [f"pca_{width}", f"randproj_{width}"]


def fit(train_clips: np.ndarray, width: int, seed: int = 0) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """name -> (μ (D,), basis (D, k)) of each trivial baseline, from (N, D) training clips."""
    x = np.asarray(train_clips, np.float64)
    D = x.shape[1]
    assert 0 < width < D, f"trivial baselines: width {width} must be in 1..{D - 1}"
    mu = x.mean(0)
    _, _, vt = np.linalg.svd(x - mu, full_matrices=False)                   # (min(N, D), D)
    rand, _ = np.linalg.qr(np.random.default_rng(seed).standard_normal((D, width)))
    pca, rp = names(width)
    return {pca: (mu, vt[:width].T.copy()), rp: (mu, rand)}


def training_clips(raw: Mapping[str, Sequence[VideoFeatures]], datasets: Mapping[str, str]) -> np.ndarray:
    """The train-split clips of the datasets serving the adapter's training tasks (each dataset once)."""
    used = dict.fromkeys(datasets[t] for t in TRAINING_TASKS if datasets.get(t) in raw)
    clips = [v.feats for d in used for v in raw[d] if v.split == "train"]
    assert clips, f"trivial baselines: no train clips among the datasets of {TRAINING_TASKS}"
    return np.concatenate(clips)


def baseline_sets(raw: Mapping[str, Sequence[VideoFeatures]], train_clips: np.ndarray, width: int
                  ) -> dict[str, dict[str, list[VideoFeatures]]]:
    """name -> dataset -> videos: every raw set projected by each trivial baseline."""
    out = {}
    for name, (mu, q) in fit(train_clips, width).items():
        out[name] = {d: apply_features(v, lambda x, mu=mu, q=q: (np.asarray(x, np.float64) - mu) @ q)
                     for d, v in raw.items()}
    return out
