"""Metrics against sklearn and against hand-computed values."""
import numpy as np
import pytest
from sklearn.metrics import average_precision_score, f1_score, roc_auc_score

from splavu_core.evaluation import stats
from splavu_core.evaluation.suite import leakage_removed_or_none, relative_change_or_none
from splavu_core.tasks.features import VideoFeatures
from splavu_core.tasks.metrics import (
    chance_cmap,
    cmap,
    cmap_resamples,
    frame_auc,
    frame_labels,
    frame_scores,
    interpolated_ap,
    macro_f1,
    segment_iou,
    tad_map,
    top1,
)


def video(vid, n_clips, clip_s, n_frames, fps, **meta):
    starts = np.arange(n_clips) * clip_s
    return VideoFeatures(vid, "test", np.zeros((n_clips, 4), np.float32), starts, starts + clip_s, n_frames, fps, meta)


# ---------------------------------------------------------------- privacy metrics

@pytest.mark.parametrize("seed", [0, 1, 2])
def test_cmap_and_macro_f1_match_sklearn(seed):
    rng = np.random.default_rng(seed)
    y = (rng.random((200, 7)) < rng.uniform(0.1, 0.6, 7)).astype(int)
    s = np.clip(0.3 * y + rng.random((200, 7)), 0, 1)    # clipping makes ties at 1.0
    assert cmap(y, s) == pytest.approx(average_precision_score(y, s, average="macro"), abs=1e-12)
    coarse = np.round(s, 1)                               # heavy ties: AP groups tied scores into one threshold
    assert cmap(y, coarse) == pytest.approx(average_precision_score(y, coarse, average="macro"), abs=1e-12)
    assert macro_f1(y, s) == pytest.approx(f1_score(y, (s >= 0.5).astype(int), average="macro"), abs=1e-12)
    assert macro_f1(y, s, threshold=0.8) == pytest.approx(f1_score(y, (s >= 0.8).astype(int), average="macro"))


def test_cmap_rejects_single_class_column_by_index():
    y = np.array([[0, 1, 1], [1, 1, 0], [0, 1, 1]])
    with pytest.raises(ValueError, match="column 1"):
        cmap(y, np.random.default_rng(0).random(y.shape))


def test_cmap_of_every_resample_at_once_equals_one_call_per_resample():
    """The bootstrap's fast path (rows ranked once, resamples as weights): the per-resample cMAP up to rounding,
    NaN exactly where a resample leaves a column with one class (where cmap raises), ties included."""
    rng = np.random.default_rng(3)
    y = (rng.random((12, 4)) < 0.3).astype(int)
    y[0], y[1] = 1, 0
    s = np.round(rng.random((12, 4)), 1)
    idx = stats.bootstrap_indices(12, 300, seed=1)
    one_by_one = []
    for i in idx:
        try:
            one_by_one.append(cmap(y[i], s[i]))
        except ValueError:
            one_by_one.append(np.nan)
    fast = cmap_resamples(y, s, idx)
    assert np.isnan(fast).any() and not np.isnan(fast).all()  # the small set makes some resamples undefined
    np.testing.assert_allclose(fast, np.array(one_by_one), rtol=0, atol=1e-12)  # NaNs must match too


@pytest.mark.parametrize("same", [False, True])
def test_intervals_are_the_same_with_and_without_the_resample_fast_path(same):
    """paired and ratio intervals take the fast path only when both sides have it, and it changes nothing."""
    rng = np.random.default_rng(4)
    y = (rng.random((30, 3)) < 0.4).astype(int)
    y[0], y[1] = 1, 0
    outs = {k: [np.clip(0.4 * y + rng.random(y.shape), 0, 1) for _ in range(3)] for k in "ab"}

    def metric(k, fast):
        def f(s, idx):
            i = np.arange(30) if idx is None else idx
            return cmap(y[i], outs[k][s][i])
        return stats.with_resamples(f, lambda s, idx: cmap_resamples(y, outs[k][s], idx)) if fast else f

    for fast_a, fast_b in ((True, True), (False, True)):  # one slow side: the pair falls back to the loop
        a, b = metric("a", fast_a), metric("b", fast_b)
        slow_a, slow_b = metric("a", False), metric("b", False)
        assert stats.interval(b, 3, 30, same=same) == pytest.approx(stats.interval(slow_b, 3, 30, same=same), abs=1e-12)
        assert stats.paired(a, b, 3, 30, same=same) == \
            pytest.approx(stats.paired(slow_a, slow_b, 3, 30, same=same), abs=1e-12)
        assert stats.ratio_interval(a, b, 3, 30, offset=0.4, same=same) == \
            pytest.approx(stats.ratio_interval(slow_a, slow_b, 3, 30, offset=0.4, same=same), abs=1e-12)


def test_a_metric_scores_each_resample_set_once_across_its_intervals():
    """A reference set's resample scores enter its interval and every paired difference and ratio against it:
    computed once per seed, not once per interval."""
    rng = np.random.default_rng(5)
    y = (rng.random((30, 3)) < 0.4).astype(int)
    y[0], y[1] = 1, 0
    outs = {k: [np.clip(0.4 * y + rng.random(y.shape), 0, 1) for _ in range(3)] for k in "ab"}
    calls = {"a": 0, "b": 0}

    def metric(k):
        def counted(s, idx):
            calls[k] += 1
            return cmap_resamples(y, outs[k][s], idx)
        def f(s, idx):
            i = np.arange(30) if idx is None else idx
            return cmap(y[i], outs[k][s][i])
        return stats.with_resamples(f, counted)

    a, b = metric("a"), metric("b")
    first = stats.paired(a, b, 3, 30)
    stats.interval(a, 3, 30), stats.ratio_interval(a, b, 3, 30, offset=0.4)
    assert calls == {"a": 3, "b": 3}
    assert stats.paired(a, b, 3, 30) == first  # remembered scores give the same interval
    calls_other_boot = dict(calls)
    stats.interval(a, 3, 30, boot_seed=1)      # other resamples: scored anew
    assert calls["a"] == calls_other_boot["a"] + 3


def test_chance_cmap_is_mean_prevalence_and_matches_random_scores():
    rng = np.random.default_rng(1)
    y = (rng.random((4000, 3)) < [0.1, 0.3, 0.5]).astype(int)
    assert chance_cmap(y) == pytest.approx(y.mean(0).mean())
    assert cmap(y, rng.random(y.shape)) == pytest.approx(chance_cmap(y), abs=0.02)  # random scorer ~ chance


def test_top1():
    probs = np.array([[0.1, 0.9], [0.8, 0.2], [0.3, 0.7]])
    assert top1(probs, np.array([1, 0, 0])) == pytest.approx(2 / 3)


def test_leakage_helpers():
    assert leakage_removed_or_none(0.8, 0.5, 0.4) == pytest.approx(0.75)
    assert relative_change_or_none(70.47, 49.92) == pytest.approx(-0.2916, abs=1e-4)
    assert leakage_removed_or_none(0.4, 0.4, 0.45) is None     # raw not above chance: nothing to remove, no share
    assert relative_change_or_none(0, 0.3) is None


# ---------------------------------------------------------------- frame AUC

def test_frame_scores_repeat_clips_and_extend_last_clip():
    # fps 2, clips of 2 frames: 4 clips cover frames 0..7; frames 8, 9 take the last clip's score.
    v = video("a", 4, 1.0, 10, 2.0, anomaly=1, anomaly_intervals=[[1.0, 2.5]])
    scores = np.array([0.1, 0.8, 0.6, 0.3])
    np.testing.assert_allclose(frame_scores(v, scores), [0.1, 0.1, 0.8, 0.8, 0.6, 0.6, 0.3, 0.3, 0.3, 0.3])
    np.testing.assert_array_equal(frame_labels(v), [0, 0, 1, 1, 1, 0, 0, 0, 0, 0])  # f / 2 in [1.0, 2.5)


def test_frame_auc_matches_sklearn_on_repeated_frames():
    a = video("a", 4, 1.0, 10, 2.0, anomaly=1, anomaly_intervals=[[1.0, 2.5]])
    b = video("b", 2, 1.0, 4, 2.0, anomaly=0, anomaly_intervals=None)
    got = frame_auc([(a, [0.1, 0.8, 0.6, 0.3]), (b, [0.2, 0.05])])
    y = [0, 0, 1, 1, 1, 0, 0, 0, 0, 0] + [0, 0, 0, 0]
    s = [0.1, 0.1, 0.8, 0.8, 0.6, 0.6, 0.3, 0.3, 0.3, 0.3] + [0.2, 0.2, 0.05, 0.05]
    assert got == pytest.approx(roc_auc_score(y, s))
    assert got != pytest.approx(roc_auc_score([0, 1, 0, 0, 0, 0], [0.1, 0.8, 0.6, 0.3, 0.2, 0.05]))  # not per clip


def test_frame_auc_refuses_degenerate_input():
    b = video("b", 2, 1.0, 4, 2.0, anomaly=0)
    with pytest.raises(ValueError, match="AUC is undefined"):
        frame_auc([(b, [0.2, 0.05])])
    with pytest.raises(ValueError, match="without anomaly_intervals"):
        frame_labels(video("c", 2, 1.0, 4, 2.0, anomaly=1))


# ---------------------------------------------------------------- TAD mAP

def test_segment_iou_and_interpolated_ap():
    np.testing.assert_allclose(segment_iou((0, 10), [[0, 10], [5, 15], [20, 30], [2, 4]]), [1, 1 / 3, 0, 0.2])
    # precision 1, .5, 2/3 at recall 1/2, 1/2, 1 -> envelope 1 then 2/3
    assert interpolated_ap(np.array([1, 0.5, 2 / 3]), np.array([0.5, 0.5, 1.0])) == pytest.approx(0.5 + 1 / 3)


def test_tad_map_hand_computed():
    gt = {"v1": [(0, 10, "A"), (20, 30, "A")], "v2": [(5, 15, "A"), (20, 30, "B")]}
    dets = {
        "v1": [(0, 10, "A", 0.9),      # TP at every tIoU
               (0, 10, "A", 0.8),      # duplicate of the matched GT: FP
               (20, 25, "A", 0.6),     # tIoU 0.5 with (20, 30): TP at 0.3-0.5, FP at 0.6/0.7
               (20, 30, "B", 0.95),    # B has no ground truth in v1: FP
               (0, 5, "C", 0.99)],     # class absent from ground truth: ignored
        "v2": [(5, 13, "A", 0.7),      # tIoU 0.8: TP everywhere
               (22, 30, "B", 0.5),     # tIoU 0.8: TP
               (10, 22, "B", 0.4)],    # tIoU 0.1: below every threshold, FP after the last TP
    }
    # Class A, tIoU <= 0.5: T F T T -> P 1, 1/2, 2/3, 3/4 at R 1/3, 1/3, 2/3, 1 -> AP = 1/3 + 1/3*.75 + 1/3*.75
    ap_a_low = 1 / 3 + 0.25 + 0.25
    # Class A, tIoU >= 0.6: T F T F -> AP = 1/3 * 1 + 1/3 * 2/3
    ap_a_high = 1 / 3 + 2 / 9
    ap_b = 0.5  # F T F: recall 1 reached at precision 1/2
    out = tad_map(dets, gt)
    for t in (0.3, 0.4, 0.5):
        assert out[f"mAP@{t:g}"] == pytest.approx((ap_a_low + ap_b) / 2)
    for t in (0.6, 0.7):
        assert out[f"mAP@{t:g}"] == pytest.approx((ap_a_high + ap_b) / 2)
    assert out["mAP"] == pytest.approx((3 * (ap_a_low + ap_b) / 2 + 2 * (ap_a_high + ap_b) / 2) / 5)


def test_tad_map_matches_highest_tiou_unmatched_gt_and_counts_missed_classes():
    gt = {"v": [(0, 10, 0), (3, 13, 0), (30, 40, 1)]}
    # The first detection clears 0.5 with both GTs (0.67, 0.82): it must take (3, 13), leaving (0, 10) to the
    # second (tIoU 0.9; only 0.46 with (3, 13), so a first-come match would make it a FP).
    dets = {"v": [(2, 12, 0, 0.9), (0, 9, 0, 0.8)]}
    out = tad_map(dets, gt, tious=(0.5,))
    assert out["mAP"] == pytest.approx((1.0 + 0.0) / 2)  # class 0 perfect, class 1 never detected -> AP 0
    with pytest.raises(ValueError, match="no segments"):
        tad_map(dets, {"v": []})


def test_frame_auc_of_every_resample_at_once_equals_one_call_per_resample():
    from splavu_core.evaluation import protocols as P
    from splavu_core.evaluation.stats import bootstrap_indices

    rng = np.random.default_rng(0)
    fl = [(rng.random(int(rng.integers(5, 30))) < p).astype(int) for p in rng.random(12) * 0.6]
    fl[0][:] = 0  # a video without anomalous frames, and tied scores below
    sc = [np.round(rng.normal(size=len(f)) + f, 1) for f in fl]
    idx = bootstrap_indices(len(fl), 300, seed=1)
    fast = P.auc_resamples(np.concatenate(fl), np.concatenate(sc), np.repeat(np.arange(len(fl)), [len(f) for f in fl]),
                           idx)
    for row, got in zip(idx, fast):
        y, s = np.concatenate([fl[j] for j in row]), np.concatenate([sc[j] for j in row])
        want = P._auc(y, s) if 0 < y.sum() < len(y) else np.nan
        assert (np.isnan(want) and np.isnan(got)) or abs(want - got) < 1e-12


def test_tad_map_of_every_resample_at_once_equals_one_call_per_resample():
    from splavu_core.evaluation.stats import bootstrap_indices
    from splavu_core.tasks.metrics import tad_map, tad_map_resamples, tad_tables

    rng = np.random.default_rng(0)
    gts, dets = [], []
    for j in range(15):
        g = [(float(a), float(a + rng.uniform(2, 6)), f"c{rng.integers(3)}") for a in rng.uniform(0, 40, rng.integers(0, 4))]
        d = [(a + rng.normal(0, 1), b + rng.normal(0, 1), lab, float(rng.random())) for a, b, lab in g]
        d += [(float(a), float(a + 3), f"c{rng.integers(3)}", float(rng.random())) for a in rng.uniform(0, 40, 3)]
        gts.append(g)
        dets.append(d)
    gts[0] = [(1.0, 5.0, "c0")]
    idx = bootstrap_indices(15, 60, seed=2)
    fast = tad_map_resamples(tad_tables(dets, gts), idx, 5)
    for row, got in zip(idx, fast):
        if not any(gts[j] for j in row):
            continue
        want = tad_map({k: dets[j] for k, j in enumerate(row)}, {k: gts[j] for k, j in enumerate(row)})
        np.testing.assert_allclose(got, [want["mAP"]] + [want[f"mAP@{t:g}"] for t in (.3, .4, .5, .6, .7)], atol=1e-12)


@pytest.mark.parametrize("people", [False, True])
def test_ar_top1_of_every_resample_at_once_equals_one_call_per_resample(people):
    """ar_scored's fast path (resample counts) gives exactly the per-resample top-1 and per-class top-1, NaN where a
    resample draws no video of the class, over video and over people resamples."""
    from splavu_core.evaluation import protocols as P
    from splavu_core.evaluation.stats import bootstrap_indices

    rng = np.random.default_rng(2)
    classes = ["a", "b", "c", "rare"]
    n = 40
    acts = ["rare" if i == 0 else classes[int(rng.integers(0, 3))] for i in range(n)]   # one video of 'rare'
    test = [VideoFeatures(f"v{i}", "test", np.zeros((1, 2), np.float32), np.zeros(1), np.ones(1), 1, 1.0,
                          {"action": a, "subject_id": f"p{i // 3}" if people else None}) for i, a in enumerate(acts)]
    probs = rng.random((3, n, len(classes)))
    sc = P.ar_scored(probs, test, classes)
    idx = bootstrap_indices(n, 150, seed=4, clusters=sc.clusters)
    assert (sc.clusters is not None) == people
    for name, fn in sc.metrics.items():
        for s in range(3):
            fast = fn.resamples(s, idx)
            slow = np.array([fn(s, np.asarray(i)) for i in idx])
            np.testing.assert_array_equal(fast, slow, err_msg=name)
    assert np.isnan(sc.metrics["class_top1[rare]"].resamples(0, idx)).any()


def test_gait_retrieval_learns_its_metric_on_people_it_never_queries():
    """Walks of one person share a weak gait signature in a few dimensions; clothes change every walk and swamp it.
    Nearest neighbour on the raw means reads little; the LDA fitted on the other folds' people finds the signature.
    Folds hold whole people, and a person in one fold is never among the people its metric was fitted on."""
    from splavu_core.evaluation import protocols as P

    rng = np.random.default_rng(5)
    people, walks, d = 24, 4, 32
    vids = []
    for p in range(people):
        gait = np.zeros(d)
        gait[:4] = rng.normal(0, 1.0, 4)                               # the person's signature
        for w in range(walks):
            clothes = rng.normal(0, 4.0, d)
            clothes[:4] = 0.0
            feats = (gait + clothes + rng.normal(0, 0.3, (2, d))).astype(np.float32)
            vids.append(VideoFeatures(f"p{p}_w{w}", "test", feats, np.zeros(2), np.ones(2), 2, 1.0,
                                      {"subject_id": f"person_{p}", "action": "walk_left"}))
    sc = P.gait_retrieval(vids)
    fold = P.gait_folds(np.array([v.meta["subject_id"] for v in vids], dtype=object))
    assert len(set(fold)) == 4 and all(len({fold[i] for i in range(len(vids)) if vids[i].meta["subject_id"] == s}) == 1
                                       for s in {v.meta["subject_id"] for v in vids})
    chance = sc.chance["top1"]
    assert chance == pytest.approx(3 / 23)                             # 6 people x 4 walks per fold
    lda, cos = sc.metrics["top1[lda]"](0, None), sc.metrics["top1[cosine]"](0, None)
    assert sc.details["strongest"] == "lda" and lda > 0.8 and cos < 0.5 and sc.metrics["top1"](0, None) == lda
    # one walk per person: nothing to retrieve, said so rather than scored
    with pytest.raises(AssertionError, match="walks again"):
        P.gait_retrieval([v for v in vids if v.video_id.endswith("_w0")])
