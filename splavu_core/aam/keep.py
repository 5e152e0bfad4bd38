"""Keep what the tasks need: a closed-form, k-dimensional subspace fitted from utility labels only.

The appearance projection (appearance_projection.py) looks for appearance and removes it; on this encoder
appearance is spread over nearly every direction and read non-linearly, so removal has little room. The keep family
does the dual: publish only the k directions that carry the most *utility* per unit of everything else.

    S_util = sum_t  S_t / tr(S_t)            between-class scatter of each co-trained task t:
                                             ar: action classes of the AR training clips
                                             tad: segment class and phase (start .. end; tad_phases)
                                                  of each TAD training clip, or background
                                             ad: anomalous interval vs normal clip (video label if no intervals)
           + w_motion * S_motion / tr(S_total)  within-video scatter of moving clips: appearance is constant
                                             within a video, motion is not (the generic signal for tasks never
                                             seen); in units of the total variance, so its ratio is at most its
                                             within-video share and it fills the space after the tasks' directions
           + w_dynamic * S_dyn / tr(S_total)  scatter of what motion adds to a video: each moving clip minus
                                             the mean of its own video's static clips (same person, same scene:
                                             appearance cancels, the action's content stays, across videos too)
    S_rest = S_total / tr(S_total)  +  w_app * S_app / tr  +  ridge * I / D     (S_total: the training clips' covariance)
             S_app: between-video scatter of the static clips' means (who and where, nothing temporal)

ridge (keep_ridge, default 0.3) shrinks the discriminant: a ratio alone favours directions of tiny variance that
happen to separate the training classes, which do not carry over to tasks nobody trained for; on the demo's
validation videos, single-task fits kept 0.91 of the unseen tasks' utility at 0.3 and 0.68-0.73 at 1e-3.

The published feature is z = Q^T (x - mu), Q an orthonormal basis of the span of the top-k generalised
eigenvectors of (S_util, S_rest): k wide, in the raw features' own geometry. Private-attribute labels are never read: static clips
enter only through S_app, unlabelled.
"""
from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from splavu_core.tasks.features import VideoFeatures
from splavu_core.tasks.heads import clip_grid

KEEP_TASKS = ("ar", "tad", "ad")


@dataclass
class KeepFit:
    mean: np.ndarray         # (D,)
    proj: np.ndarray         # (D, k)
    eigenvalues: np.ndarray  # (D,) utility-to-rest ratios, descending


def between_class_scatter(x: np.ndarray, labels: np.ndarray) -> np.ndarray:
    """sum_c n_c (m_c - m)(m_c - m)^T / N: (D, D)."""
    m = x.mean(0)
    out = np.zeros((x.shape[1],) * 2)
    for c in np.unique(labels):
        d = x[labels == c].mean(0) - m
        out += (labels == c).sum() * np.outer(d, d)
    return out / len(x)


def tad_clip_labels(video: VideoFeatures, phases: int = 1) -> np.ndarray:
    """Each clip's segment class by its centre, "" (background) outside every segment; with phases > 1 also
    which part of its segment the clip is in (start .. end): what localising a segment's boundaries needs."""
    t0, dur, centres = clip_grid(video.clip_start_s, video.clip_end_s)
    out = np.array([""] * len(centres), dtype=object)
    for start_s, end_s, label in video.meta.get("segments") or []:
        a, b = (start_s - t0) / dur, (end_s - t0) / dur
        inside = (centres >= a) & (centres <= b)
        phase = np.minimum((phases * (centres - a) / max(b - a, 1e-9)).astype(int), phases - 1)
        out[inside] = [f"{label}/{p}" if phases > 1 else label for p in phase[inside]]
    return out


def ad_clip_labels(video: VideoFeatures) -> np.ndarray:
    """1 for clips inside an annotated anomalous interval; the video label where there are no intervals."""
    intervals = video.meta.get("anomaly_intervals") or []
    if not intervals:
        return np.full(len(video.feats), int(video.meta["anomaly"]))
    mid = (np.asarray(video.clip_start_s) + np.asarray(video.clip_end_s)) / 2
    return np.any([(mid >= a) & (mid <= b) for a, b in intervals], axis=0).astype(int)


def task_clips(task: str, videos: Sequence[VideoFeatures], tad_phases: int = 1) -> tuple[np.ndarray, np.ndarray]:
    """(N, D) training clips of a task and their utility label."""
    x = np.concatenate([v.feats for v in videos]).astype(np.float64)
    if task == "ar":
        y = np.concatenate([[v.meta["action"]] * len(v.feats) for v in videos])
    elif task == "tad":
        y = np.concatenate([tad_clip_labels(v, tad_phases) for v in videos])
    else:
        y = np.concatenate([ad_clip_labels(v) for v in videos])
    return x, np.asarray(y).astype(str)


def _normalised(s: np.ndarray) -> np.ndarray:
    return s / max(np.trace(s), 1e-12)


def within_action_static(static: np.ndarray, static_ids: Sequence[str],
                         ar_videos: Sequence[VideoFeatures]) -> np.ndarray:
    """static: (V, K, D) static clips of the training videos, static_ids their videos -> (V', 1, D): each AR training
    video's mean static clip minus its action's mean of them (V' the static-bearing AR training videos): the stills'
    scatter that is not the action's context (fit_keep's S_app with keep_app_within). Reads the action label only."""
    action = {v.video_id: v.meta["action"] for v in ar_videos}
    rows = [i for i, vid in enumerate(static_ids) if vid in action]
    if len(rows) < 2:
        raise ValueError(f"keep_app_within needs static clips of >= 2 AR training videos, found {len(rows)}")
    means = np.asarray(static, np.float64)[rows].mean(1)                                 # (V', D)
    _, y = np.unique([action[static_ids[i]] for i in rows], return_inverse=True)
    centres = np.stack([means[y == c].mean(0) for c in range(y.max() + 1)])              # (A, D)
    return (means - centres[y])[:, None, :].astype(np.float32)


def fit_keep(task_videos: dict[str, Sequence[VideoFeatures]], static: np.ndarray, k: int, *,
             w_motion: float, w_app: float, ridge: float, tad_phases: int, w_dynamic: float,
             dynamic: Sequence[np.ndarray] = ()) -> KeepFit:
    """task_videos: task -> its training videos (only the tasks to keep); static: (V, K, D) static clips of the
    training videos (used unlabelled, for S_app); dynamic: per static-bearing video, its moving clips minus its
    static clips' mean, (n_i, D) each (unlabelled, for S_dyn). Returns the k-wide projection. The weights have no
    defaults here: TrainConfig's keep_* fields are their one source (train.fit_utility_keep)."""
    unknown = set(task_videos) - set(KEEP_TASKS)
    assert not unknown, f"unknown task(s) {sorted(unknown)}; choose from {KEEP_TASKS}"
    videos = [v for vs in task_videos.values() for v in vs]
    assert videos, "fit_keep needs the training videos of at least one task"
    D = videos[0].feats.shape[1]
    assert 0 < k <= D, f"k must be in (0, {D}], got {k}"
    clips = np.concatenate([v.feats for v in videos]).astype(np.float64)
    mu = clips.mean(0)
    s_util = np.zeros((D, D))
    for task, vs in task_videos.items():
        x, y = task_clips(task, vs, tad_phases)
        if len(np.unique(y)) > 1:
            s_util += _normalised(between_class_scatter(x, y))
    total = np.cov(clips, rowvar=False)
    multi = [v.feats.astype(np.float64) for v in videos if len(v.feats) >= 2]
    if w_motion > 0 and multi:  # in units of the total variance: a direction's ratio is its within-video share (<= 1),
        dev = np.concatenate([f - f.mean(0) for f in multi])  # so motion fills the space after the tasks' directions
        s_util += w_motion * (dev.T @ dev / len(dev)) / np.trace(total)
    if w_dynamic > 0 and len(dynamic):
        s_util += w_dynamic * np.cov(np.concatenate(dynamic).astype(np.float64), rowvar=False) / np.trace(total)
    s_rest = total / np.trace(total)
    if w_app > 0 and static.ndim == 3 and len(static) > 1:
        s_rest += w_app * _normalised(np.cov(static.astype(np.float64).mean(1), rowvar=False))
    s_rest += ridge * np.eye(D) / D
    # generalised symmetric eigenproblem S_util u = lambda S_rest u, through S_rest's Cholesky factor
    chol = np.linalg.cholesky(s_rest)
    inv = np.linalg.inv(chol)
    w, v = np.linalg.eigh(inv @ s_util @ inv.T)
    order = np.argsort(w)[::-1]
    # an orthonormal basis of the top-k subspace: the raw geometry within it (a whitened basis, U^T S_rest U = I,
    # gave TAD 0.32 instead of 0.39 mAP on the demo: it blows the subspace's noise up to the signal's scale)
    proj = np.linalg.qr(inv.T @ v[:, order[:k]])[0]                   # (D, k), proj^T proj = I
    return KeepFit(mean=mu.astype(np.float32), proj=proj.astype(np.float32), eigenvalues=w[order])


def apply_keep(fit: KeepFit, x: np.ndarray) -> np.ndarray:
    return ((np.asarray(x, np.float32) - fit.mean) @ fit.proj).astype(np.float32)  # (N, k)


# ---------------------------------------------------------------- recentring: who leaves with the video's mean
# In the kept space a video's clips share an offset that carries both what the video shows and who is in it, and
# a fresh non-linear attacker reads the second from it. Recentring replaces each video's kept mean with a mixture
# of centroids, weighted by a posterior under a shared-covariance Gaussian model: each centroid averages many
# people, so the offset that says who leaves. By default (train.recentre_targets, per_clip) the centroids are
# k-means clusters of the fitted tasks' training CLIPS, which reads no label, each clip is matched on its own and
# the video moves by the mean of its clips' offsets: a long video of several activities keeps its mix, and only
# the offset all its clips share (who is in it) goes. Else they are the trained classes (the AR actions and, when
# AD is trained, normal / anomalous AD videos) matched on the video's mean, which writes the fit's own prediction
# over every video-level signal it had no label for (unseen AD fell to chance).
# The within-video deviations (motion, phases: what TAD and AD need) stay. A video far from every centroid (judged
# against the training videos' own distances) is moved proportionally less, so what the training videos never
# showed keeps most of its own mean. Never reads a private attribute.

@dataclass
class RecentreFit:
    centroids: np.ndarray    # (C, k) training classes' mean kept video means
    precision: np.ndarray    # (k, k) inverse within-class covariance of kept video means (shrunk)
    gate: np.ndarray         # () squared Mahalanobis distance past which a video is moved less (a training quantile)
    per_clip: bool = False   # centroids of clips: each clip matched on its own (apply_recentre)


def fit_recentre(means: np.ndarray, labels: Sequence[str], quantile: float, shrink: float = 1e-3,
                 per_clip: bool = False) -> RecentreFit:
    """means: (V, k) kept video means of the training videos (per_clip: their kept clips); labels: (V,) their class
    or cluster; quantile: TrainConfig.recentre_quantile."""
    labels = np.asarray(labels)
    classes = np.unique(labels)
    assert len(classes) >= 2, f"recentring needs >= 2 classes, got {classes.tolist()}"
    means = np.asarray(means, np.float64)
    cent = np.stack([means[labels == c].mean(0) for c in classes])                       # (C, k)
    within = means - cent[np.searchsorted(classes, labels)]                               # (V, k)
    cov = np.cov(within, rowvar=False).reshape(means.shape[1], means.shape[1])
    cov += shrink * np.trace(cov) / len(cov) * np.eye(len(cov))                          # scale-free ridge
    prec = np.linalg.inv(cov)
    d2 = np.einsum("vk,kl,vl->v", within, prec, within)
    return RecentreFit(centroids=cent.astype(np.float32), precision=prec.astype(np.float32),
                       gate=np.asarray(np.quantile(d2, quantile), np.float32), per_clip=per_clip)


def clip_uniforms(x: np.ndarray) -> np.ndarray:
    """(..., D) clips -> (...) float64 in [0, 1): a hash of each clip's float32 bytes. A drawn centroid is keyed by
    it, so a clip draws the same centroid in any batch, on any machine, each time it is published (no generator
    state to keep), and two clips draw independently."""
    rows = np.ascontiguousarray(x, np.float32).reshape(-1, np.shape(x)[-1])
    keys = [int.from_bytes(hashlib.blake2b(r.tobytes(), digest_size=8).digest(), "little") for r in rows]
    return (np.array(keys, np.float64) / 2.0 ** 64).reshape(np.shape(x)[:-1])


def top_cut(w: np.ndarray, top: int) -> np.ndarray:
    """(T, C) posterior weights with all but each row's `top` largest set to 0 (top 0: unchanged), not renormalised."""
    if not top:
        return w
    return np.where(w >= -np.sort(-w, 1)[:, min(top, w.shape[1]) - 1][:, None], w, 0.0)


def drawn(w: np.ndarray, u: np.ndarray) -> np.ndarray:
    """(T, C) posterior weights (rows summing to 1), (T,) uniforms -> (T, C) one-hot: randomised response, the centroid
    where each row's CDF passes its uniform."""
    pick = np.minimum([np.searchsorted(c, x) for c, x in zip(w.cumsum(1), u)], w.shape[1] - 1)
    return np.eye(w.shape[1], dtype=w.dtype)[pick]


def apply_recentre(fit: RecentreFit, z: np.ndarray, draw: float = 0.0, u: np.ndarray | None = None,
                   top: int = 0) -> np.ndarray:
    """z: (T, k) the kept clips of ONE video -> (T, k), the video's mean replaced by its expected centroid; per_clip:
    the video moved by the mean over its clips of each clip's offset to its own expected centroid (the posterior cut
    to its `top` most likely centroids when top > 0), or with draw = T > 0 to ONE centroid per clip drawn from the
    posterior at temperature T by u (T,) (clip_uniforms of the raw clips)."""
    z = np.asarray(z, np.float32)
    if fit.per_clip:
        d = z[:, None, :] - fit.centroids                                                 # (T, C, k)
        q = np.einsum("tck,kl,tcl->tc", d, fit.precision, d)                              # (T, C)
        w = top_cut(np.exp(-0.5 * (q - q.min(1, keepdims=True)) / (draw or 1.0)), top)
        w /= w.sum(1, keepdims=True)
        if draw:
            w = drawn(w, u)                                                               # (T, C) one-hot
        s = np.minimum(1.0, float(fit.gate) / np.maximum(q.min(1), 1e-12))                # (T,)
        return (z + (s[:, None] * (w @ fit.centroids - z)).mean(0)).astype(np.float32)
    m = z.mean(0)                                                                         # (k,)
    d = m - fit.centroids                                                                 # (C, k)
    q = np.einsum("ck,kl,cl->c", d, fit.precision, d)                                     # (C,) squared distances
    w = np.exp(-0.5 * (q - q.min()))
    w /= w.sum()
    scale = min(1.0, float(fit.gate) / max(float(q.min()), 1e-12))
    return (z + scale * (w @ fit.centroids - m)).astype(np.float32)
