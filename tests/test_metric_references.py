"""Every metric splavu computes by hand equals a well-kept reference, on random inputs and on the edge cases (ties,
one class, a threshold hit exactly, weights, resamples of videos and of people).

    protocols._auc, auc_resamples            sklearn.metrics.roc_auc_score (resamples: its sample_weight)
    protocols._macro_f1, _macro_f1_rows,     sklearn.metrics.f1_score(average="macro", zero_division=0)
      _macro_f1_resamples
    metrics.cmap, average_precision,         sklearn.metrics.average_precision_score (macro over columns;
      cmap_resamples                           resamples: its sample_weight)
    metrics.top1, ar_scored's top1 and       sklearn accuracy_score, top_k_accuracy_score, recall_score
      class_top1
    reidentification's rank-1 and mAP        average_precision_score per query over its gallery
    gait_retrieval's top-1, attackers' knn   sklearn.neighbors.NearestNeighbors (cosine) on StandardScaler'd means
    attackers.Standardiser                   sklearn.preprocessing.StandardScaler
    protocols.fit_logistic, attackers'       sklearn.linear_model.LogisticRegression on the same objective
      linear
    metrics.tad_map, interpolated_ap         ActivityNet's detection evaluation (Evaluation/eval_detection.py,
                                               compute_average_precision_detection + interpolated_prec_rec), restated
                                               below from its published algorithm: no installed package carries it

Where splavu and the reference differ on purpose, the test says so: an undefined AUC / AP (one class) is an error
or NaN here, where scikit-learn returns NaN with a warning (AUC) or a number (AP: 0 without positives, 1 without
negatives).
"""
from __future__ import annotations

import warnings

import numpy as np
import pytest
from sklearn.linear_model import LogisticRegression
from sklearn.metrics import (
    accuracy_score,
    average_precision_score,
    f1_score,
    recall_score,
    roc_auc_score,
    top_k_accuracy_score,
)
from sklearn.neighbors import NearestNeighbors
from sklearn.preprocessing import StandardScaler

from splavu_core.evaluation import attackers as A
from splavu_core.evaluation import protocols as P
from splavu_core.evaluation import stats
from splavu_core.tasks.features import VideoFeatures
from splavu_core.tasks.metrics import (
    average_precision,
    chance_cmap,
    cmap,
    cmap_resamples,
    interpolated_ap,
    macro_f1,
    resample_counts,
    segment_iou,
    tad_map,
    top1,
)


def _scores(rng, n, decimals):
    """Scores with ties: rounded to `decimals` (0: a handful of distinct values), or continuous (None)."""
    s = rng.normal(size=n)
    return s if decimals is None else np.round(s, decimals)


def _resample_sets(rng, n):
    """A bootstrap over videos ((B, n) indices) and one over people (index rows of differing lengths)."""
    people = rng.integers(0, max(2, n // 4), n)
    return [stats.bootstrap_indices(n, 40, seed=int(rng.integers(1 << 30))),
            stats.bootstrap_indices(n, 40, seed=int(rng.integers(1 << 30)), clusters=stats.cluster_codes(people))]


# ---------------------------------------------------------------- ROC AUC

def test_auc_equals_sklearn_on_random_cases_with_ties():
    rng = np.random.default_rng(0)
    for case in range(400):
        n = int(rng.integers(2, 300))
        y = (rng.random(n) < rng.uniform(0.05, 0.95)).astype(int)
        y[0], y[-1] = 0, 1                                     # both classes
        s = _scores(rng, n, [None, 2, 1, 0][case % 4])
        assert P._auc(y, s) == pytest.approx(roc_auc_score(y, s), abs=1e-12), case


def test_auc_of_one_class_is_an_error_where_sklearn_warns_nan():
    with pytest.raises(ValueError, match="one class"):
        P._auc(np.zeros(5, int), np.arange(5.0))
    with pytest.warns(Warning):
        assert np.isnan(roc_auc_score(np.zeros(5, int), np.arange(5.0)))


def test_auc_resamples_equal_sklearn_with_sample_weights():
    """Every resample of videos or of people: the frame AUC with each frame weighted by its video's draw count is
    sklearn's roc_auc_score with those sample weights (a resample lacking a class: NaN, as sklearn's)."""
    rng = np.random.default_rng(1)
    for case in range(6):
        n = 30
        fl = [(rng.random(int(rng.integers(3, 20))) < p).astype(int) for p in rng.random(n) * 0.5]
        fl[0][:] = 1
        y = np.concatenate(fl)
        s = _scores(rng, len(y), [None, 1][case % 2]) + y
        video_of = np.repeat(np.arange(n), [len(f) for f in fl])
        for idx in _resample_sets(rng, n):
            got = P.auc_resamples(y, s, video_of, idx)
            w = resample_counts(idx, n)[:, video_of]
            for b in range(len(idx)):
                keep = w[b] > 0
                if len(set(y[keep])) < 2:
                    assert np.isnan(got[b])
                    continue
                assert got[b] == pytest.approx(roc_auc_score(y, s, sample_weight=w[b]), abs=1e-12)


# ---------------------------------------------------------------- macro-F1

def _sk_macro_f1(y, probs, threshold=0.5, sample_weight=None):
    """sklearn's macro-F1 over the attribute columns. One column: average='binary', since sklearn reads an (N, 1)
    indicator as one binary target, and its average='macro' would then average the F1 of BOTH classes (a
    disagreement this test found in metrics.macro_f1, since fixed)."""
    y, pred = y.astype(int), (probs >= threshold).astype(int)
    if y.shape[1] == 1:
        return f1_score(y[:, 0], pred[:, 0], average="binary", zero_division=0, sample_weight=sample_weight)
    return f1_score(y, pred, average="macro", zero_division=0, sample_weight=sample_weight)


def test_macro_f1_equals_sklearn_on_random_multi_attribute_cases():
    rng = np.random.default_rng(2)
    for case in range(400):
        n, a = int(rng.integers(1, 120)), int(rng.integers(1, 8))
        y = (rng.random((n, a)) < rng.uniform(0, 1, a)).astype(np.float32)
        probs = np.round(rng.random((n, a)), [3, 1, 0][case % 3])   # 0 decimals: many probs exactly 0 or 1
        probs[rng.random((n, a)) < 0.1] = 0.5                        # exactly at the threshold: predicted positive
        thr = [0.5, 0.3, 0.9][case % 3]
        assert P._macro_f1(y, probs, thr) == _sk_macro_f1(y, probs, thr), case
        assert macro_f1(y, probs, thr) == _sk_macro_f1(y, probs, thr), case


def test_macro_f1_edge_cases_equal_sklearn():
    y = np.array([[0, 1, 0], [0, 1, 0], [0, 1, 0]], np.float32)
    for probs in (np.zeros((3, 3)), np.ones((3, 3)), np.array([[0.5, 0.49, 0.51]] * 3)):
        # an attribute nobody has and nobody is predicted to have counts 0 (zero_division=0), as sklearn's
        assert P._macro_f1(y, probs) == _sk_macro_f1(y, probs)
    assert P._macro_f1(y, np.zeros((3, 3))) == 0.0


def test_macro_f1_rows_and_resamples_equal_sklearn():
    """_macro_f1_rows over a leading batch axis, and _macro_f1_resamples on resamples of videos and of people (as
    sklearn's sample_weight: a video drawn k times counts k times)."""
    rng = np.random.default_rng(3)
    y = (rng.random((40, 5)) < 0.3).astype(np.float32)
    probs = np.round(rng.random((40, 5)), 1)
    batch_y, batch_p = np.stack([y, 1 - y, y]), np.stack([probs, probs, 1 - probs])
    np.testing.assert_array_equal(P._macro_f1_rows(batch_y, batch_p, 0.5),
                                  [_sk_macro_f1(a, b) for a, b in zip(batch_y, batch_p)])
    for idx in _resample_sets(rng, 40):
        got = P._macro_f1_resamples(y, probs, idx)
        counts = resample_counts(idx, 40)
        want = [_sk_macro_f1(y, probs, sample_weight=c) for c in counts]
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-12)


# ---------------------------------------------------------------- average precision, cMAP

def test_cmap_equals_sklearn_on_random_cases_with_ties():
    rng = np.random.default_rng(4)
    for case in range(300):
        n, a = int(rng.integers(2, 150)), int(rng.integers(1, 8))
        y = (rng.random((n, a)) < rng.uniform(0.05, 0.95, a)).astype(int)
        y[0], y[-1] = 0, 1
        s = np.stack([_scores(rng, n, [None, 2, 1, 0][case % 4]) for _ in range(a)], 1) + 0.5 * y
        assert cmap(y, s) == pytest.approx(average_precision_score(y, s, average="macro"), abs=1e-12), case
        assert average_precision(y[:, 0], s[:, 0]) == pytest.approx(average_precision_score(y[:, 0], s[:, 0]),
                                                                   abs=1e-12)


def test_cmap_resamples_equal_sklearn_with_sample_weights():
    rng = np.random.default_rng(5)
    y = (rng.random((30, 4)) < 0.4).astype(int)
    y[0], y[1] = 1, 0
    s = np.round(rng.random((30, 4)) + 0.3 * y, 1)
    for idx in _resample_sets(rng, 30):
        got = cmap_resamples(y, s, idx)
        for b, w in enumerate(resample_counts(idx, 30)):
            keep = w > 0
            if any(len(set(y[keep, j])) < 2 for j in range(4)):
                assert np.isnan(got[b])
                continue
            want = np.mean([average_precision_score(y[:, j], s[:, j], sample_weight=w) for j in range(4)])
            assert got[b] == pytest.approx(want, abs=1e-12)


def test_ap_of_one_class_is_undefined_where_sklearn_returns_a_number():
    s = np.array([0.2, 0.4, 0.9])
    assert np.isnan(average_precision(np.zeros(3), s)) and np.isnan(average_precision(np.ones(3), s))
    with pytest.raises(ValueError, match="only class"):
        cmap(np.zeros((3, 1)), s[:, None])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert average_precision_score(np.zeros(3), s) == 0.0 and average_precision_score(np.ones(3), s) == 1.0


def test_chance_cmap_is_the_mean_prevalence_and_the_expected_ap_of_a_random_ranking():
    rng = np.random.default_rng(6)
    y = (rng.random((60, 3)) < [0.2, 0.5, 0.7]).astype(int)
    assert chance_cmap(y) == pytest.approx(y.mean())
    # AP of a uniformly random ranking, averaged over many rankings (sklearn's AP): the prevalence, up to the
    # finite-sample term (k/N sums; 60 rows)
    mc = np.mean([average_precision_score(y[:, j], rng.random(60)) for j in range(3) for _ in range(600)])
    assert mc == pytest.approx(chance_cmap(y), abs=0.04)


# ---------------------------------------------------------------- top-1 and its per-class / per-group forms

def test_top1_and_per_class_and_per_group_accuracy_equal_sklearn():
    rng = np.random.default_rng(7)
    n, c = 90, 6
    probs = rng.dirichlet(np.ones(c), n)
    labels = rng.integers(0, c, n)
    assert top1(probs, labels) == pytest.approx(top_k_accuracy_score(labels, probs, k=1, labels=np.arange(c)))
    classes = [f"c{i}" for i in range(c)]
    test = [VideoFeatures(f"v{i}", "test", np.zeros((1, 2), np.float32), np.zeros(1), np.ones(1), 16, 16.0,
                          {"action": classes[labels[i]]}) for i in range(n)]
    sc = P.ar_scored(probs[None], test, classes)
    pred = probs.argmax(1)
    assert sc.metrics["top1"](0, None) == pytest.approx(accuracy_score(labels, pred))
    per_class = recall_score(labels, pred, labels=np.arange(c), average=None, zero_division=0)
    for k in range(c):
        assert sc.metrics[f"class_top1[{classes[k]}]"](0, None) == pytest.approx(per_class[k])
    # ties: the first of the tied classes is the prediction (numpy's argmax)
    assert top1(np.array([[0.5, 0.5], [0.5, 0.5]]), np.array([0, 1])) == 0.5


# ---------------------------------------------------------------- retrieval: re-identification and gait

def _videos(feats, subjects, actions, split="test"):
    return [VideoFeatures(f"{split}{i}", split, f[None].astype(np.float32), np.zeros(1), np.ones(1), 16, 16.0,
                          {"subject_id": s, "action": a}) for i, (f, s, a) in enumerate(zip(feats, subjects, actions))]


def test_reid_rank1_and_map_equal_sklearn_average_precision_per_query():
    rng = np.random.default_rng(8)
    subjects = np.repeat(np.arange(8), 4)
    actions = np.tile(["a", "b", "c", "d"], 8)
    person = rng.normal(size=(8, 6))
    train = _videos(person[np.repeat(np.arange(8), 2)] + rng.normal(size=(16, 6)), np.repeat(np.arange(8), 2),
                    np.tile(["a", "b"], 8), "train")
    test = _videos(person[subjects] + rng.normal(size=(32, 6)), subjects, actions)
    sc = P.reidentification(train, test)
    emb = P.reid_embeddings(train, test)
    for name, e in emb.items():
        sim = e @ e.T
        r1, aps = [], []
        for i in range(32):
            g = (actions != actions[i]) & (np.arange(32) != i)
            pos = subjects[g] == subjects[i]
            if not pos.any():
                continue
            r1.append(pos[np.argmax(sim[i, g])])
            aps.append(average_precision_score(pos, sim[i, g]))
        assert sc.metrics[f"rank1[{name}]"](0, None) == pytest.approx(np.mean(r1))
        assert sc.metrics[f"map[{name}]"](0, None) == pytest.approx(np.mean(aps), abs=1e-12)
    # the cosine attacker's embedding: StandardScaler (fitted on the training videos' means) then unit length
    z = StandardScaler().fit(np.stack([v.feats.mean(0) for v in train])).transform(
        np.stack([v.feats.mean(0) for v in test]))
    np.testing.assert_allclose(emb["cosine"], z / np.linalg.norm(z, axis=1, keepdims=True), atol=1e-6)


def test_gait_top1_equals_sklearn_nearest_neighbour_within_folds():
    """Per fold of people: StandardScaler (cosine) or sklearn's shrinkage LDA (lda) fitted on the other folds, then
    sklearn's cosine nearest neighbour among the fold's other walks."""
    from sklearn.discriminant_analysis import LinearDiscriminantAnalysis

    rng = np.random.default_rng(9)
    subjects = np.repeat(np.arange(10), 3)
    feats = rng.normal(size=(10, 5))[subjects] * 0.7 + rng.normal(size=(30, 5))
    vids = _videos(feats, subjects, ["walk"] * 30)
    fold = P.gait_folds(np.array([str(s) for s in subjects], dtype=object))
    assert len(set(fold)) == 4
    want = {"cosine": np.zeros(30), "lda": np.zeros(30)}
    chance = np.zeros(30)
    for f in set(fold):
        te, tr = np.flatnonzero(fold == f), np.flatnonzero(fold != f)
        scaler = StandardScaler().fit(feats[tr])
        emb = {"cosine": scaler.transform(feats[te]),
               "lda": LinearDiscriminantAnalysis(solver="eigen", shrinkage="auto").fit(
                   scaler.transform(feats[tr]), subjects[tr]).transform(scaler.transform(feats[te]))}
        for name, e in emb.items():
            nn = NearestNeighbors(n_neighbors=2, metric="cosine").fit(e).kneighbors(e, return_distance=False)
            other = np.where(nn[:, 0] == np.arange(len(te)), nn[:, 1], nn[:, 0])   # the nearest walk not itself
            want[name][te] = subjects[te][other] == subjects[te]
        chance[te] = 2 / (len(te) - 1)
    sc = P.gait_retrieval(vids)
    for name in ("cosine", "lda"):
        assert sc.metrics[f"top1[{name}]"](0, None) == pytest.approx(want[name].mean())
    assert sc.chance["top1"] == pytest.approx(chance.mean())


def test_knn_attacker_equals_sklearn_nearest_neighbours():
    rng = np.random.default_rng(10)
    tr = [rng.normal(size=(int(rng.integers(1, 4)), 6)).astype(np.float32) for _ in range(40)]   # clips per video
    y_train = (rng.random((40, 3)) < 0.5).astype(np.float32)
    te = rng.normal(size=(12, 6)).astype(np.float32)
    d = A.AttackData(x=np.concatenate(tr), y=np.repeat(y_train, [len(v) for v in tr], 0),
                     train_starts=np.cumsum([0] + [len(v) for v in tr[:-1]]), y_train=y_train, xt=te,
                     starts=np.arange(12), n_clips=np.ones((12, 1)), y_test=np.zeros((12, 3)))
    got = A._knn(d, [0])[0]
    means = np.stack([v.astype(np.float64).mean(0) for v in tr])
    sc = StandardScaler().fit(means)
    nn = NearestNeighbors(n_neighbors=A.KNN_K, metric="cosine").fit(sc.transform(means))
    want = y_train[nn.kneighbors(sc.transform(te.astype(np.float64)), return_distance=False)].mean(1)
    np.testing.assert_allclose(got, want, atol=1e-12)


def test_standardiser_equals_sklearn_standard_scaler():
    rng = np.random.default_rng(11)
    x = rng.normal(3, 2, size=(50, 4))
    x[:, 2] = 7.0                                    # a constant column: sklearn and splavu leave it at 0
    np.testing.assert_allclose(A.Standardiser(x)(x), StandardScaler().fit_transform(x), atol=1e-6)


# ---------------------------------------------------------------- the convex probes' fit

def test_fit_logistic_reaches_sklearns_optimum_multinomial_and_binary():
    """The same objective (weights normalised to sum 1, L2 l2/2 on the weights, intercept free) minimised by
    sklearn's LogisticRegression with C = 1/l2 and those sample weights: the same probabilities."""
    import torch

    rng = np.random.default_rng(12)
    n, d, c, l2 = 600, 12, 5, 0.1
    x = rng.normal(size=(n, d))
    y = (x @ rng.normal(size=(d, c)) + rng.gumbel(size=(n, c))).argmax(1)
    w = rng.uniform(0.2, 1.0, n)
    W, b = P.fit_logistic(torch.from_numpy(x), torch.from_numpy(y), torch.from_numpy(w), c, l2, seed=3)
    mine = torch.softmax(torch.from_numpy(x) @ W + b, -1).numpy()
    sk = LogisticRegression(C=1 / l2, tol=1e-10, max_iter=5000).fit(x, y, sample_weight=w / w.sum())
    np.testing.assert_allclose(mine, sk.predict_proba(x), atol=2e-4)

    yb = (x[:, 0] + rng.normal(size=n) > 0).astype(np.int64)
    W, b = P.fit_logistic(torch.from_numpy(x), torch.from_numpy(yb), torch.from_numpy(w), 1, 1.0, seed=0, binary=True)
    mine = torch.sigmoid(torch.from_numpy(x) @ W + b)[:, 0].numpy()
    sk = LogisticRegression(C=1.0, tol=1e-10, max_iter=5000).fit(x, yb, sample_weight=w / w.sum())
    np.testing.assert_allclose(mine, sk.predict_proba(x)[:, 1], atol=2e-4)


def test_linear_attacker_reaches_sklearns_optimum_per_attribute():
    """attackers._linear: mean binary cross-entropy over clips + LINEAR_L2/2 ||W||^2, per attribute, on standardised
    clips = sklearn's LogisticRegression with C = 1 / (LINEAR_L2 * n_clips); video probabilities = clip means."""
    rng = np.random.default_rng(13)
    n_clips, dim = 300, 8
    x = rng.normal(size=(n_clips, dim)).astype(np.float32)
    y = (x[:, :3] + rng.normal(size=(n_clips, 3)) > 0).astype(np.float32)
    xt = rng.normal(size=(20, dim)).astype(np.float32)
    d = A.AttackData(x=x, y=y, train_starts=np.arange(n_clips), y_train=y, xt=xt, starts=np.arange(0, 20, 2),
                     n_clips=np.full((10, 1), 2.0), y_test=np.zeros((10, 3)))
    got = A._linear(d, [0])[0]
    xs, xts = A.standardise(x, xt)
    for j in range(3):
        sk = LogisticRegression(C=1 / (A.LINEAR_L2 * n_clips), tol=1e-10, max_iter=5000).fit(xs, y[:, j])
        want = sk.predict_proba(xts.astype(np.float64))[:, 1].reshape(10, 2).mean(1)
        np.testing.assert_allclose(got[:, j], want, atol=2e-4)


# ---------------------------------------------------------------- temporal action detection

def _activitynet_class_ap(gt: list, pred: list, tious) -> np.ndarray:
    """ActivityNet's compute_average_precision_detection (Evaluation/eval_detection.py), restated: predictions by
    decreasing score; each one takes, among its video's ground truths of the class, the one of highest tIoU not yet
    taken at that threshold, if that tIoU reaches it; VOC's interpolated AP (interpolated_prec_rec) of the
    resulting precision/recall. gt: [(video, start, end)]; pred: [(video, start, end, score)]."""
    ap = np.zeros(len(tious))
    if not pred:
        return ap
    pred = sorted(pred, key=lambda p: -p[3])
    tp = np.zeros((len(tious), len(pred)))
    for t, thr in enumerate(tious):
        locked = set()
        for k, (vid, a, b, _) in enumerate(pred):
            cands = [(i, g) for i, g in enumerate(gt) if g[0] == vid]
            if not cands:
                continue
            ious = [max(0.0, min(b, g[2]) - max(a, g[1])) / ((b - a) + (g[2] - g[1]) - max(0.0, min(b, g[2]) - max(a, g[1])))
                    for _, g in cands]
            for j in np.argsort(ious, kind="stable")[::-1]:
                if ious[j] < thr:
                    break
                if cands[j][0] in locked:
                    continue
                locked.add(cands[j][0])
                tp[t, k] = 1
                break
    for t in range(len(tious)):
        rec = np.cumsum(tp[t]) / len(gt)
        prec = np.cumsum(tp[t]) / np.arange(1, len(pred) + 1)
        mprec, mrec = np.r_[0, prec, 0], np.r_[0, rec, 1]
        for i in range(len(mprec) - 2, -1, -1):
            mprec[i] = max(mprec[i], mprec[i + 1])
        idx = np.flatnonzero(mrec[1:] != mrec[:-1]) + 1
        ap[t] = np.sum((mrec[idx] - mrec[idx - 1]) * mprec[idx])
    return ap


def test_tad_map_equals_the_activitynet_evaluation():
    rng = np.random.default_rng(14)
    tious = (0.3, 0.4, 0.5, 0.6, 0.7)
    for case in range(40):
        gts, dets = {}, {}
        for v in range(int(rng.integers(1, 6))):
            starts = rng.uniform(0, 60, int(rng.integers(0, 4)))
            gts[f"v{v}"] = [(float(a), float(a + rng.uniform(2, 10)), f"c{rng.integers(3)}") for a in starts]
            d = [(a + rng.normal(0, 1.5), b + rng.normal(0, 1.5), lab, 0.0) for a, b, lab in gts[f"v{v}"]]
            d += [(float(a), float(a + rng.uniform(1, 8)), f"c{rng.integers(4)}", 0.0) for a in rng.uniform(0, 60, 3)]
            dets[f"v{v}"] = [(a, max(b, a + 0.1), lab, float(rng.random())) for a, b, lab, _ in d]  # distinct scores
        if not any(gts.values()):
            continue
        out = tad_map(dets, gts, tious)
        classes = sorted({g[2] for segs in gts.values() for g in segs})
        ref = np.mean([_activitynet_class_ap([(v, a, b) for v, segs in gts.items() for a, b, lab in segs if lab == c],
                                             [(v, a, b, s) for v, ds in dets.items() for a, b, lab, s in ds if lab == c],
                                             tious) for c in classes], axis=0)
        assert out["mAP"] == pytest.approx(ref.mean(), abs=1e-12), case
        for t, r in zip(tious, ref):
            assert out[f"mAP@{t:g}"] == pytest.approx(r, abs=1e-12)


def test_interpolated_ap_and_segment_iou_equal_their_definitions():
    rng = np.random.default_rng(15)
    for _ in range(100):
        hits = (rng.random(int(rng.integers(1, 30))) < 0.5).astype(float)
        n_gt = max(1, int(hits.sum()) + int(rng.integers(0, 3)))
        rec, prec = np.cumsum(hits) / n_gt, np.cumsum(hits) / np.arange(1, len(hits) + 1)
        # VOC 2010+ all-points AP = the area under the precision envelope, summed where recall steps
        env = np.array([prec[i:].max() for i in range(len(prec))])
        want = sum(env[i] * (rec[i] - (rec[i - 1] if i else 0.0)) for i in range(len(prec)))
        assert interpolated_ap(prec, rec) == pytest.approx(want, abs=1e-12)
    a, b = np.sort(rng.uniform(0, 10, (2, 50)), axis=0)
    seg = (2.0, 5.0)
    inter = np.clip(np.minimum(5.0, b) - np.maximum(2.0, a), 0, None)
    np.testing.assert_allclose(segment_iou(seg, np.c_[a, b]), inter / (3.0 + (b - a) - inter), atol=1e-12)
