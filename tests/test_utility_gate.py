"""The utility gate sees a 10% loss: on a validation set sized like the demo's, a version that removes 10% of a seen
task's above-chance utility is refused, one that removes 2% passes. Judged by raw's strongest reader."""
import dataclasses

import numpy as np
import pytest

from splavu_core.evaluation import readers as R
from splavu_core.evaluation.gates import utility_measures
from splavu_core.evaluation.scoring import score_sets
from splavu_core.store import ledger
from splavu_core.tasks.features import VideoFeatures

N_CLASSES, DIM = 10, 24


def _world(seed: int = 0, per_class=(40, 60)) -> list[VideoFeatures]:
    """Action videos: clips around their class centre, Gaussian noise (a demo-sized validation set)."""
    rng = np.random.default_rng(seed)
    centres = rng.normal(size=(N_CLASSES, DIM)) * 1.2
    out = []
    for split, n in zip(("train", "val"), per_class):
        for c in range(N_CLASSES):
            for i in range(n):
                T = int(rng.integers(2, 4))
                feats = centres[c] + rng.normal(size=(T, DIM)) * 1.6
                out.append(VideoFeatures(f"{split}_{c}_{i}", split, feats.astype(np.float32), np.arange(T) * 1.0,
                                         np.arange(T) + 1.0, 16 * T, 16.0, {"action": f"a{c}"}))
    return out


def _swap(videos: list[VideoFeatures], share: float, seed: int = 1) -> list[VideoFeatures]:
    """A version that removes `share` of the above-chance utility: a hash-chosen `share` of the videos publish the
    features of a video of another class (the marginal distribution unchanged, that video's action gone)."""
    rng = np.random.default_rng(seed)
    by_class: dict = {}
    for v in videos:
        by_class.setdefault((v.split, v.meta["action"]), []).append(v)
    out = []
    for v in videos:
        if rng.random() < share:
            others = [a for (s, a) in by_class if s == v.split and a != v.meta["action"]]
            pool = by_class[(v.split, others[rng.integers(len(others))])]
            d = pool[rng.integers(len(pool))]
            v = dataclasses.replace(v, feats=d.feats.copy(), clip_start_s=d.clip_start_s, clip_end_s=d.clip_end_s,
                                    n_frames=d.n_frames)
        out.append(v)
    return out


@pytest.fixture(scope="module")
def scored():
    raw = _world()
    sets = {"raw": {"ar": raw}, "loss10": {"ar": _swap(raw, 0.10)}, "loss2": {"ar": _swap(raw, 0.02)}}
    return score_sets(sets, ["ar"], {"ar": "ar"}, split="val", seeds=list(range(5)))


def test_every_reader_of_the_suite_reads_and_raws_strongest_judges(scored):
    raw = scored.scored["ar"]["raw"]
    assert set(raw.details["reader_value"]) == set(R.NAMES["ar"])
    judge = raw.details["strongest"]
    assert raw.details["reader_value"][judge] == max(raw.details["reader_value"].values())
    for name in ("loss10", "loss2"):  # the anonymized side is read by raw's judge, whatever is strongest on it
        assert scored.scored["ar"][name].details["strongest"] == judge
    rows = {(r["feature_set"], r["metric"]): r for r in scored}
    assert rows[("raw", "top1")]["value"] == pytest.approx(rows[("raw", f"top1[{judge}]")]["value"])
    for reader in R.NAMES["ar"]:
        assert ("loss10", f"retention_top1[{reader}]") in rows


def test_the_utility_gate_refuses_a_10_percent_loss_and_passes_a_2_percent_one(scored):
    by = {name: utility_measures(scored, ["ar"], {"ar": "ar"}, name=name)["ar"] for name in ("loss10", "loss2")}
    for m in by.values():  # the set is sized so the interval can see the change
        assert m["retention_ci_high"] - m["retention_ci_low"] <= 0.14
    assert by["loss10"]["retention"] == pytest.approx(0.90, abs=0.05)
    assert by["loss2"]["retention"] == pytest.approx(0.98, abs=0.05)
    ok10, why10 = ledger.utility_verdict({"ar": by["loss10"]}, ledger.utility_fraction())
    ok2, why2 = ledger.utility_verdict({"ar": by["loss2"]}, ledger.utility_fraction())
    assert not ok10 and "lost beyond the noise" in why10
    assert ok2, why2
    assert by["loss10"]["reader"] in R.NAMES["ar"] and f"by {by['loss10']['reader']}" in why10


def test_a_wide_interval_cannot_refuse_what_it_cannot_see():
    m = {"raw": 0.5, "anon": 0.45, "chance": 0.1, "retention": 0.88, "retention_ci_low": 0.6,
         "retention_ci_high": 1.15, "anon_at_chance": False}
    assert ledger.utility_verdict({"ar": m}, 0.95)[0]             # the loss is within the noise: no verdict of loss
    assert not ledger.utility_verdict({"ar": {**m, "retention_ci_high": 0.99}}, 0.95)[0]
    assert ledger.retention_kept(float("nan"), float("nan"), 0.95)  # raw at chance: nothing to keep


def test_a_retention_interval_that_cannot_decide_is_called_undecidable_and_refuses_nothing():
    """The demo's AD on 40 validation videos read 2.407 [-0.025, 4.840] and the gate printed "kept": an interval
    that holds both the floor and 1 (or is wider than UTILITY_DECIDABLE_WIDTH) cannot tell a loss from none."""
    ad = {"retention": 2.407, "retention_ci_low": -0.025, "retention_ci_high": 4.840, "n_videos": 40, "reader": "mlp"}
    ar = {"retention": 1.018, "retention_ci_low": 0.957, "retention_ci_high": 1.079, "n_videos": 450}
    noisy = {"retention": 0.97, "retention_ci_low": 0.90, "retention_ci_high": 1.04, "n_videos": 450}
    assert ledger.retention_state(2.407, -0.025, 4.840, 0.95) == "undecidable"   # wider than the limit
    assert ledger.retention_state(0.97, 0.90, 1.04, 0.95) == "undecidable"       # holds the floor and 1
    assert ledger.retention_state(1.018, 0.957, 1.079, 0.95) == "kept"
    assert ledger.retention_state(0.87, 0.77, 0.97, 0.95) == "lost"
    ok, why = ledger.utility_verdict({"ad": ad, "ar": ar, "x": noisy}, 0.95)
    assert ok, why  # undecidable refuses nothing; the privacy gate is the one that fails closed
    assert why.startswith("ad: retention by mlp 2.407 [-0.025, 4.840] undecidable, does not refuse; about ")
    assert "ar: retention 1.018 [0.957, 1.079] kept" in why and "x: retention 0.970 [0.900, 1.040] undecidable" in why
    # x: half-width 0.07 must fall to the 0.02 between 0.97 and the floor: 450 * (0.07 / 0.02)^2 = 5513 videos
    assert "about 5063 more validation videos would decide it (on 450)" in why
    ok, why = ledger.utility_verdict({"ar": {**noisy, "retention": 0.90, "retention_ci_high": 0.98}}, 0.95)
    assert not ok and "lost beyond the noise" in why
