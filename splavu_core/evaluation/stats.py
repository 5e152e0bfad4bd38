"""Intervals for evaluation metrics: spread over probe seeds, bootstrap over test videos, paired differences.

A probe trained with S seeds gives, for each seed s, outputs on the N test videos. A metric is a function of
(seed outputs, test video indices). `interval` computes

    value    mean over seeds of the metric on all test videos
    sd       standard deviation over seeds (ddof 1; 0 for one seed)
    ci_low / ci_high   95% interval of the seed mean: the bootstrap over test videos (the same B resamples for
             every seed, percentile half-width) combined in quadrature with the seed term 1.96 sd / sqrt(S)

`paired` does the same for anonymized − raw with the SAME seed and the SAME resampled videos on both sides,
so the shared sampling noise cancels. No torch, no dagster.
"""
from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence

import numpy as np

N_BOOT = 200
Z95 = 1.959963984540054


def bootstrap_indices(n: int, n_boot: int = N_BOOT, seed: int = 0) -> np.ndarray:
    """(n_boot, n) indices drawn with replacement (deterministic in seed)."""
    return np.random.default_rng(seed).integers(0, n, size=(n_boot, n))


def _combine(full: np.ndarray, boot: np.ndarray | None) -> dict:
    """full: (S,) metric per seed on all videos; boot: (S, B) per seed and resample, or None."""
    full = np.asarray(full, np.float64)
    S = len(full)
    mean = float(full.mean())
    sd = float(full.std(ddof=1)) if S > 1 else 0.0
    half_seed = Z95 * sd / np.sqrt(S)
    half_boot = 0.0
    if boot is not None and boot.size:
        b = np.asarray(boot, np.float64)
        ok = np.isfinite(b).all(axis=0)                        # resamples where every seed is defined
        bm = b[:, ok].mean(axis=0)                             # (B,) seed mean per resample
        if len(bm) > 1:
            lo, hi = np.percentile(bm, [2.5, 97.5])
            half_boot = float(hi - lo) / 2
    half = float(np.hypot(half_seed, half_boot))
    return {"value": mean, "sd": sd, "ci_low": mean - half, "ci_high": mean + half, "n_seeds": S}


def interval(metric: Callable[[int, np.ndarray | None], float], n_seeds: int, n_test: int | None,
             n_boot: int = N_BOOT, boot_seed: int = 0, same: bool = False) -> dict:
    """metric(seed_index, idx) -> float, idx = test video indices (None = all). n_test None: no bootstrap
    (the seeds alone carry the spread). same=True: every seed gave the same outputs, so the bootstrap is computed
    once (seed 0) and stands for all."""
    full = np.array([metric(s, None) for s in range(n_seeds)])
    boot = None
    if n_test:
        idx = bootstrap_indices(n_test, n_boot, boot_seed)
        b0 = _resamples(metric, 0, idx)
        boot = np.array([b0] + [b0 if same else _resamples(metric, s, idx) for s in range(1, n_seeds)])
    return _combine(full, boot)


def with_resamples(metric: Callable, resamples: Callable[[int, np.ndarray], np.ndarray],
                   remember: bool = True) -> Callable:
    """`metric` that also scores every resample at once: resamples(seed_index, idx (B, n)) -> (B,) floats, NaN
    where the metric is undefined, equal up to float rounding to [metric(seed_index, i) for i in idx] (the bootstrap's
    fast path). Remembered per seed and resample set (remember=False: not, for cheap arithmetic on metrics that are):
    a reference set's scores enter its own interval and every paired difference and ratio against it, with the same
    resamples each time."""
    if not remember:
        metric.resamples = resamples
        return metric
    memo: dict = {}

    def remembered(s: int, idx: np.ndarray) -> np.ndarray:
        key = (s, idx.shape, hashlib.blake2b(np.ascontiguousarray(idx).tobytes(), digest_size=16).digest())
        if key not in memo:
            memo[key] = np.asarray(resamples(s, idx), np.float64)
            memo[key].setflags(write=False)
        return memo[key]

    metric.resamples = remembered
    return metric


def _resamples(metric: Callable, s: int, idx: np.ndarray) -> np.ndarray:
    fast = getattr(metric, "resamples", None)
    if fast is not None:
        return np.asarray(fast(s, idx), np.float64)
    return np.array([_safe(metric, s, i) for i in idx], np.float64)


def _both_fast(a: Callable, b: Callable) -> bool:
    return getattr(a, "resamples", None) is not None and getattr(b, "resamples", None) is not None


def paired(metric_a: Callable, metric_b: Callable, n_seeds: int, n_test: int | None, n_boot: int = N_BOOT,
           boot_seed: int = 0, same: bool = False) -> dict:
    """Interval of metric_b − metric_a, paired by seed and by resample (e.g. a = raw, b = anonymized)."""
    def d(s, i):
        return metric_b(s, i) - metric_a(s, i)
    if _both_fast(metric_a, metric_b):
        with_resamples(d, lambda s, idx: metric_b.resamples(s, idx) - metric_a.resamples(s, idx), remember=False)
    return interval(d, n_seeds, n_test, n_boot, boot_seed, same)


def ratio_interval(metric_a: Callable, metric_b: Callable, n_seeds: int, n_test: int | None, offset: float = 0.0,
                   n_boot: int = N_BOOT, boot_seed: int = 0, same: bool = False) -> dict:
    """Interval of (b − offset) / (a − offset), paired (e.g. above-chance retention with offset = chance)."""
    def r(s, i):
        a = metric_a(s, i) - offset
        return (metric_b(s, i) - offset) / a if a > 0 else np.nan

    def r_resamples(s, idx):
        a = metric_a.resamples(s, idx) - offset
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.where(a > 0, (metric_b.resamples(s, idx) - offset) / a, np.nan)
    if _both_fast(metric_a, metric_b):
        with_resamples(r, r_resamples, remember=False)
    return interval(r, n_seeds, n_test, n_boot, boot_seed, same)


def _safe(metric: Callable, s: int, idx) -> float:
    try:
        return float(metric(s, idx))
    except ValueError:  # e.g. a resample with one class only: AUC/AP undefined there
        return np.nan


def above_chance(stat: dict, chance: float | None, higher_is_better: bool = True) -> bool:
    """Is the metric beyond chance by more than its interval? (True when no chance is defined.)"""
    if chance is None:
        return True
    return stat["ci_low"] > chance if higher_is_better else stat["ci_high"] < chance


def change_is_real(diff: dict) -> bool:
    """A paired difference whose interval excludes 0."""
    return diff["ci_low"] > 0 or diff["ci_high"] < 0


def summarise_values(values: Sequence[float]) -> dict:
    """Mean, sd and the seed-only interval of plain per-seed values (no bootstrap available)."""
    return _combine(np.asarray(values, np.float64), None)
