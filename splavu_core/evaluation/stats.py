"""Intervals for evaluation metrics: spread over probe seeds, bootstrap over test people, paired differences.

A probe trained with S seeds gives, for each seed s, outputs on the N test videos. A metric is a function of
(seed outputs, test video indices). `interval` computes

    value    mean over seeds of the metric on all test videos
    sd       standard deviation over seeds (ddof 1; 0 for one seed)
    ci_low / ci_high   95% interval of the seed mean: the bootstrap (the same B resamples for every seed; its
             2.5-97.5 percentile half-width, widened by small_sample_factor for the number of independent units)
             combined in quadrature with the seed term 1.96 sd / sqrt(S); for a metric in [0, 1] (bounded=True)
             on the logit scale, mapped back

The bootstrap resamples PEOPLE wherever one person holds several of the scored videos (clusters: the videos'
subject_id, protocols.subject_clusters), else videos: videos of one person are not independent draws, and
resampling them as if they were gave 95% intervals that held the truth 48-85% of the time where 40 people hold 450
videos (tests/test_interval_coverage.py, which measures the coverage of this construction at the demo's sizes).

`paired` does the same for anonymized − raw with the SAME seed and the SAME resamples on both sides, so the shared
sampling noise cancels. No torch, no dagster.
"""
from __future__ import annotations

import functools
import hashlib
from collections.abc import Callable, Sequence

import numpy as np

from splavu_core.tasks.metrics import resample_counts

N_BOOT = 200
Z95 = 1.959963984540054


class PeopleResamples(Sequence):
    """A bootstrap over people: n_boot index rows whose lengths differ (built when read: the slow path's), and
    `counts` (n_boot, n), how many times each unit is held (what the fast paths read: metrics.resample_counts)."""

    def __init__(self, counts: np.ndarray, drawn: np.ndarray, clusters: np.ndarray):
        self.counts, self.drawn, self.clusters = counts, drawn, clusters   # drawn (n_boot, G): each resample's people

    def __len__(self) -> int:
        return len(self.counts)

    def __getitem__(self, b):
        if isinstance(b, slice):
            return [self[i] for i in range(*b.indices(len(self)))]
        return np.repeat(np.arange(self.counts.shape[1]), self.counts[b])


def bootstrap_indices(n: int, n_boot: int = N_BOOT, seed: int = 0, clusters=None):
    """Resampled test-unit indices, deterministic in seed. clusters None (every unit independent): (n_boot, n) indices
    drawn with replacement. clusters (n,) ints, the person of each unit (`cluster_codes`): each resample draws as many
    WHOLE people as there are, with replacement, and holds every unit of each person drawn, as often as the person
    was drawn: a PeopleResamples (n_boot index arrays whose lengths differ)."""
    rng = np.random.default_rng(seed)
    if clusters is None:
        return rng.integers(0, n, size=(n_boot, n))
    clusters = np.unique(np.asarray(clusters), return_inverse=True)[1].reshape(-1)   # codes 0 .. G-1
    assert clusters.shape == (n,), f"clusters: {clusters.shape} for {n} units"
    n_people = int(clusters.max()) + 1
    drawn = rng.integers(0, n_people, size=(n_boot, n_people))
    per_person = resample_counts(drawn, n_people)                     # (B, G) times each person was drawn
    counts = per_person[:, clusters]                                  # (B, n) times each unit is held
    counts.setflags(write=False)
    return PeopleResamples(counts, drawn, clusters)


def cluster_codes(labels) -> np.ndarray | None:
    """(n,) person labels (subject_id; None = unknown, its own person) -> (n,) codes 0..G-1 for bootstrap_indices,
    or None when no person holds two units (the units are independent draws: resampling units is resampling
    people)."""
    labels = list(labels)
    keyed = [("unit", i) if x is None else ("person", str(x)) for i, x in enumerate(labels)]
    index: dict = {}
    codes = np.array([index.setdefault(k, len(index)) for k in keyed], dtype=np.int64)
    return codes if len(index) < len(labels) else None


def resample_key(idx) -> tuple:
    """A hashable key of a resample set (either form of bootstrap_indices)."""
    h = hashlib.blake2b(digest_size=16)
    if isinstance(idx, np.ndarray):
        h.update(np.ascontiguousarray(idx).tobytes())
        return ("array", idx.shape, h.digest())
    if isinstance(idx, PeopleResamples):                      # its rows follow from the people drawn
        h.update(np.ascontiguousarray(idx.drawn).tobytes())
        h.update(np.ascontiguousarray(idx.clusters, np.int64).tobytes())
        return ("people", idx.counts.shape, h.digest())
    for row in idx:
        row = np.ascontiguousarray(row, np.int64)
        h.update(len(row).to_bytes(8, "little"))
        h.update(row.tobytes())
    return ("rows", len(idx), h.digest())


@functools.lru_cache(maxsize=256)
def small_sample_factor(units: int) -> float:
    """How much wider than the plain bootstrap an interval over `units` independent units (people, or videos when
    no person repeats) must be: sqrt(G / (G − 1)) · t(0.975, G − 1) / z(0.975). The bootstrap's spread of a mean
    over G units is sqrt((G − 1) / G) of its standard error, and its width is itself estimated from G units (hence
    Student's t on G − 1 degrees of freedom): 1.045 for the 40 validation people of the demo's AR set, 1.003 for 450
    independent videos (tests/test_interval_coverage.py measured the coverage with and without it)."""
    if units < 2:
        return 1.0
    from scipy.stats import t

    return float(np.sqrt(units / (units - 1)) * t.ppf(0.975, units - 1) / Z95)


def _logit(p):
    return np.log(p) - np.log1p(-p)


def _expit(x: float) -> float:
    return float(1 / (1 + np.exp(-x)))


def _combine(full: np.ndarray, boot: np.ndarray | None, units: int = 0, bounded: bool = False) -> dict:
    """full: (S,) metric per seed on all videos; boot: (S, B) per seed and resample, or None; units: the independent
    units resampled (people or videos; small_sample_factor). bounded: a metric in [0, 1] (top-1, mAP, AUC, cMAP):
    the bootstrap half-width is taken on the logit scale and mapped back, so the interval narrows toward the
    bound it is near, as a proportion's does (on the symmetric scale, a strong attacker's cMAP, near 1, had its
    interval miss the truth above it 8% of the time and below it 0.7%: tests/test_interval_coverage.py)."""
    full = np.asarray(full, np.float64)
    S = len(full)
    mean = float(full.mean())
    sd = float(full.std(ddof=1)) if S > 1 else 0.0
    half_seed = Z95 * sd / np.sqrt(S)
    out = {"value": mean, "sd": sd, "n_seeds": S}
    bm = None
    if boot is not None and boot.size:
        b = np.asarray(boot, np.float64)
        ok = np.isfinite(b).all(axis=0)                        # resamples where every seed is defined
        bm = b[:, ok].mean(axis=0)                             # (B,) seed mean per resample
    if bm is None or len(bm) < 2:
        return {**out, "ci_low": mean - half_seed, "ci_high": mean + half_seed}
    factor = small_sample_factor(units) if units else 1.0
    if bounded and 0.0 < mean < 1.0:
        eps = min(mean, 1 - mean, 0.5 / max(units, 1))          # a resample at 0 or 1: half a unit from it
        lo, hi = np.percentile(_logit(np.clip(bm, eps, 1 - eps)), [2.5, 97.5])
        half = float(np.hypot(factor * (hi - lo) / 2, half_seed / (mean * (1 - mean))))  # seeds: delta method
        centre = float(_logit(mean))
        return {**out, "ci_low": _expit(centre - half), "ci_high": _expit(centre + half)}
    lo, hi = np.percentile(bm, [2.5, 97.5])
    half = float(np.hypot(half_seed, factor * float(hi - lo) / 2))
    return {**out, "ci_low": mean - half, "ci_high": mean + half}


def interval(metric: Callable[[int, np.ndarray | None], float], n_seeds: int, n_test: int | None,
             n_boot: int = N_BOOT, boot_seed: int = 0, same: bool = False, clusters=None,
             bounded: bool = False) -> dict:
    """metric(seed_index, idx) -> float, idx = test video indices (None = all). n_test None: no bootstrap
    (the seeds alone carry the spread). same=True: every seed gave the same outputs, so the bootstrap is computed
    once (seed 0) and stands for all. clusters: (n_test,) person codes (`cluster_codes`): the bootstrap resamples
    people, not videos (one person's videos are not independent draws). bounded: the metric lies in [0, 1]
    (_combine)."""
    full = np.array([metric(s, None) for s in range(n_seeds)])
    boot, units = None, 0
    if n_test:
        idx = bootstrap_indices(n_test, n_boot, boot_seed, clusters)
        b0 = _resamples(metric, 0, idx)
        boot = np.array([b0] + [b0 if same else _resamples(metric, s, idx) for s in range(1, n_seeds)])
        units = n_test if clusters is None else len(np.unique(clusters))
    return _combine(full, boot, units, bounded)


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
        key = (s, resample_key(idx))
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
           boot_seed: int = 0, same: bool = False, clusters=None) -> dict:
    """Interval of metric_b − metric_a, paired by seed and by resample (e.g. a = raw, b = anonymized)."""
    def d(s, i):
        return metric_b(s, i) - metric_a(s, i)
    if _both_fast(metric_a, metric_b):
        with_resamples(d, lambda s, idx: metric_b.resamples(s, idx) - metric_a.resamples(s, idx), remember=False)
    return interval(d, n_seeds, n_test, n_boot, boot_seed, same, clusters)


def ratio_interval(metric_a: Callable, metric_b: Callable, n_seeds: int, n_test: int | None,
                   offset: float | Callable = 0.0, n_boot: int = N_BOOT, boot_seed: int = 0, same: bool = False,
                   clusters=None) -> dict:
    """Interval of (b − offset) / (a − offset), paired (e.g. above-chance retention with offset = chance).
    offset: a number, or a metric of the scored videos (offset(seed_index, idx), e.g. the chance cMAP = their mean
    prevalence) recomputed on every resample as the two sides are."""
    off = offset if callable(offset) else (lambda s, i: offset)

    def r(s, i):
        o = off(s, i)
        a = metric_a(s, i) - o
        return (metric_b(s, i) - o) / a if a > 0 else np.nan

    def r_resamples(s, idx):
        o = offset.resamples(s, idx) if callable(offset) else offset
        a = metric_a.resamples(s, idx) - o
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.where(a > 0, (metric_b.resamples(s, idx) - o) / a, np.nan)
    if _both_fast(metric_a, metric_b) and (not callable(offset) or getattr(offset, "resamples", None) is not None):
        with_resamples(r, r_resamples, remember=False)
    return interval(r, n_seeds, n_test, n_boot, boot_seed, same, clusters)


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
