"""The closed-form stages of an adapter, fitted from the training data with no step of gradient descent: the
appearance projection (aam/appearance_projection.py), the keep subspace and recentring (aam/keep.py).

The default adapter (TrainConfig's defaults: keep + recentring) is these stages alone; `fit_closed_form` gives the same maps as
numpy for the keep curve."""
from __future__ import annotations

import dataclasses

import numpy as np
import torch

from splavu_core.aam.config import TrainConfig
from splavu_core.aam.training_data import TrainingData, TrainingDataError
from splavu_core.tasks.features import VideoFeatures


def fit_appearance_projection(data: TrainingData, fit_idx: np.ndarray, rank: int, w_action: float = 1.0,
                              w_temporal: float = 0.0):
    """The appearance projection as aam_model fits it: the fit videos' static clips against the AR classes' spread
    (and, with w_temporal, the training videos' within-video spread). Returns an appearance_projection.ProjectionFit."""
    from splavu_core.aam.appearance_projection import fit_projection

    clips = labels = None
    if data.ar_train and w_action > 0:
        clips = np.concatenate([v.feats for v in data.ar_train])
        labels = np.concatenate([[v.meta["action"]] * len(v.feats) for v in data.ar_train])
    videos = [v.feats for v in data.ar_train + data.tad_train + data.ad_train]
    return fit_projection(data.static[fit_idx], rank, clips, labels, w_action=w_action, video_clips=videos,
                          w_temporal=w_temporal)


def fit_utility_keep(data: TrainingData, tasks, k: int, cfg: TrainConfig, transform=None):
    """The keep stage as aam_model fits it, with cfg's keep_* fields: the training videos of `tasks` (utility labels
    only) and the static clips, unlabelled; `transform` (the projection, when there is one) applied first."""
    from splavu_core.aam.keep import fit_keep, within_action_static

    f = transform or (lambda x: x)
    train = {"ar": data.ar_train, "tad": data.tad_train, "ad": data.ad_train}
    task_videos = {t: [dataclasses.replace(v, feats=f(v.feats)) for v in train[t]] for t in tasks if train[t]}
    if not task_videos:  # no utility labels at all: motion directions of every training video
        task_videos = {"ar": [dataclasses.replace(v, feats=f(v.feats), meta={"action": "_"})
                              for v in data.ar_train + data.tad_train + data.ad_train]}
    static = f(data.static.reshape(-1, data.dim)).reshape(data.static.shape) if len(data.static) else data.static
    dynamic = [] if cfg.keep_w_dynamic <= 0 or data.static_actions is None else \
        [f(a) - s.mean(0) for a, s in zip(data.static_actions, static) if len(a)]  # (n_i, D): what motion adds
    if cfg.keep_w_app > 0 and cfg.keep_app_within and len(static):
        static = within_action_static(static, data.static_ids, data.ar_train)  # (V', 1, D), for S_app only
    return fit_keep(task_videos, static, k, w_motion=cfg.keep_w_motion, w_app=cfg.keep_w_app,
                    tad_phases=cfg.keep_tad_phases, w_dynamic=cfg.keep_w_dynamic, dynamic=dynamic,
                    ridge=cfg.keep_ridge)


def recentre_classes(data: TrainingData, tasks) -> tuple[list[VideoFeatures], list[str]]:
    """The videos whose kept means define the recentring centroids, and their class: each AR training video's action
    and, when AD is trained, each AD training video's video label (normal / anomalous: what a whole AD video is)."""
    videos = list(data.ar_train) if "ar" in tasks else []
    labels = [v.meta["action"] for v in videos]
    if "ad" in tasks and videos:
        ad = [v for v in data.ad_train if v.meta.get("anomaly") is not None]
        videos += ad
        labels += [f"anomaly={int(v.meta['anomaly'])}" for v in ad]
    return videos, labels


def recentre_pool(data: TrainingData, tasks) -> list[VideoFeatures]:
    """The videos whose kept clips the clusters are fitted on: the fitted tasks' training videos (every training
    video when no task is fitted, as the keep fit's motion directions); read unlabelled."""
    train = {"ar": data.ar_train, "tad": data.tad_train, "ad": data.ad_train}
    return [v for t in tasks for v in train[t]] or [v for vs in train.values() for v in vs]


def n_centroids(data: TrainingData, tasks, cfg: TrainConfig) -> int:
    """How many centroids recentring will fit (0 or 1: none to recentre on), known before any fit."""
    if cfg.recentre_on == "classes":
        return len(set(recentre_classes(data, tasks)[1]))
    clips = sum(len(v.feats) for v in recentre_pool(data, tasks))
    return min(clips, max(2, clips // cfg.recentre_cluster_clips))


def recentre_targets(data: TrainingData, tasks, cfg: TrainConfig, publish) -> tuple[np.ndarray, list[str]]:
    """((V, k) kept video means or (N, k) kept clips, their centroid label) that fit_recentre reads; publish: (T, D)
    -> (T, k), the adapter without recentring. 'classes': the video means of the utility classes (recentre_classes).
    'clips': k-means of the pool's kept clips (n_centroids of them, seeded by cfg.seed); no label of any kind."""
    from sklearn.cluster import KMeans

    if cfg.recentre_on == "classes":
        videos, labels = recentre_classes(data, tasks)
        return np.stack([publish(v.feats).mean(0) for v in videos]), labels
    pool = recentre_pool(data, tasks)
    clips = np.concatenate([publish(v.feats) for v in pool]).astype(np.float64)       # (N, k)
    c = n_centroids(data, tasks, cfg)
    labels = KMeans(c, n_init=cfg.recentre_restarts, random_state=cfg.seed).fit_predict(clips)
    if len(set(labels)) != c:
        raise TrainingDataError(f"recentring on clips: k-means found {len(set(labels))} distinct clusters of {c} "
                                f"asked for in {len(clips)} training clips (duplicate clips?); raise "
                                f"recentre_cluster_clips")
    people = np.concatenate([[person(v)] * len(v.feats) for v in pool])                # (N,)
    labels = pooled_clusters(clips, labels, people, cfg.recentre_min_people)
    return clips, [f"c{i:05d}" for i in labels]


def person(video: VideoFeatures) -> str:
    """Who a training video shows, for recentre_min_people: its subject_id, else the video itself (a person of its
    own: then the guarantee counts videos)."""
    sid = video.meta.get("subject_id")
    return f"subject:{sid}" if sid not in (None, "") else f"video:{video.video_id}"


def pooled_clusters(x: np.ndarray, labels: np.ndarray, people: np.ndarray, min_people: int) -> np.ndarray:
    """x (N, k) clips, labels (N,) their k-means cluster, people (N,) whose clip each is -> labels where every cluster
    holds clips of >= min_people people: the cluster of the fewest people, while that is fewer, joins the cluster
    whose centroid is nearest to its own. So every published centroid averages at least min_people people (what a
    version's parameters hold of any one person; docs/threat-model.md). Two clusters are always left for recentring
    to move between: a store whose training videos show too few people for two such clusters keeps two, and the
    adapter's record says how many people its smallest one holds (fit_recentre_into's fewest_people)."""
    if min_people <= 1:
        return labels
    labels = labels.copy()
    members = {c: set(people[labels == c]) for c in np.unique(labels)}
    cents = {c: x[labels == c].mean(0) for c in members}
    size = {c: int((labels == c).sum()) for c in members}
    while len(members) > 2:
        c = min(members, key=lambda m: (len(members[m]), m))
        if len(members[c]) >= min_people:
            break
        others = [m for m in members if m != c]
        into = min(others, key=lambda m: float(((cents[m] - cents[c]) ** 2).sum()))
        cents[into] = (cents[into] * size[into] + cents[c] * size[c]) / (size[into] + size[c])
        size[into] += size.pop(c)
        members[into] |= members.pop(c)
        del cents[c]
        labels[labels == c] = into
    return labels


def fit_closed_form(data: TrainingData, tasks, k: int, cfg: TrainConfig) -> dict:
    """The default adapter's closed-form stages as numpy, for the keep curve, from one keep fit: {False: the keep map,
    True: keep then recentring (only when `tasks` give >= 2 centroids, as train_aam decides)}, each a per-video map
    (T, D) -> (T, k); train_aam's adapter gives the same rows (tests/test_keep.py)."""
    from splavu_core.aam.keep import apply_keep, apply_recentre, clip_uniforms, fit_recentre

    fit = fit_utility_keep(data, tasks, k, cfg)
    maps = {False: lambda f: apply_keep(fit, f)}
    if n_centroids(data, tasks, cfg) >= 2:
        means, labels = recentre_targets(data, tasks, cfg, lambda f: apply_keep(fit, f))
        rfit = fit_recentre(means, labels, cfg.recentre_quantile, per_clip=cfg.recentre_on == "clips")
        per_clip = cfg.recentre_on == "clips"  # drawn or cut per clip only (train.adapter_config drops both else)
        draw = cfg.recentre_draw if per_clip else 0.0
        top = cfg.recentre_top if per_clip else 0
        maps[True] = lambda f: apply_recentre(rfit, apply_keep(fit, f), draw, clip_uniforms(f) if draw else None, top)
    return maps


def _load_buffers(module, **arrays) -> None:
    """Copy fitted numpy arrays into a frozen stage's buffers of the same names."""
    with torch.no_grad():
        for name, a in arrays.items():
            getattr(module, name).copy_(torch.from_numpy(a))


def fit_keep_into(adapter, data: TrainingData, cfg: TrainConfig, log) -> dict:
    """The keep stage (fit_utility_keep, after the adapter's own projection when it has one), installed into the
    adapter; returns its record (k, tasks, the leading eigenvalues)."""
    transform = None
    if adapter.projection is not None:  # the keep stage sees what the adapter's own (fitted) projection leaves
        def transform(x):
            with torch.no_grad():
                return adapter.projection(torch.from_numpy(np.ascontiguousarray(x, np.float32))).numpy()
    k = adapter.cfg.keep
    fit = fit_utility_keep(data, cfg.tasks, k, cfg, transform)
    _load_buffers(adapter.keep, mean=fit.mean, proj=fit.proj)
    ev = fit.eigenvalues
    if log:
        log(f"keep: publishing {k} utility directions of {data.dim} (tasks {', '.join(cfg.tasks) or 'none: motion'}; "
            f"utility ratio {ev[0]:.3f} .. {ev[k - 1]:.3f}; largest dropped {ev[k]:.3f})")
    return {"k": k, "tasks": list(cfg.tasks), "eigenvalues": [round(float(x), 5) for x in ev[:2 * k + 1]]}


def fit_recentre_into(adapter, stage, data: TrainingData, cfg: TrainConfig, log) -> dict:
    """The recentring stage from its training videos' published means (the adapter without it) and their centroid
    (recentre_targets: clusters of clips, or utility classes); installed into the adapter."""
    from splavu_core.aam.keep import fit_recentre

    def publish(x):
        with torch.no_grad():
            return adapter(torch.from_numpy(np.ascontiguousarray(x, np.float32))).numpy()

    means, labels = recentre_targets(data, cfg.tasks, cfg, publish)
    fit = fit_recentre(means, labels, cfg.recentre_quantile, per_clip=cfg.recentre_on == "clips")
    if len(fit.centroids) != len(stage.centroids):  # clusters of too few people pooled (pooled_clusters)
        adapter.cfg = dataclasses.replace(adapter.cfg, centroids=len(fit.centroids))
        stage = type(stage)(adapter.cfg.keep, len(fit.centroids), stage.per_clip, stage.draw, stage.top)
    _load_buffers(stage, centroids=fit.centroids, precision=fit.precision, gate=fit.gate)
    adapter.recentre = stage
    if log:
        what = "k-means clusters of the training clips" if cfg.recentre_on == "clips" else "trained classes"
        log(f"recentre: each video's kept mean -> its expected centroid among {len(fit.centroids)} {what} "
            f"(moved less past the {cfg.recentre_quantile:.0%} quantile of training distances, {float(fit.gate):.2f})")
    out = {"classes": len(fit.centroids), "on": cfg.recentre_on, "quantile": cfg.recentre_quantile,
           "gate": round(float(fit.gate), 4)}
    if cfg.recentre_on == "clips":  # what the centroids hold of any one person
        pool = recentre_pool(data, cfg.tasks)
        people = np.concatenate([[person(v)] * len(v.feats) for v in pool])
        out["min_people"] = cfg.recentre_min_people
        out["fewest_people"] = int(min(len(set(people[np.asarray(labels) == c])) for c in set(labels)))
        if out["fewest_people"] < cfg.recentre_min_people and log:
            log(f"recentre: the training videos show {len(set(people))} people, too few for 2 centroids of "
                f">= {cfg.recentre_min_people} people each (recentre_min_people); the smallest of the 2 kept holds "
                f"{out['fewest_people']}")
    return out


def fit_projection_into(adapter, data: TrainingData, fit_idx: np.ndarray, cfg: TrainConfig, log) -> dict:
    """The appearance projection (fit_appearance_projection on the fit videos), installed into the adapter; returns its
    record (rank, the leading eigenvalues)."""
    rank = adapter.cfg.projection_rank
    fit = fit_appearance_projection(data, fit_idx, rank, cfg.projection.projection_w_action,
                                    cfg.projection.projection_w_temporal)
    _load_buffers(adapter.projection, mean=fit.mean, read=fit.read, write=fit.write)
    ev = fit.eigenvalues
    if log:
        log(f"appearance projection: removed {rank} appearance directions (ratio {ev[0]:.2f} .. {ev[rank - 1]:.2f}; "
            f"largest left {ev[rank]:.2f})")
    return {"rank": rank, "eigenvalues": [round(float(e), 4) for e in ev[:2 * rank + 1]]}
