"""Evaluation metrics on plain numpy arrays: cMAP / macro-F1 (privacy), top-1 (AR), frame AUC (AD),
temporal-detection mAP (TAD).

No torch here, so the metrics can be used (and tested) without any model.
"""
from __future__ import annotations

from collections import defaultdict
from collections.abc import Hashable, Iterable, Mapping, Sequence

import numpy as np
from sklearn.metrics import f1_score, roc_auc_score

from splavu_core.tasks.features import VideoFeatures

TIOUS = (0.3, 0.4, 0.5, 0.6, 0.7)


# ---------------------------------------------------------------- privacy: cMAP, chance, macro-F1

def _as_2d(y_true, scores) -> tuple[np.ndarray, np.ndarray]:
    y_true, scores = np.asarray(y_true), np.asarray(scores, dtype=np.float64)
    if y_true.ndim == 1:
        y_true, scores = y_true[:, None], scores.reshape(-1, 1)
    assert y_true.ndim == 2, f"y_true must be (N, A), got {y_true.shape}"
    assert y_true.shape == scores.shape, f"y_true {y_true.shape} and scores {scores.shape} differ"
    assert ((y_true == 0) | (y_true == 1)).all(), "y_true must be 0/1"
    return y_true.astype(int), scores


def _ap_weighted(y: np.ndarray, s: np.ndarray, w: np.ndarray) -> np.ndarray:
    """Average precision of every column of (y, s) under each row weighting: y (N, A) in {0, 1}, s (N, A),
    w (B, N) how many times each row counts (a bootstrap resample's multiplicities; ones: the data as given)
    -> (B, A); NaN where a weighted column has one class only.

    sklearn's definition with ties grouped: AP = (1/P) sum_i y_i precision(end of i's tie group), rows ranked by
    score, high to low. Rows are ranked once per column; a resample only re-weights them, so no resample is sorted
    (sorting every resample made cMAP most of an evaluation's time). Counts are integers, exact in float64. Equal to
    average_precision_score with the weights as sample_weight (tests/test_metric_references.py); 90x an
    average_precision_score per resample and attribute at the demo's size (benchmarks/metric_speed.py)."""
    n = s.shape[0]
    order = np.argsort(-s.T, axis=-1, kind="stable")                    # (A, N) each column high to low
    ranked = np.take_along_axis(s.T, order, -1)
    ends_group = np.ones(ranked.shape, bool)
    ends_group[:, :-1] = ranked[:, 1:] != ranked[:, :-1]
    end = np.where(ends_group, np.arange(n), n)
    end = np.minimum.accumulate(end[:, ::-1], axis=-1)[:, ::-1]          # (A, N) where each rank's tie group ends
    wr = np.asarray(w, np.float64)[:, order]                            # (B, A, N) weights in rank order
    pos = wr * np.take_along_axis(y.T, order, -1).astype(np.float64)    # (B, A, N) weighted positives
    tps, seen = np.cumsum(pos, -1), np.cumsum(wr, -1)
    col = np.arange(s.shape[1])[:, None]
    precision_at_end = tps[:, col, end] / np.maximum(seen[:, col, end], 1)
    positives, total = tps[..., -1], seen[..., -1]
    with np.errstate(invalid="ignore", divide="ignore"):
        ap = (pos * precision_at_end).sum(-1) / positives
    return np.where((positives > 0) & (positives < total), ap, np.nan)


def average_precision(y: np.ndarray, s: np.ndarray) -> float:
    """Binary AP (sklearn's definition, ties grouped) of one score column; NaN when y has one class only."""
    y = np.asarray(y).reshape(-1, 1)
    return float(_ap_weighted(y, np.asarray(s, np.float64).reshape(-1, 1), np.ones((1, len(y))))[0, 0])


def cmap(y_true, scores) -> float:
    """Mean over attributes (columns) of average precision, sklearn's definition.

    y_true (N, A) in {0, 1}; scores (N, A), any monotone score (probabilities or logits).
    """
    y_true, scores = _as_2d(y_true, scores)
    ap = _ap_weighted(y_true, scores, np.ones((1, len(y_true))))[0]
    if np.isnan(ap).any():
        a = int(np.flatnonzero(np.isnan(ap))[0])
        raise ValueError(f"cmap: attribute column {a} has only class {y_true[0, a]} in y_true; AP is undefined")
    return float(ap.mean())


def resample_counts(idx, n: int) -> np.ndarray:
    """Resampled row indices, (B, n) drawn with replacement or B index arrays of any lengths (a bootstrap over
    people: evaluation.stats.bootstrap_indices) -> (B, n) how many times each row was drawn."""
    if isinstance(idx, np.ndarray) and idx.ndim == 2:
        B = len(idx)
        return np.bincount((idx + n * np.arange(B)[:, None]).ravel(), minlength=B * n).reshape(B, n)
    if getattr(idx, "counts", None) is not None and idx.counts.shape[1] == n:   # stats.PeopleResamples
        return idx.counts
    return np.stack([np.bincount(np.asarray(row, np.int64), minlength=n) for row in idx]) if len(idx) else \
        np.zeros((0, n), np.int64)


def cmap_resamples(y_true: np.ndarray, scores: np.ndarray, idx: np.ndarray) -> np.ndarray:
    """cMAP of each resample of the rows: idx, B rows of row indices (resample_counts) -> (B,), NaN where a resampled column has one
    class (where `cmap` raises). Equals [cmap(y_true[i], scores[i]) for i in idx] up to float rounding (~1e-16)."""
    y_true, scores = _as_2d(y_true, scores)
    return _ap_weighted(y_true, scores, resample_counts(idx, len(y_true))).mean(axis=-1)


def chance_cmap(y_true) -> float:
    """cMAP of an uninformative scorer: AP of a random ranking = the attribute's prevalence."""
    y_true, _ = _as_2d(y_true, np.zeros(np.shape(y_true)))
    return float(y_true.mean(axis=0).mean())


def macro_f1(y_true, probs, threshold: float = 0.5) -> float:
    """Macro-F1 over attributes, predicting positive where prob >= threshold: the mean of each attribute's
    positive-class F1 (0 where it has neither a positive nor a positive prediction). One attribute: its F1, not
    sklearn's average='macro' of an (N, 1) indicator, which averages the F1 of both classes."""
    y_true, probs = _as_2d(y_true, probs)
    pred = (probs >= threshold).astype(int)
    if y_true.shape[1] == 1:
        return float(f1_score(y_true[:, 0], pred[:, 0], average="binary", zero_division=0))
    return float(f1_score(y_true, pred, average="macro", zero_division=0))


# ---------------------------------------------------------------- AR

def top1(probs, labels) -> float:
    """Fraction of rows whose argmax equals the integer label. probs (N, C), labels (N,)."""
    probs, labels = np.asarray(probs), np.asarray(labels)
    assert probs.ndim == 2 and labels.shape == (len(probs),), f"probs {probs.shape} vs labels {labels.shape}"
    return float((probs.argmax(axis=1) == labels).mean())


# ---------------------------------------------------------------- AD: frame-level AUC

def frame_labels(video: VideoFeatures) -> np.ndarray:
    """(n_frames,) int: frame f is anomalous when f / fps lies in [start_s, end_s) of an anomaly interval."""
    intervals = video.meta.get("anomaly_intervals") or []
    if video.meta.get("anomaly") == 1 and not intervals:
        raise ValueError(f"{video.video_id}: anomalous video without anomaly_intervals; frame labels unknown")
    t = np.arange(video.n_frames) / video.fps + 1e-6  # tolerance: interval bounds written as rounded decimals
    labels = np.zeros(video.n_frames, dtype=int)
    for start, end in intervals:
        labels[(t >= start) & (t < end)] = 1
    return labels


def frame_scores(video: VideoFeatures, clip_scores) -> np.ndarray:
    """(n_frames,): each clip's score repeated over its frames; frames after the last clip keep its score."""
    clip_scores = np.asarray(clip_scores, dtype=np.float64).reshape(-1)
    assert len(clip_scores) == len(video.feats), \
        f"{video.video_id}: {len(clip_scores)} scores for {len(video.feats)} clips"
    # Work in frame indices (rounded) so float clip times cannot shift a boundary frame.
    start_frames = np.round(np.asarray(video.clip_start_s) * video.fps).astype(int)  # (n_clips,)
    clip_of_frame = np.searchsorted(start_frames, np.arange(video.n_frames), side="right") - 1
    return clip_scores[np.clip(clip_of_frame, 0, len(clip_scores) - 1)]


def frame_auc(videos_scores: Iterable[tuple[VideoFeatures, np.ndarray]]) -> float:
    """Frame-level ROC AUC over all frames of all videos. videos_scores: (video, clip_scores (n_clips,)) pairs."""
    labels, scores = [], []
    for video, clip_scores in videos_scores:
        labels.append(frame_labels(video))
        scores.append(frame_scores(video, clip_scores))
    assert labels, "frame_auc: no videos"
    y, s = np.concatenate(labels), np.concatenate(scores)
    if y.min() == y.max():
        raise ValueError(f"frame_auc: all {len(y)} frames have label {y[0]}; AUC is undefined")
    return float(roc_auc_score(y, s))


# ---------------------------------------------------------------- TAD: mAP over tIoU thresholds

def segment_iou(segment, segments) -> np.ndarray:
    """Temporal IoU of one [start, end] against (N, 2) segments -> (N,)."""
    segments = np.asarray(segments, dtype=np.float64).reshape(-1, 2)
    inter = np.clip(np.minimum(segment[1], segments[:, 1]) - np.maximum(segment[0], segments[:, 0]), 0, None)
    union = (segment[1] - segment[0]) + (segments[:, 1] - segments[:, 0]) - inter
    return inter / np.maximum(union, 1e-12)


def interpolated_ap(precision: np.ndarray, recall: np.ndarray) -> float:
    """All-points interpolated AP (ActivityNet / THUMOS evaluation code)."""
    mprec = np.concatenate([[0.0], precision, [0.0]])
    mrec = np.concatenate([[0.0], recall, [1.0]])
    mprec = np.maximum.accumulate(mprec[::-1])[::-1]  # precision envelope: max precision at any higher recall
    idx = np.where(mrec[1:] != mrec[:-1])[0] + 1
    return float(np.sum((mrec[idx] - mrec[idx - 1]) * mprec[idx]))


def _class_ap(dets: list[tuple], gts: dict[str, np.ndarray], tious: Sequence[float]) -> np.ndarray:
    """AP of one class at each tIoU. dets: (video_id, start, end, score); gts: video_id -> (G, 2)."""
    n_gt = sum(len(g) for g in gts.values())
    ap = np.zeros(len(tious))
    if not dets:
        return ap
    order = np.argsort([-d[3] for d in dets], kind="stable")  # stable: ties keep input order
    tp = np.zeros((len(tious), len(dets)))
    fp = np.zeros((len(tious), len(dets)))
    taken = {vid: np.zeros((len(tious), len(g)), dtype=bool) for vid, g in gts.items()}
    for rank, i in enumerate(order):
        vid, start, end, _ = dets[i]
        if vid not in gts:
            fp[:, rank] = 1
            continue
        ious = segment_iou((start, end), gts[vid])          # (G,)
        by_iou = np.argsort(-ious, kind="stable")
        for t, thr in enumerate(tious):
            # Greedy: the unmatched ground truth with the highest tIoU >= thr; one prediction per ground truth.
            for g in by_iou:
                if ious[g] < thr:
                    break
                if not taken[vid][t, g]:
                    taken[vid][t, g] = True
                    tp[t, rank] = 1
                    break
            fp[t, rank] = 1 - tp[t, rank]
    tp_cum, fp_cum = np.cumsum(tp, axis=1), np.cumsum(fp, axis=1)
    for t in range(len(tious)):
        recall = tp_cum[t] / n_gt
        precision = tp_cum[t] / (tp_cum[t] + fp_cum[t])
        ap[t] = interpolated_ap(precision, recall)
    return ap


def tad_map(detections: Mapping[str, Iterable[tuple]], ground_truth: Mapping[str, Iterable[tuple]],
            tious: Sequence[float] = TIOUS) -> dict[str, float]:
    """Temporal action detection mAP.

    detections: video_id -> [(start_s, end_s, label, score)]; ground_truth: video_id -> [(start_s, end_s, label)].
    Labels are any hashable (class index or name) but must agree between the two. AP per class, mean over
    classes present in the ground truth (a class never detected scores 0), then averaged over tIoUs.
    Returns {"mAP": average, "mAP@0.3": ..., ...} (one key per threshold).
    """
    gt_by_class: dict[Hashable, dict[str, list]] = defaultdict(lambda: defaultdict(list))
    for vid, segs in ground_truth.items():
        for start, end, label in segs:
            gt_by_class[label][vid].append((start, end))
    if not gt_by_class:
        raise ValueError("tad_map: ground truth has no segments")
    det_by_class: dict[Hashable, list] = defaultdict(list)
    for vid, dets in detections.items():
        for start, end, label, score in dets:
            det_by_class[label].append((vid, start, end, score))
    aps = np.stack([
        _class_ap(det_by_class.get(label, []), {v: np.asarray(s, dtype=np.float64) for v, s in gts.items()}, tious)
        for label, gts in gt_by_class.items()
    ])  # (classes, tious)
    per_tiou = aps.mean(axis=0)
    out = {"mAP": float(per_tiou.mean())}
    out.update({f"mAP@{t:g}": float(v) for t, v in zip(tious, per_tiou)})
    return out


# ---------------------------------------------------------------- TAD mAP of many bootstrap resamples at once

def _match_one_video(dets: list[tuple], gts: np.ndarray, tious: Sequence[float]) -> np.ndarray:
    """(T, n) true positives of one video's detections of one class [(start, end, score)], best score first (ties in
    input order), matched greedily to its ground truth (G, 2) as _class_ap does: matching never crosses videos."""
    tp = np.zeros((len(tious), len(dets)))
    taken = np.zeros((len(tious), len(gts)), dtype=bool)
    for rank, (start, end, _) in enumerate(dets):
        if not len(gts):
            continue
        ious = segment_iou((start, end), gts)
        for g in np.argsort(-ious, kind="stable"):
            for t, thr in enumerate(tious):
                if ious[g] >= thr and not taken[t, g] and not tp[t, rank]:
                    taken[t, g] = True
                    tp[t, rank] = 1
    return tp


def tad_tables(detections: Sequence[list], ground_truth: Sequence[list], tious: Sequence[float] = TIOUS) -> dict:
    """What tad_map_resamples needs of one seed's detections of n videos (lists indexed by video): per class, every
    detection's video, its true-positive flags (matched within its own video, once) and the global score order;
    per class and video, the ground truth count."""
    n = len(ground_truth)
    labels = sorted({seg[2] for g in ground_truth for seg in g} | {d[2] for ds in detections for d in ds}, key=str)
    out = {}
    for c in labels:
        vid, score, tps = [], [], []
        n_gt = np.zeros(n)
        for j in range(n):
            gts = np.asarray([(a, b) for a, b, lab in ground_truth[j] if lab == c], np.float64).reshape(-1, 2)
            n_gt[j] = len(gts)
            mine = [(a, b, sc) for a, b, lab, sc in detections[j] if lab == c]
            mine = [mine[i] for i in np.argsort([-d[2] for d in mine], kind="stable")]
            if mine:
                tps.append(_match_one_video(mine, gts, tious))
                vid += [j] * len(mine)
                score += [d[2] for d in mine]
        if tps:
            tp = np.concatenate(tps, axis=1)
            order = np.lexsort((np.arange(len(vid)), np.asarray(vid), -np.asarray(score)))
            out[c] = {"vid": np.asarray(vid)[order], "tp": tp[:, order], "n_gt": n_gt}
        else:
            out[c] = {"vid": np.zeros(0, int), "tp": np.zeros((len(tious), 0)), "n_gt": n_gt}
    return out


def tad_map_resamples(tables: dict, idx: np.ndarray, n_tious: int) -> np.ndarray:
    """tad_map of each resample of the videos (idx (B, n) video indices; a video drawn twice counts twice):
    (B, 1 + T) = mAP, then mAP@t for each tIoU, from tad_tables. Equal to tad_map on the resampled lists up to the
    order of exactly tied scores of different videos."""
    n = len(next(iter(tables.values()))["n_gt"]) if tables else 0
    out = np.zeros((len(idx), 1 + n_tious))
    for b, row in enumerate(idx):
        counts = np.bincount(row, minlength=n)
        aps = []
        for t in tables.values():
            n_gt = float(counts @ t["n_gt"])
            if n_gt == 0:
                continue  # a class absent from this resample's ground truth is not averaged
            w = counts[t["vid"]]
            tp = np.repeat(t["tp"], w, axis=1)                           # (T, m): each drawn copy of a detection
            if not tp.shape[1]:
                aps.append(np.zeros(n_tious))
                continue
            tp_cum = np.cumsum(tp, axis=1)
            recall = tp_cum / n_gt
            precision = tp_cum / np.arange(1, tp.shape[1] + 1)
            env = np.maximum.accumulate(np.concatenate([precision, np.zeros((n_tious, 1))], axis=1)[:, ::-1],
                                        axis=1)[:, ::-1][:, :-1]
            d_rec = np.diff(np.concatenate([np.zeros((n_tious, 1)), recall], axis=1), axis=1)
            aps.append((d_rec * env).sum(1))
        per_tiou = np.mean(aps, axis=0) if aps else np.full(n_tious, np.nan)
        out[b] = np.r_[per_tiou.mean(), per_tiou]
    return out
