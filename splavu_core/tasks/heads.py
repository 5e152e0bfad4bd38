"""Task heads and their losses, shared by AAM co-training and by the evaluation probes.

Shapes: B videos, T clips per video, D feature width (any), C classes. Every head works on any D and is
deterministic given torch.manual_seed. Time inside the TAD head is in *clip units* (1 = one clip), derived
from the clip times, so nothing here assumes a frame rate.

- AR:  ARHead, a linear classifier; train with plain F.cross_entropy.
- TAD: TADHead (masked temporal convs) + tad_targets (centre sampling) + tad_loss (focal + 1-D GIoU)
       + tad_decode (per-class soft/hard 1-D NMS).
- AD:  ADHead (per-clip anomaly MLP) + ad_segments (32 segments per video) + ad_mil_loss (top-k MIL).
"""
from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

from splavu_core.tasks.features import VideoFeatures
from splavu_core.tasks.metrics import segment_iou

AD_SEGMENTS = 32


# ================================================================ AR

class ARHead(nn.Module):
    """Linear action classifier: (..., D) -> (..., C) logits."""

    def __init__(self, dim: int, n_classes: int):
        super().__init__()
        self.fc = nn.Linear(dim, n_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(x)


# ================================================================ TAD

class TADHead(nn.Module):
    """Two masked temporal convs (kernel 3) -> per-clip class logits and distances to the segment boundaries.

    forward(x (B, T, D), mask (B, T) bool, True = real clip) -> cls_logits (B, T, C), reg (B, T, 2) >= 0,
    where reg = (left, right) distance from the clip centre to the segment start / end, in clip units.
    Padded positions are zeroed before every conv, so a video's output does not depend on its batch.
    """

    MAX_LOG_DIST = math.log(1e4)  # exp() overflow guard; no segment is 10^4 clips long

    def __init__(self, dim: int, n_classes: int, hidden: int = 128, prior_prob: float = 0.01):
        super().__init__()
        self.convs = nn.ModuleList([nn.Conv1d(dim, hidden, 3, padding=1), nn.Conv1d(hidden, hidden, 3, padding=1)])
        self.cls = nn.Conv1d(hidden, n_classes, 1)
        self.reg = nn.Conv1d(hidden, 2, 1)
        # Focal-loss prior (RetinaNet): start predicting "background" so the many negatives don't swamp early steps.
        nn.init.constant_(self.cls.bias, -math.log((1 - prior_prob) / prior_prob))

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        assert x.ndim == 3, f"TADHead expects (B, T, D), got {tuple(x.shape)}"
        if mask is None:
            mask = torch.ones(x.shape[:2], dtype=torch.bool, device=x.device)
        m = mask[:, None, :].to(x.dtype)                       # (B, 1, T)
        h = x.transpose(1, 2) * m                              # (B, D, T)
        for conv in self.convs:
            h = F.relu(conv(h)) * m                            # (B, H, T), padding stays zero
        cls_logits = self.cls(h).transpose(1, 2)               # (B, T, C)
        reg = torch.exp(self.reg(h).clamp(max=self.MAX_LOG_DIST)).transpose(1, 2)  # (B, T, 2), > 0 with gradient
        return cls_logits, reg


def pad_sequences(seqs) -> tuple[torch.Tensor, torch.Tensor]:
    """List of (T_i, D) arrays/tensors -> x (B, T_max, D) zero-padded, mask (B, T_max) bool. Keeps autograd."""
    assert len(seqs) > 0, "pad_sequences: empty batch"
    seqs = [s if torch.is_tensor(s) else torch.as_tensor(np.asarray(s, dtype=np.float32)) for s in seqs]
    lengths = torch.tensor([len(s) for s in seqs])
    x = nn.utils.rnn.pad_sequence(seqs, batch_first=True)  # (B, T_max, D)
    mask = torch.arange(x.shape[1])[None, :] < lengths[:, None]
    return x, mask.to(x.device)


def clip_grid(clip_start_s, clip_end_s) -> tuple[float, float, np.ndarray]:
    """Clip-unit coordinates: (t0 seconds, clip duration seconds, clip centres (T,) in clip units from t0)."""
    clip_start_s, clip_end_s = np.asarray(clip_start_s, np.float64), np.asarray(clip_end_s, np.float64)
    t0 = float(clip_start_s[0])
    dur = float(np.median(clip_end_s - clip_start_s))
    assert dur > 0, f"clip durations must be positive, got median {dur}"
    return t0, dur, ((clip_start_s + clip_end_s) / 2 - t0) / dur


def tad_targets(video: VideoFeatures, classes: list[str], radius: float = 1.5) -> dict[str, np.ndarray]:
    """Per-clip TAD targets from meta['segments'], with centre sampling (FCOS / TriDet).

    A clip is positive for a segment when its centre lies in the segment *and* within `radius` clips of the
    segment's midpoint; where segments compete for a clip the shortest wins. A segment containing no clip
    centre gets no positive (it cannot be localised at clip resolution).
    Returns cls (T, C) one-hot on positives, reg (T, 2) (left, right) distances in clip units, pos (T,) bool.
    """
    index = {c: i for i, c in enumerate(classes)}
    t0, dur, centres = clip_grid(video.clip_start_s, video.clip_end_s)
    T = len(centres)
    cls = np.zeros((T, len(classes)), np.float32)
    reg = np.zeros((T, 2), np.float32)
    owner_len = np.full(T, np.inf)  # length of the segment that currently owns each clip
    for start_s, end_s, label in video.meta.get("segments") or []:
        assert label in index, f"{video.video_id}: segment label {label!r} not in classes {classes}"
        a, b = (start_s - t0) / dur, (end_s - t0) / dur
        mid = (a + b) / 2
        lo, hi = max(a, mid - radius), min(b, mid + radius)
        take = (centres >= lo) & (centres <= hi) & (b - a < owner_len)
        cls[take] = 0
        cls[take, index[label]] = 1
        reg[take] = np.stack([centres[take] - a, b - centres[take]], axis=1)
        owner_len[take] = b - a
    return {"cls": cls, "reg": reg, "pos": np.isfinite(owner_len)}


def stack_tad_targets(targets: list[dict[str, np.ndarray]], T: int | None = None) -> dict[str, torch.Tensor]:
    """Pad per-video targets to (B, T, ...) tensors (padding: negative, zero distances)."""
    T = T or max(len(t["pos"]) for t in targets)
    out = {}
    for key in ("cls", "reg", "pos"):
        first = targets[0][key]
        buf = np.zeros((len(targets), T) + first.shape[1:], dtype=first.dtype)
        for i, t in enumerate(targets):
            buf[i, : len(t[key])] = t[key]
        out[key] = torch.from_numpy(buf)
    return out


def sigmoid_focal_loss(logits: torch.Tensor, targets: torch.Tensor, alpha: float = 0.25,
                       gamma: float = 2.0) -> torch.Tensor:
    """Element-wise sigmoid focal loss (RetinaNet), no reduction."""
    p = torch.sigmoid(logits)
    ce = F.binary_cross_entropy_with_logits(logits, targets, reduction="none")
    p_t = p * targets + (1 - p) * (1 - targets)
    alpha_t = alpha * targets + (1 - alpha) * (1 - targets)
    return alpha_t * ce * (1 - p_t) ** gamma


def giou_loss_1d(pred: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """1 - GIoU of (left, right) distance pairs sharing an anchor point. (N, 2), (N, 2) -> (N,)."""
    inter = torch.minimum(pred[:, 0], target[:, 0]) + torch.minimum(pred[:, 1], target[:, 1])
    union = pred.sum(1) + target.sum(1) - inter
    hull = torch.maximum(pred[:, 0], target[:, 0]) + torch.maximum(pred[:, 1], target[:, 1])
    iou = inter / union.clamp(min=1e-8)
    return 1 - (iou - (hull - union) / hull.clamp(min=1e-8))


def tad_loss(cls_logits: torch.Tensor, reg: torch.Tensor, targets: dict[str, torch.Tensor], mask: torch.Tensor,
             reg_weight: float = 1.0) -> torch.Tensor:
    """Focal classification loss over all real clips + GIoU regression on positives, both / #positives.

    cls_logits (B, T, C), reg (B, T, 2), targets from stack_tad_targets, mask (B, T) bool.
    """
    assert cls_logits.shape[:2] == reg.shape[:2] == mask.shape == targets["pos"].shape, \
        f"tad_loss shapes: cls {tuple(cls_logits.shape)}, reg {tuple(reg.shape)}, mask {tuple(mask.shape)}, " \
        f"pos {tuple(targets['pos'].shape)}"
    pos = targets["pos"] & mask                                   # (B, T)
    n_pos = pos.sum().clamp(min=1).to(cls_logits.dtype)
    cls_loss = sigmoid_focal_loss(cls_logits[mask], targets["cls"][mask].to(cls_logits.dtype)).sum() / n_pos
    reg_loss = giou_loss_1d(reg[pos], targets["reg"][pos].to(reg.dtype)).sum() / n_pos
    return cls_loss + reg_weight * reg_loss


def nms_1d(segments: np.ndarray, scores: np.ndarray, method: str = "soft", iou_threshold: float = 0.5,
           sigma: float = 0.5, min_score: float = 1e-3) -> tuple[np.ndarray, np.ndarray]:
    """1-D NMS on (N, 2) segments. 'hard' drops overlaps > iou_threshold; 'soft' (Gaussian) decays them."""
    segments = np.asarray(segments, np.float64).reshape(-1, 2)
    (idx, kept), = nms_1d_rows(segments, np.asarray(scores, np.float64)[None], method, iou_threshold, sigma, min_score)
    return segments[idx].reshape(-1, 2), kept


def nms_1d_rows(segments: np.ndarray, scores: np.ndarray, method: str = "soft", iou_threshold: float = 0.5,
                sigma: float = 0.5, min_score: float | None = None, alive: np.ndarray | None = None
                ) -> list[tuple[np.ndarray, np.ndarray]]:
    """One 1-D NMS per row of scores (R, N) over the same (N, 2) segments (a video's classes share its clips'
    segments), all rows stepped together: per row, (indices kept in the order chosen, their scores). alive (R, N)
    says which candidates each row starts with (default: all). Each row gets exactly the arithmetic of a one-row
    NMS: the lowest-index maximum is chosen, the same IoUs decay the same float64 scores."""
    assert method in ("soft", "hard"), f"nms method must be 'soft' or 'hard', got {method!r}"
    seg = np.asarray(segments, np.float64).reshape(-1, 2)
    sc = np.array(scores, np.float64, ndmin=2)                                # (R, N), a copy: decayed in place
    live = np.ones(sc.shape, bool) if alive is None else np.array(alive, bool)
    iou = segment_iou((seg[:, :1], seg[:, 1:]), seg)                         # (N, N): row i = segment i's IoUs
    picks: list[list[int]] = [[] for _ in range(len(sc))]
    values: list[list[float]] = [[] for _ in range(len(sc))]
    rows = np.flatnonzero(live.any(1))
    while len(rows):
        best = np.where(live[rows], sc[rows], -np.inf).argmax(1)             # (r,)
        for r, b in zip(rows, best):
            picks[r].append(b)
            values[r].append(sc[r, b])
        live[rows, best] = False
        ious = iou[best]                                                      # (r, N)
        if method == "hard":
            live[rows] &= ious <= iou_threshold
        else:
            sub = sc[rows]
            sub[live[rows]] *= np.exp(-(ious[live[rows]] ** 2) / sigma)
            sc[rows] = sub
            if min_score is not None:
                live[rows] &= sc[rows] >= min_score
        rows = rows[live[rows].any(1)]
    return [(np.asarray(p, np.int64), np.asarray(v, np.float64)) for p, v in zip(picks, values)]


def tad_decode(cls_logits, reg, clip_start_s, clip_end_s, score_threshold: float = 1e-3, nms: str = "soft",
               iou_threshold: float = 0.5, sigma: float = 0.5, max_detections: int = 100) -> list[tuple]:
    """One video's head outputs -> [(start_s, end_s, class_index, score)], best first.

    cls_logits (T, C), reg (T, 2) for the video's real clips only (tensors or arrays).
    """
    cls_logits = torch.as_tensor(cls_logits).detach().float().cpu()
    reg = torch.as_tensor(reg).detach().double().cpu().numpy()
    scores = torch.sigmoid(cls_logits).numpy()                    # (T, C)
    assert scores.shape[0] == reg.shape[0] == len(clip_start_s), \
        f"tad_decode: cls {scores.shape}, reg {reg.shape}, {len(clip_start_s)} clips"
    t0, dur, centres = clip_grid(clip_start_s, clip_end_s)
    lo, hi = float(clip_start_s[0]), float(clip_end_s[-1])
    starts = np.clip(t0 + (centres - reg[:, 0]) * dur, lo, hi)  # (T,) seconds
    ends = np.clip(t0 + (centres + reg[:, 1]) * dur, lo, hi)
    alive = (scores.T > score_threshold) & (ends > starts)[None]               # (C, T): each class's candidates
    kept = nms_1d_rows(np.stack([starts, ends], 1), scores.T, nms, iou_threshold, sigma, score_threshold, alive)
    dets = [(float(starts[i]), float(ends[i]), c, float(p)) for c, (idx, sc) in enumerate(kept)
            for i, p in zip(idx, sc)]
    dets.sort(key=lambda d: -d[3])
    return dets[:max_detections]


# ================================================================ AD

class ADHead(nn.Module):
    """Per-clip (or per-segment) anomaly score: (..., D) -> (...) in (0, 1)."""

    def __init__(self, dim: int, hidden: int = 128, dropout: float = 0.0):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(dim, hidden), nn.ReLU(), nn.Dropout(dropout), nn.Linear(hidden, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.sigmoid(self.net(x)).squeeze(-1)


def segment_matrix(T: int, n: int = AD_SEGMENTS) -> np.ndarray:
    """(n, T) averaging matrix: row i averages the clips of segment i (Sultani et al. boundaries).

    With fewer clips than segments, a segment holding no clip boundary takes the clip it falls on,
    i.e. clips are repeated, so there are always n segments.
    """
    assert T >= 1, "a video needs at least one clip"
    edges = np.linspace(0, T, n + 1).astype(int)                 # (n + 1,) floor boundaries
    W = np.zeros((n, T), np.float32)
    for i in range(n):
        a, b = edges[i], edges[i + 1]
        if b > a:
            W[i, a:b] = 1.0 / (b - a)
        else:
            W[i, min(a, T - 1)] = 1.0
    return W


def ad_segments(feats, n: int = AD_SEGMENTS):
    """(T, D) clip features -> (n, D) segment features; numpy in, numpy out; tensor in, tensor out (autograd)."""
    assert feats.ndim == 2, f"ad_segments expects (T, D), got {tuple(feats.shape)}"
    W = segment_matrix(len(feats), n)
    if torch.is_tensor(feats):
        return torch.from_numpy(W).to(feats) @ feats
    return W @ np.asarray(feats, np.float32)


def ad_mil_loss(segment_scores: torch.Tensor, video_labels: torch.Tensor, k: int = 3, lam_smooth: float = 8e-4,
                lam_sparse: float = 8e-3) -> torch.Tensor:
    """Weakly supervised MIL loss (Sultani / RTFM / MGFN style).

    segment_scores (B, n) in (0, 1); video_labels (B,) in {0, 1}.
    BCE(mean of the top-k segment scores, video label); on anomalous videos only, + lam_smooth * sum of squared
    consecutive differences (anomalies are contiguous) + lam_sparse * sum of scores (anomalies are rare),
    each averaged over the anomalous videos of the batch.
    """
    assert segment_scores.ndim == 2 and video_labels.shape == segment_scores.shape[:1], \
        f"ad_mil_loss: scores {tuple(segment_scores.shape)}, labels {tuple(video_labels.shape)}"
    y = video_labels.to(segment_scores.dtype)
    k = min(k, segment_scores.shape[1])
    top = segment_scores.topk(k, dim=1).values.mean(dim=1)     # (B,)
    loss = F.binary_cross_entropy(top.clamp(1e-6, 1 - 1e-6), y)
    abnormal = segment_scores[y > 0.5]                           # (B_a, n)
    if len(abnormal):
        smooth = ((abnormal[:, 1:] - abnormal[:, :-1]) ** 2).sum(dim=1).mean()
        sparse = abnormal.sum(dim=1).mean()
        loss = loss + lam_smooth * smooth + lam_sparse * sparse
    return loss
