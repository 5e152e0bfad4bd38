"""Do the 95% intervals of evaluation/stats.py cover the truth 95% of the time, at the demo's and the gates' sizes?

Many small simulated worlds, each with a KNOWN true value, are scored through the real interval code
(stats.interval / stats.ratio_interval with the fast resample paths the protocols use: counts-weighted means for
top-1, metrics.cmap_resamples for the cMAP) and the share of worlds whose interval holds the truth is counted.
Every world has a per-person random effect: one person's videos share it, as one actor's videos share their looks
in the synthetic benchmark (and in real data), so videos of one person are not independent draws.

    ar_val      AR top-1 and the utility gate's retention, (anon − chance) / (raw − chance): 450 validation
                videos of 40 people (the demo's AR val split: 150 + 300 extra videos, 20 + 20 actors), chance 1/15
    clips_val   the privacy gate's clip part, leakage removed = (raw − anon) / (raw − chance) of the cMAP, on the
                same 450 videos of 40 people; the attributes belong to the person, so do most of the attacker's
                score
    closeups    the privacy gate's close-up part: one video per person (the close-up set draws a new actor for
                every video), 120 carved validation videos

`python tests/test_interval_coverage.py --worlds 2000` prints each scenario's coverage, its Monte-Carlo error and
the share of truths below and above the interval, resampling people (the construction) and, for comparison, videos.
Measured with 2000 worlds (Monte-Carlo s.e. 0.4-0.5 points where people are resampled, about 1 point where videos
are): AR top-1 94.3% (videos: 79.7%), AR retention 94.2% (84.7%), clip cMAP 94.5% (48.7%), clip leakage removed
97.3% (57.2%; truth below the lower end 0.0%), close-up cMAP 93.7%, close-up leakage removed 95.2%. The previous
construction (videos resampled, symmetric, no small-sample factor) held 78.9%, 85.0%, 47.9%, 57.0%, 90.8% and 95.1%.
"""
from __future__ import annotations

import argparse
import time

import numpy as np
import pytest
from numpy.polynomial.hermite_e import hermegauss
from scipy.special import expit
from scipy.stats import norm

from splavu_core.evaluation import stats
from splavu_core.tasks.metrics import cmap, cmap_resamples, resample_counts

# ---------------------------------------------------------------- the worlds

# AR correctness: logit = A + person effect (sd SU) + video effect (sd SE); the anonymized features lose D on the
# logit scale and add a person effect of their own (sd SV). Raw top-1 about 0.69, anonymized about 0.67.
AR = dict(A=1.2, SU=1.0, SE=1.0, D=0.1, SV=0.3, chance=1 / 15)
# attacker scores: signal BETA * (2y - 1) with y the person's attribute, + person effect (sd SW) + video effect
# (sd SE); anonymized: signal BETA_ANON and a person effect of its own added (sd SW2). Raw cMAP about 0.85,
# anonymized about 0.62, so leakage removed about 0.65 (the demo's validation reads 0.6-0.85).
CLIPS = dict(PI=(0.5, 0.4), BETA=1.1, BETA_ANON=0.35, SW=1.0, SE=0.7, SW2=0.4)


def _gh_mean(loc: float, sd: float) -> float:
    """E[expit(loc + sd Z)], Z standard normal (Gauss-Hermite, exact to ~1e-12 here)."""
    x, w = hermegauss(80)
    return float((w * expit(loc + sd * x)).sum() / w.sum())


def ar_truth() -> dict:
    raw = _gh_mean(AR["A"], np.hypot(AR["SU"], AR["SE"]))
    anon = _gh_mean(AR["A"] - AR["D"], np.sqrt(AR["SU"] ** 2 + AR["SV"] ** 2 + AR["SE"] ** 2))
    c = AR["chance"]
    return {"top1": raw, "retention": (anon - c) / (raw - c)}


def _population_ap(pi: float, beta: float, sd: float) -> float:
    """AP of a scorer whose score is N(+beta, sd^2) on positives and N(-beta, sd^2) on negatives, prevalence pi, over
    an infinite population: the integral over positives of the precision at their score."""
    s = np.linspace(-beta - 12 * sd, beta + 12 * sd, 200_001)
    tp, fp = pi * norm.sf(s, beta, sd), (1 - pi) * norm.sf(s, -beta, sd)
    prec = np.where(tp + fp > 0, tp / np.maximum(tp + fp, 1e-300), 1.0)
    return float(np.trapezoid(prec * norm.pdf(s, beta, sd), s))


def clips_truth() -> dict:
    pi = np.array(CLIPS["PI"])
    sd_raw = np.hypot(CLIPS["SW"], CLIPS["SE"])
    sd_anon = np.sqrt(CLIPS["SW"] ** 2 + CLIPS["SW2"] ** 2 + CLIPS["SE"] ** 2)
    raw = np.mean([_population_ap(p, CLIPS["BETA"], sd_raw) for p in pi])
    anon = np.mean([_population_ap(p, CLIPS["BETA_ANON"], sd_anon) for p in pi])
    return {"cmap": float(raw), "leakage_removed": float((raw - anon) / (raw - pi.mean()))}


def _people(rng, n: int, g: int) -> np.ndarray:
    """The person of each of n videos: every person at least once, the rest drawn at random (as the synthetic
    benchmark draws an actor from its pool for every video); g == n: one video per person."""
    if g >= n:
        return np.arange(n)
    return rng.permutation(np.r_[np.arange(g), rng.integers(0, g, n - g)])


def _mean_metric(x: np.ndarray):
    """A per-video 0/1 outcome's mean as the protocols' metric(seed, idx), with the counts-weighted fast path."""
    n = len(x)

    def f(s, idx):
        return float(x[np.arange(n) if idx is None else idx].mean())

    def fast(s, idx):
        c = resample_counts(idx, n)
        return c @ x / c.sum(1)
    return stats.with_resamples(f, fast, remember=False)


def _cmap_metric(y: np.ndarray, scores: np.ndarray):
    """cMAP as protocols.privacy_attack builds it (metrics.cmap, metrics.cmap_resamples, remembered)."""
    n = len(y)

    def f(s, idx):
        i = np.arange(n) if idx is None else idx
        return cmap(y[i], scores[i])
    return stats.with_resamples(f, lambda s, idx: cmap_resamples(y, scores, idx))


def ar_world(rng, n: int, g: int, by_person: bool, n_boot: int = stats.N_BOOT) -> dict:
    """One AR world: the top-1 interval and the retention interval, each {ci_low, ci_high}."""
    person = _people(rng, n, g)
    u, v, e = rng.normal(0, AR["SU"], g), rng.normal(0, AR["SV"], g), rng.normal(0, AR["SE"], n)
    base = AR["A"] + u[person] + e
    draw = rng.random(n)                           # one draw per video for both sides: a hard video is hard for both
    raw = (draw < expit(base)).astype(np.float64)
    anon = (draw < expit(base - AR["D"] + v[person])).astype(np.float64)
    clusters = stats.cluster_codes(person) if by_person else None
    a, b = _mean_metric(raw), _mean_metric(anon)
    return {"top1": stats.interval(a, 1, n, n_boot, clusters=clusters, bounded=True),
            "retention": stats.ratio_interval(a, b, 1, n, offset=AR["chance"], n_boot=n_boot, clusters=clusters)}


def clips_world(rng, n: int, g: int, by_person: bool, n_boot: int = stats.N_BOOT) -> dict:
    """One privacy world: the raw cMAP interval and leakage removed's, as scoring.scored_rows builds it (1 − the
    paired ratio (anon − chance) / (raw − chance), chance the scored videos' mean prevalence)."""
    person = _people(rng, n, g)
    pi = np.array(CLIPS["PI"])
    while True:                                    # the protocol scores an attribute only when both classes occur
        y_person = (rng.random((g, len(pi))) < pi).astype(int)
        y = y_person[person]
        if (y.min(0) == 0).all() and (y.max(0) == 1).all():
            break
    sign = 2.0 * y - 1
    w, w2 = rng.normal(0, CLIPS["SW"], (g, len(pi))), rng.normal(0, CLIPS["SW2"], (g, len(pi)))
    e = rng.normal(0, CLIPS["SE"], (n, len(pi)))
    raw = CLIPS["BETA"] * sign + w[person] + e
    anon = CLIPS["BETA_ANON"] * sign + w[person] + w2[person] + e
    clusters = stats.cluster_codes(person) if by_person else None
    a, b = _cmap_metric(y, raw), _cmap_metric(y, anon)
    r = stats.ratio_interval(a, b, 1, n, offset=float(y.mean(0).mean()), n_boot=n_boot, clusters=clusters)
    return {"cmap": stats.interval(a, 1, n, n_boot, clusters=clusters, bounded=True),
            "leakage_removed": {"ci_low": 1 - r["ci_high"], "ci_high": 1 - r["ci_low"]}}


SCENARIOS = {  # name: (world, truth, videos, people)
    "ar_val": (ar_world, ar_truth, 450, 40),
    "clips_val": (clips_world, clips_truth, 450, 40),
    "closeups_val": (clips_world, clips_truth, 120, 120),
}


def coverage(name: str, worlds: int, by_person: bool = True, seed: int = 0) -> dict:
    """metric -> {coverage: the share of `worlds` worlds whose interval holds the truth, se: its Monte-Carlo standard
    error, below / above: the share whose truth lies below ci_low / above ci_high, width: the mean width}."""
    world, truth_of, n, g = SCENARIOS[name]
    truth = truth_of()
    rng = np.random.default_rng([seed, n, g])
    rows: dict = {}
    for _ in range(worlds):
        for m, st in world(rng, n, g, by_person).items():
            rows.setdefault(m, []).append((truth[m] < st["ci_low"], truth[m] > st["ci_high"],
                                           st["ci_high"] - st["ci_low"]))
    out = {}
    for m, r in rows.items():
        below, above, width = np.array(r, np.float64).T
        p = 1 - below.mean() - above.mean()
        out[m] = {"coverage": p, "se": float(np.sqrt(p * (1 - p) / worlds)), "below": below.mean(),
                  "above": above.mean(), "width": width.mean()}
    return out


# ---------------------------------------------------------------- the tests

def test_the_worlds_truths_are_what_the_comments_say():
    """The simulated worlds sit where the demo's figures sit (so the coverage is measured where it matters)."""
    t = ar_truth()
    assert 0.65 < t["top1"] < 0.72 and 0.9 < t["retention"] < 1.0
    c = clips_truth()
    assert 0.8 < c["cmap"] < 0.9 and 0.55 < c["leakage_removed"] < 0.8
    # the population AP is the AP of a large sample
    rng = np.random.default_rng(0)
    y = (rng.random(400_000) < 0.4).astype(int)
    s = 1.1 * (2 * y - 1) + rng.normal(0, 1.3, len(y))
    assert cmap(y[:, None], s[:, None]) == pytest.approx(_population_ap(0.4, 1.1, 1.3), abs=3e-3)


# worlds per scenario: Monte-Carlo errors sqrt(0.95 * 0.05 / W) of 0.8, 1.1 and 0.5 points (the close-up cMAP holds the
# truth 93.7% of the time, near the band's lower end: more worlds there); seeds fixed, so the test is
# deterministic (about 13 s of CPU together, imports included)
WORLDS = {"ar_val": 800, "clips_val": 400, "closeups_val": 2000}


@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_95_intervals_cover_the_truth_95_percent_of_the_time(name):
    """93-97% of the worlds' 95% intervals hold the truth. One exception, on the safe side: leakage removed where
    people repeat (clips_val) holds it 97-98% of the time, because its estimate is biased low (a weak attacker's
    AP on few people sits above its population value) and the chance in its denominator, the scored videos' mean
    prevalence, stays fixed across resamples (resampling it too gave 90-92%, with 7-9% of the truths above the
    interval): there, the side the privacy gate reads (the truth below the lower end, a budget passed that should
    not be) must stay under 2.5%, and the interval no more than 1.5 points too cautious."""
    for m, c in coverage(name, WORLDS[name]).items():
        where = f"{name} {m}: the 95% interval held the truth in {c['coverage']:.1%} of {WORLDS[name]} worlds " \
                f"(Monte-Carlo error {c['se']:.1%}; truth below it {c['below']:.1%}, above it {c['above']:.1%})"
        if (name, m) == ("clips_val", "leakage_removed"):
            assert 0.93 <= c["coverage"] <= 0.985 and c["below"] <= 0.025, where
        else:
            assert 0.93 <= c["coverage"] <= 0.97, where


def test_resampling_videos_of_repeated_people_under_covers():
    """The reason the bootstrap resamples people: where one person holds several videos, resampling videos gives
    intervals too narrow to hold the truth 95% of the time (79% and 85% over 3000 worlds)."""
    cov = coverage("ar_val", 300, by_person=False, seed=1)
    assert cov["top1"]["coverage"] < 0.87 and cov["retention"]["coverage"] < 0.9


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--worlds", type=int, default=2000)
    ap.add_argument("--scenarios", nargs="+", default=sorted(SCENARIOS))
    args = ap.parse_args()
    for name in args.scenarios:
        for by_person in (False, True):
            t = time.perf_counter()
            for m, c in coverage(name, args.worlds, by_person).items():
                print(f"{name:13s} resampling {'people' if by_person else 'videos'}: {m:16s} coverage "
                      f"{c['coverage']:6.1%} ± {c['se']:.1%} (Monte-Carlo s.e.; truth below {c['below']:.1%}, above "
                      f"{c['above']:.1%}), mean width {c['width']:.3f}  [{args.worlds} worlds, "
                      f"{time.perf_counter() - t:.0f} s]", flush=True)


if __name__ == "__main__":
    main()
