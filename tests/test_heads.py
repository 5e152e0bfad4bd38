"""Heads, losses and the evaluation protocols on small synthetic features (CPU, seconds)."""
import dataclasses
import math

import numpy as np
import pytest
import torch

from splavu_core.evaluation.protocols import (
    action_recognition,
    anomaly_detection,
    bias,
    eval_clip_indices,
    gait_retrieval,
    privacy_attack,
    temporal_detection,
)
from splavu_core.tasks.features import VideoFeatures
from splavu_core.tasks.heads import (
    ADHead,
    ARHead,
    TADHead,
    ad_mil_loss,
    ad_segments,
    pad_sequences,
    sigmoid_focal_loss,
    stack_tad_targets,
    nms_1d,
    nms_1d_rows,
    tad_decode,
    tad_loss,
    tad_targets,
)

torch.set_num_threads(1)


def make_video(vid, feats, split="train", clip_s=1.0, fps=16.0, **meta):
    feats = np.asarray(feats, np.float32)
    starts = np.arange(len(feats)) * clip_s
    return VideoFeatures(vid, split, feats, starts, starts + clip_s, int(round(len(feats) * clip_s * fps)), fps, meta)


# ================================================================ TAD head

@pytest.mark.parametrize("clip_s", [1.0, 0.5])  # targets live in clip units, whatever the clip duration
@pytest.mark.parametrize("order", [1, -1])       # the shortest segment wins whichever comes first
def test_tad_targets_centre_sampling(clip_s, order):
    # Long segment B (clip units [0, 10], centre 5 -> radius region [3.5, 6.5]); short A ([2, 7], region [3, 6])
    # takes the clips both claim.
    segs = [[0.0, 10 * clip_s, "B"], [2 * clip_s, 7 * clip_s, "A"]][::order]
    v = make_video("v", np.zeros((10, 4)), clip_s=clip_s, segments=segs)
    t = tad_targets(v, ["A", "B"], radius=1.5)
    np.testing.assert_array_equal(np.flatnonzero(t["pos"]), [3, 4, 5, 6])   # clip centres 3.5 .. 6.5
    np.testing.assert_array_equal(t["cls"][3:6], [[1, 0]] * 3)
    np.testing.assert_array_equal(t["cls"][6], [0, 1])
    assert t["cls"][~t["pos"]].sum() == 0
    np.testing.assert_allclose(t["reg"][3], [1.5, 3.5])                       # centre 3.5 to A's [2, 7]
    np.testing.assert_allclose(t["reg"][6], [6.5, 3.5])                       # centre 6.5 to B's [0, 10]


def test_tad_targets_radius_limits_a_long_segment():
    v = make_video("v", np.zeros((12, 4)), segments=[[1.0, 12.0, "A"]])
    pos = tad_targets(v, ["A"], radius=1.5)["pos"]
    np.testing.assert_array_equal(np.flatnonzero(pos), [5, 6, 7])            # centres within 1.5 of 6.5
    with pytest.raises(AssertionError, match="not in classes"):
        tad_targets(v, ["B"])


def test_focal_loss_hand_computed():
    # logit 0 / target 1: 0.25 * log 2 * 0.5^2; logit 2 / target 0: 0.75 * log(1 + e^2) * sigmoid(2)^2
    got = sigmoid_focal_loss(torch.tensor([0.0, 2.0]), torch.tensor([1.0, 0.0]))
    p = 1 / (1 + math.exp(-2))
    expected = [0.25 * math.log(2) * 0.25, 0.75 * math.log(1 + math.e ** 2) * p ** 2]
    np.testing.assert_allclose(got.numpy(), expected, rtol=1e-6)
    np.testing.assert_allclose(got.numpy(), [0.0433217, 1.2375586], rtol=1e-6)


def _tad_batch(seed=0):
    rng = np.random.default_rng(seed)
    videos = [make_video(f"v{i}", rng.normal(size=(T, 8)), segments=[[1.0, 5.0, "A"], [6.0, 9.0, "B"]])
              for i, T in enumerate([10, 12, 9])]
    x, mask = pad_sequences([v.feats for v in videos])
    return videos, x, mask, stack_tad_targets([tad_targets(v, ["A", "B"]) for v in videos], x.shape[1])


def test_tad_loss_finite_and_decreases_in_one_step():
    torch.manual_seed(0)
    _, x, mask, tgt = _tad_batch()
    head = TADHead(8, 2, hidden=16)
    opt = torch.optim.SGD(head.parameters(), lr=0.05)
    before = tad_loss(*head(x, mask), tgt, mask)
    assert torch.isfinite(before) and before > 0
    before.backward()
    opt.step()
    after = tad_loss(*head(x, mask), tgt, mask)
    assert after < before


def test_tad_head_is_batch_invariant_and_seeded():
    _, x, mask, _ = _tad_batch()
    torch.manual_seed(3)
    head = TADHead(8, 2, hidden=16)
    torch.manual_seed(3)
    twin = TADHead(8, 2, hidden=16)
    cls_b, reg_b = head(x, mask)
    cls_1, reg_1 = twin(x[2:3, :9], mask[2:3, :9])  # video 2 (9 clips) alone, unpadded
    torch.testing.assert_close(cls_b[2, :9], cls_1[0])
    torch.testing.assert_close(reg_b[2, :9], reg_1[0])
    assert (reg_b >= 0).all()


def test_tad_decode_places_the_segment_and_suppresses_duplicates():
    T, C = 10, 2
    logits = torch.full((T, C), -8.0)
    logits[4, 1], logits[5, 1] = 5.0, 4.0             # two clips vote for the same class-1 segment
    reg = torch.ones(T, 2)
    reg[4] = torch.tensor([1.5, 1.5])                 # centre 4.5 -> clip units [3, 6]
    reg[5] = torch.tensor([2.5, 0.5])                 # centre 5.5 -> [3, 6] again: a duplicate
    starts = np.arange(T) * 0.5                       # 0.5 s clips: [3, 6] clip units = [1.5, 3.0] s
    dets = tad_decode(logits, reg, starts, starts + 0.5, nms="hard")
    assert len(dets) == 1                             # the duplicate is gone, scores < 1e-3 are dropped
    s, e, c, p = dets[0]
    assert (s, e, c) == pytest.approx((1.5, 3.0, 1)) and p == pytest.approx(1 / (1 + math.exp(-5)))
    soft = tad_decode(logits, reg, starts, starts + 0.5, nms="soft")
    assert len(soft) == 2 and soft[0][:3] == pytest.approx((1.5, 3.0, 1))
    assert soft[1][3] == pytest.approx(math.exp(-1 / 0.5) / (1 + math.exp(-4)), rel=1e-5)  # Gaussian decay, IoU 1


@pytest.mark.parametrize("method", ["soft", "hard"])
def test_nms_rows_stepped_together_equal_one_nms_per_row(method):
    """tad_decode runs every class of a video in one nms_1d_rows call: each row must come out exactly as its own
    NMS over its own candidates would (no row's step changes another's; ties go to the lowest index)."""
    rng = np.random.default_rng(3)
    for trial in range(60):
        n, r = int(rng.integers(1, 40)), int(rng.integers(1, 9))
        segs = np.sort(rng.uniform(0, 10, (n, 2)), 1)
        if trial % 4 == 0:
            segs[: n // 2] = segs[0]                       # duplicate segments: IoU 1
        scores = rng.uniform(0, 1, (r, n)).round(1 if trial % 3 == 0 else 6)   # coarse scores: ties
        alive = rng.uniform(size=(r, n)) < 0.7
        rows = nms_1d_rows(segs, scores, method, 0.5, 0.5, 1e-3, alive)
        for i, (idx, kept) in enumerate(rows):
            cand = np.flatnonzero(alive[i])
            if not len(cand):
                assert len(idx) == 0
                continue
            want_segs, want = nms_1d(segs[cand], scores[i, cand], method, 0.5, 0.5, 1e-3)
            np.testing.assert_array_equal(segs[idx], want_segs)
            np.testing.assert_array_equal(kept, want)
            assert len(set(idx)) == len(idx) and set(idx) <= set(cand)


# ================================================================ AD head

@pytest.mark.parametrize("T", [1, 3, 31, 32, 33, 100])
def test_ad_segments_always_32(T):
    feats = np.arange(T * 3, dtype=np.float32).reshape(T, 3)
    seg = ad_segments(feats)
    assert seg.shape == (32, 3)
    assert seg.min() >= feats.min() and seg.max() <= feats.max()  # averages of real clips only
    if T <= 32:  # repeated clips: every segment is one clip, and every clip appears
        assert {tuple(r) for r in seg} == {tuple(r) for r in feats}


def test_ad_segments_averages_and_keeps_gradients():
    feats = torch.randn(64, 5, requires_grad=True)
    seg = ad_segments(feats)
    torch.testing.assert_close(seg[3], feats[6:8].mean(0))
    seg.sum().backward()
    assert feats.grad is not None and torch.allclose(feats.grad, torch.full_like(feats, 0.5))


def test_ad_mil_loss_hand_value():
    scores = torch.full((2, 32), 0.5)
    labels = torch.tensor([1, 0])
    # BCE(0.5, .) = log 2 for both; smoothness 0; sparsity = 8e-3 * 16 on the anomalous video only.
    assert ad_mil_loss(scores, labels).item() == pytest.approx(math.log(2) + 8e-3 * 16, rel=1e-5)


def test_ad_mil_loss_finite_and_decreases_in_one_step():
    torch.manual_seed(0)
    segs = torch.randn(8, 32, 6)
    labels = torch.tensor([0, 1] * 4)
    segs[labels == 1, 10:14] += 2.0
    head = ADHead(6, hidden=16)
    opt = torch.optim.SGD(head.parameters(), lr=0.1)
    before = ad_mil_loss(head(segs), labels)
    assert torch.isfinite(before)
    before.backward()
    opt.step()
    assert ad_mil_loss(head(segs), labels) < before


def test_heads_any_width_and_seeded():
    for D in (3, 192):
        torch.manual_seed(1)
        a = ARHead(D, 4)(torch.ones(2, D))
        torch.manual_seed(1)
        b = ARHead(D, 4)(torch.ones(2, D))
        assert a.shape == (2, 4) and torch.equal(a, b)
        assert ADHead(D)(torch.zeros(5, D)).shape == (5,)


# ================================================================ probes

def clusters(n, n_classes, D, rng, split, sep=4.0, means=None, n_clips=3):
    labels = rng.integers(0, n_classes, n)
    return [make_video(f"{split}{i}", means[y] + rng.normal(size=(n_clips, D)), split, action=f"c{y}")
            for i, y in enumerate(labels)]


def test_eval_clip_indices():
    np.testing.assert_array_equal(eval_clip_indices(3), [0, 1, 2])
    np.testing.assert_array_equal(eval_clip_indices(9), [0, 2, 4, 6, 8])
    np.testing.assert_array_equal(eval_clip_indices(1), [0])


def _value(scored, metric, seed=0):
    return scored.metrics[metric](seed, None)


def test_action_recognition_separable_and_random_labels():
    rng = np.random.default_rng(0)
    means = rng.normal(size=(4, 16)) * 1.5
    train, test = clusters(160, 4, 16, rng, "train", means=means), clusters(80, 4, 16, rng, "test", means=means)
    out = action_recognition(train, test, seeds=[0, 1])
    assert _value(out, "top1") > 0.9
    assert out.details["pred"].shape == (2, len(test)) and out.test_ids[0] == "test0"

    noise = [make_video(f"r{i}", rng.normal(size=(3, 16)), "train" if i < 200 else "test", action=f"c{rng.integers(5)}")
             for i in range(400)]
    tr, te = [v for v in noise if v.split == "train"], [v for v in noise if v.split == "test"]
    first = action_recognition(tr, te, seeds=[0])
    assert _value(first, "top1") < 0.35                                        # chance 0.2
    assert (action_recognition(tr, te, seeds=[0]).details["pred"] == first.details["pred"]).all()  # seeded


def test_bias_reports_groups_and_gap():
    rng = np.random.default_rng(1)
    means = rng.normal(size=(3, 8)) * 3
    train = clusters(90, 3, 8, rng, "train", means=means)
    test = clusters(60, 3, 8, rng, "test", means=means)
    for i, v in enumerate(train + test):
        v.meta["group"] = "fm"[i % 2]
    out = bias(train, test, seeds=[0])
    assert set(out.metrics) == {"top1", "acc_f", "acc_m", "gap", "shortcut_gap"}
    assert _value(out, "gap") == pytest.approx(abs(_value(out, "acc_f") - _value(out, "acc_m")))
    assert _value(out, "top1") > 0.9


def _shortcut_world(rng, n_train, n_test, readable_group):
    """clap and punch look alike (means 0.3 apart, noise 1); in training clap is 95% group f, punch and wave 95% m.
    The group shows in the last dimension only where `readable_group`."""
    means = {"clap": np.r_[0.0, 0.0, 0.0], "punch": np.r_[0.3, 0.0, 0.0], "wave": np.r_[0.0, 5.0, 0.0]}
    videos = []
    for split, n in (("train", n_train), ("test", n_test)):
        for i in range(n):
            action = ("clap", "punch", "wave")[i % 3] if split == "train" else "clap"
            if split == "train":
                majority = "f" if action == "clap" else "m"
                group = majority if rng.random() < 0.95 else ("m" if majority == "f" else "f")
            else:
                group = "fm"[i % 2]
            x = means[action] + rng.normal(size=(3, 3))
            x[:, 2] = (3.0 if group == "f" else -3.0) if readable_group else rng.normal(size=3)
            videos.append(make_video(f"{split}{i}", x, split, action=action, group=group))
    return [v for v in videos if v.split == "train"], [v for v in videos if v.split == "test"]


def test_bias_shortcut_gap_is_signed_and_shows_a_group_shortcut():
    """Where the group is readable the probe calls the favoured group's clap right and the other group's a punch:
    the signed gap on the shortcut action is large; with the group unreadable it is centred on 0."""
    from splavu_core.evaluation.protocols import shortcut
    from splavu_core.evaluation.scoring import scored_rows
    from splavu_core.evaluation.stats import interval

    rng = np.random.default_rng(3)
    train, test = _shortcut_world(rng, 600, 400, readable_group=True)
    assert shortcut(train) == ("clap", "f")
    out = bias(train, test, seeds=[0])
    assert out.details == {"shortcut_action": "clap", "favoured_group": "f", "shortcut_test_videos": 400}
    assert _value(out, "shortcut_gap") > 0.5
    train, test = _shortcut_world(rng, 600, 400, readable_group=False)
    out = bias(train, test, seeds=[0])
    st = interval(out.metrics["shortcut_gap"], 1, out.n_test, same=True)
    assert st["ci_low"] < 0 < st["ci_high"] and abs(_value(out, "shortcut_gap")) < 0.15
    # the metric row keeps the signed interval (not clipped at 0 as a [0, 1] metric's is)
    row = next(r for r in scored_rows(out, "raw", None, "test", None) if r["metric"] == "shortcut_gap")
    assert (row["ci_low"], row["ci_high"]) == pytest.approx((st["ci_low"], st["ci_high"]))
    # the mirror split names the other group
    flipped = [dataclasses.replace(v, meta={**v.meta, "group": "m" if v.meta["group"] == "f" else "f"}) for v in train]
    assert shortcut(flipped) == ("clap", "m")


def _private(n, split, rng, W, scale):
    attrs = (rng.random((n, W.shape[0])) < 0.4).astype(int)
    videos = []
    for i, a in enumerate(attrs):
        feats = (a @ W + 0.5 * rng.normal(size=(2, W.shape[1]))) * scale   # 2 static clips per video
        videos.append(make_video(f"{split}{i}", feats, split, **{f"attr_{k}": int(x) for k, x in enumerate(a)}))
    return videos


def test_privacy_attack_scale_cannot_pass_for_privacy():
    """Shrinking the features 10,000-fold hides nothing from any attacker of the suite (each standardises, or is
    a tree ensemble that only reads the order of values)."""
    W = np.random.default_rng(2).normal(size=(3, 16))
    outs = {}
    for scale in (1.0, 1e-4):
        rng = np.random.default_rng(0)  # same videos, only the scale differs
        train, test = _private(120, "train", rng, W, scale), _private(60, "test", rng, W, scale)
        outs[scale] = privacy_attack(train, test, ["0", "1", "2"], seeds=[0], epochs=15, batch_size=64)
    tiny, full = outs[1e-4], outs[1.0]
    for name in ("mlp", "linear", "gbdt", "knn"):
        assert tiny.details["attacker_cmap"][name] == pytest.approx(full.details["attacker_cmap"][name], abs=0.02), name
    assert _value(tiny, "cmap") == pytest.approx(_value(full, "cmap"), abs=0.02)
    assert _value(tiny, "cmap") > tiny.chance["cmap"] + 0.3
    assert 0 <= _value(tiny, "f1") <= 1


def test_gait_retrieval_separated_subjects():
    rng = np.random.default_rng(3)
    centres = rng.normal(size=(5, 12)) * 5
    walks = [make_video(f"s{s}w{w}", centres[s] + 0.3 * rng.normal(size=(4, 12)), subject_id=f"s{s}")
             for s in range(5) for w in range(3)]
    assert _value(gait_retrieval(walks), "top1") == 1.0
    shuffled = [make_video(v.video_id, v.feats, subject_id=f"s{i % 5}") for i, v in enumerate(walks)]
    assert _value(gait_retrieval(shuffled), "top1") < 0.5    # wrong identities cannot be retrieved


def _tad_videos(n, split, rng, means):
    videos = []
    for i in range(n):
        T = int(rng.integers(8, 13))
        feats = rng.normal(size=(T, means.shape[1]))
        start, segs = 0, []
        while start + 5 < T:                             # segments of 2-4 clips separated by >= 1 idle clip
            s = start + int(rng.integers(1, 3))
            length = int(rng.integers(2, 5))
            if s + length > T:
                break
            c = int(rng.integers(len(means)))
            feats[s : s + length] += means[c]
            segs.append([float(s), float(s + length), f"c{c}"])
            start = s + length
        videos.append(make_video(f"{split}{i}", feats, split, segments=segs))
    return videos


def test_temporal_detection_learns_easy_segments():
    rng = np.random.default_rng(4)
    means = rng.normal(size=(2, 8)) * 3
    train, test = _tad_videos(60, "train", rng, means), _tad_videos(20, "test", rng, means)
    out = temporal_detection(train, test, classes=["c0", "c1"], seeds=[0])
    assert set(out.metrics) == {"mAP", "mAP@0.3", "mAP@0.4", "mAP@0.5", "mAP@0.6", "mAP@0.7"}
    assert _value(out, "mAP@0.3") >= _value(out, "mAP@0.7")
    assert _value(out, "mAP") > 0.5


def _ad_videos(n, split, rng, direction):
    videos = []
    for i in range(n):
        T = int(rng.integers(8, 20))
        feats = rng.normal(size=(T, len(direction)))
        anomalous = i % 2
        intervals = []
        if anomalous:
            s = int(rng.integers(0, T - 3))
            feats[s : s + 3] += direction
            intervals = [[float(s), float(s + 3)]]
        videos.append(make_video(f"{split}{i}", feats, split, anomaly=anomalous, anomaly_intervals=intervals))
    return videos


def test_anomaly_detection_learns_from_video_labels_only():
    rng = np.random.default_rng(5)
    direction = rng.normal(size=8) * 1.5
    train, test = _ad_videos(60, "train", rng, direction), _ad_videos(30, "test", rng, direction)
    out = anomaly_detection(train, test, seeds=[0])
    assert _value(out, "auc") > 0.9
