"""Train the AAM from cached latents only (the frozen encoder never runs here).

One joint step, as the authors' code does:

    L = w_lc * LC(h, f_A(h)) + w_ar * CE + w_tad * L_TAD + w_ad * L_AD - w_b * NTXent(f_A(s1), f_A(s2))

s1, s2: two static clips (one frame repeated) of the same training video; the other videos of the
batch are the negatives. No private-attribute label is read anywhere in this module.

LC is divided by the mean per-dimension variance of the raw latents, so w_lc means the same for
any encoder's feature scale (the paper's w_lc = 100 was tied to its features' scale).
"""
from __future__ import annotations

import copy
import dataclasses
import time
from dataclasses import asdict, dataclass, field

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

from splavu_core.aam.diagnostics import PairCritic, heldout_split, pair_matching_report
from splavu_core.aam.losses import confusion, info_nce, nt_xent
from splavu_core.aam.model import DEFAULT_ADAPTER, AAMConfig, AnonymizingAdapter, documented
from splavu_core.tasks.features import VideoFeatures
from splavu_core.tasks.heads import (
    ADHead,
    ARHead,
    TADHead,
    ad_mil_loss,
    ad_segments,
    pad_sequences,
    stack_tad_targets,
    tad_loss,
    tad_targets,
)

TASKS = ("ar", "tad", "ad")
RECENTRE_ON = ("clips", "classes")  # recentring's centroids: label-free k-means of clips, or the trained classes


class TrainingDataError(ValueError):
    """The store cannot train this configuration; raised before any step runs."""


PRIVACY_OBJECTIVES = ("critic", "ntxent")
PAIRS = ("static_static", "static_action", "both")


@dataclass
class ErasureConfig:
    """The closed-form appearance erasure (aam/erasure.py), a stage before keep or the trained blocks. Off by default
    (erase_fraction 0); on in the previous default and the keep_after_erasure variant."""
    erase_fraction: float = documented(0.0, "erasure rank = round(fraction * D), unless adapter sets erase_rank")
    erase_w_action: float = documented(1.0, "erasure fit: weight of the action-class scatter it must keep")
    erase_w_temporal: float = documented(0.0, "erasure fit: weight of the within-video (over time) scatter it must "
                                         "keep")


@dataclass
class LoopConfig:
    """The training loop: read only by adapters with a trained stage (adapter layers > 0). The default adapter is a
    closed-form fit and runs no loop."""
    selection: str = documented("val_ar", "keep the epoch with the best validation AR top-1 (\"last\": final "
                                "epoch)")
    epochs: int = documented(30, "epochs of the loop")
    batch: int = documented(128, "clips per step (AR); pairs per step: batch (critic), batch // 4 (ntxent)")
    lr: float = documented(1e-3, "learning rate of the adapter and the AR head")
    head_lr: float = documented(1e-3, "learning rate of the TAD / AD heads (own optimizers)")
    pretrain_head_epochs: int = documented(30, "TAD / AD heads first fit on raw (or kept) features")
    w_lc: float = documented(1.0, "weight of the variance-normalised latent consistency term")
    w_ar: float = documented(1.0, "weight of the AR cross-entropy")
    w_tad: float = documented(1.0, "weight of the TAD loss")
    w_ad: float = documented(1.0, "weight of the AD MIL loss")
    w_b: float = documented(1.0, "weight of the privacy term (0: none)")
    privacy: str = documented("critic", "privacy objective: \"ntxent\" = the paper's (maximise a fixed-cosine "
                              "NT-Xent of two static clips); \"critic\" = a learned critic matches pairs of one "
                              "video, the adapter is trained to confuse it")
    pairs: str = documented("both", "which pairs of one video the privacy term looks at: static_static, "
                            "static_action or both")
    temperature: float = documented(0.1, "temperature of the NT-Xent and of the critic's InfoNCE")
    critic_steps: int = documented(2, "critic updates per adapter step")
    critic_hidden: int = documented(256, "width of the critic's projection")
    critic_lr: float = documented(1e-3, "learning rate of the critic")
    diagnose_points: int = documented(4, "fresh-critic pair matching measured this many times during the loop")
    oracle: bool = documented(False, "DIAGNOSTIC ONLY: adversary on private-attribute labels (never publishable)")

    def __post_init__(self):
        if self.selection not in ("val_ar", "last"):
            raise ValueError(f"selection must be 'val_ar' or 'last', got {self.selection!r}")
        if self.privacy not in PRIVACY_OBJECTIVES:
            raise ValueError(f"privacy must be one of {PRIVACY_OBJECTIVES}, got {self.privacy!r}")
        if self.pairs not in PAIRS:
            raise ValueError(f"pairs must be one of {PAIRS}, got {self.pairs!r}")


@dataclass
class TrainConfig:
    """How aam_model fits an adapter. The fields at this level are the ones the default adapter (DEFAULT_ADAPTER:
    keep + recentring, closed form) reads; `erasure` and `loop` hold what only other adapters read.

    The CLI's --config, Dagster and the stored record (adapter.json's extra.train_config) name every field flat;
    `from_flat`, `replace` and `flat` route a flat name to its section."""
    tasks: tuple = documented(TASKS, "utility tasks fitted for (any subset; empty: the keep fit takes motion "
                              "directions, a loop trains privacy + LC only)")
    seed: int = documented(0, "seeds torch, the held-out split and the diagnostics")
    adapter: dict = field(default_factory=lambda: dict(DEFAULT_ADAPTER), metadata={"doc": "AAMConfig fields"})
    keep_w_motion: float = documented(1.0, "keep fit (adapter keep = k): weight of within-video motion kept for "
                                      "unseen tasks")
    keep_w_app: float = documented(0.0, "keep fit: weight of between-video static (appearance) scatter to avoid")
    keep_tad_phases: int = documented(3, "keep fit: a TAD segment's clips labelled by class and phase (start .. end)")
    keep_w_dynamic: float = documented(0.0, "keep fit: weight of what motion adds to a video (moving clips minus its "
                                       "static clips)")
    keep_ridge: float = documented(0.3, "keep fit: shrinkage, isotropic variance added to the rest as a share of the "
                                   "total")
    recentre_quantile: float = documented(0.95, "recentring (adapter recentre): videos farther from every centroid "
                                          "than this share of the training videos are moved less")
    recentre_on: str = documented("clips", "recentring's centroids: 'clips' (k-means of the fitted tasks' training "
                                  "clips, each clip matched on its own, no label read) or 'classes' (the trained "
                                  "actions and AD's normal / anomalous, matched on the video's mean: unseen tasks "
                                  "lose their video-level signal)")
    recentre_cluster_clips: int = documented(50, "recentring on clips: training clips per centroid (fewer: finer "
                                             "centroids, more kept and less removed)")
    heldout_fraction: float = documented(0.2, "static-bearing training videos the diagnostics hold out (the "
                                         "erasure fit and the loop do not see them)")
    diagnose_steps: int = documented(300, "training steps of each fresh diagnostic critic")
    erasure: ErasureConfig = field(default_factory=ErasureConfig)
    loop: LoopConfig = field(default_factory=LoopConfig)

    def __post_init__(self):
        unknown = set(self.tasks) - set(TASKS)
        if unknown:
            raise ValueError(f"unknown task(s) {sorted(unknown)}; choose from {TASKS}")
        if not 0 <= self.heldout_fraction < 0.5:
            raise ValueError(f"heldout_fraction must be in [0, 0.5), got {self.heldout_fraction}")

    @classmethod
    def from_flat(cls, fields: dict) -> TrainConfig:
        """From flat field names (the CLI's --config, a stored train_config), each routed to its section."""
        return cls().replace(**fields)

    def replace(self, **fields) -> TrainConfig:
        """A copy with flat-named fields changed: dataclasses.replace on the section that holds each."""
        unknown = sorted(set(fields) - set(_FLAT))
        if unknown:
            raise ValueError(f"unknown training field(s) {unknown}; valid: {', '.join(_FLAT)}")
        top = {n: v for n, v in fields.items() if _FLAT[n] is None}
        sections = {s: dataclasses.replace(getattr(self, s), **{n: v for n, v in fields.items() if _FLAT[n] == s})
                    for s in _SECTIONS}
        return dataclasses.replace(self, **top, **sections)

    def flat(self) -> dict:
        """Every field by its flat name: what adapter.json's extra.train_config and the ablation records store, laid
        out as before the sections, so records written before read the same (tests/test_aam_train.py)."""
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name not in _SECTIONS}
        for s in _SECTIONS:
            out.update(asdict(getattr(self, s)))
        return copy.deepcopy(out)


_SECTIONS = ("erasure", "loop")
# flat name -> the section holding it (None: TrainConfig itself)
_FLAT = {**{f.name: None for f in dataclasses.fields(TrainConfig) if f.name not in _SECTIONS},
         **{f.name: "erasure" for f in dataclasses.fields(ErasureConfig)},
         **{f.name: "loop" for f in dataclasses.fields(LoopConfig)}}
SECTION_TITLES = {None: "the default adapter (closed form)", "erasure": "the erasure stage (off by default)",
                  "loop": "trained adapters only (adapter layers > 0)"}


def config_fields() -> list[tuple[str | None, dataclasses.Field, bool]]:
    """What a user sets (the CLI's --config, Dagster), by flat name, as (section, field, is an AAMConfig field, i.e. a
    key of TrainConfig.adapter): the default adapter's (section None) first, then the erasure's, then the loop's.
    Left out: `adapter` itself (its keys are here), what training derives (AAMConfig dim, classes) and the oracle
    flags, which only the `oracle` ablation variant sets."""
    out = []
    for section, cls in ((None, TrainConfig), ("erasure", ErasureConfig), ("loop", LoopConfig)):
        out += [(section, f, False) for f in dataclasses.fields(cls) if f.name not in ("adapter", "oracle", *_SECTIONS)]
        out += [(section, f, True) for f in dataclasses.fields(AAMConfig)
                if f.metadata.get("section") == section and not f.metadata.get("derived")]
    return out


@dataclass
class TrainingData:
    ar_train: list[VideoFeatures]
    ar_val: list[VideoFeatures]
    tad_train: list[VideoFeatures]
    ad_train: list[VideoFeatures]
    static: np.ndarray                   # (V, K, D) static clips of training videos
    classes: list[str]                   # AR classes
    tad_classes: list[str]
    dim: int
    static_ids: list[str] = field(default_factory=list)        # (V,) video of each static row
    static_actions: list[np.ndarray] | None = None              # (V,) that video's moving clips, (n_clips, D) each
    attributes: np.ndarray | None = None  # (V, A) private labels of the static videos: ONLY the oracle sets it


def check_data(data: TrainingData, cfg: TrainConfig) -> None:
    """Refuse configurations whose tasks have no labelled data, before any step."""
    problems = []
    if "ar" in cfg.tasks or cfg.loop.selection == "val_ar":
        if not data.ar_train or len(data.classes) < 2:
            problems.append("task 'ar' (or val_ar selection) needs training videos with an 'action' label "
                            f"of >= 2 classes; found {len(data.ar_train)} videos, classes {data.classes}")
        if cfg.loop.selection == "val_ar" and not data.ar_val:
            problems.append("selection 'val_ar' needs 'val' videos with an 'action' label; found none")
    if "tad" in cfg.tasks and not any(v.meta.get("segments") for v in data.tad_train):
        problems.append("task 'tad' needs training videos with 'segments'; found none")
    if "ad" in cfg.tasks:
        labels = {v.meta.get("anomaly") for v in data.ad_train} - {None}
        if labels != {0, 1}:
            problems.append(f"task 'ad' needs training videos with both anomaly labels 0 and 1; found {sorted(labels)}")
    if not 0 < cfg.recentre_quantile <= 1:
        problems.append(f"recentre_quantile must be in (0, 1], got {cfg.recentre_quantile}")
    if cfg.recentre_on not in RECENTRE_ON:
        problems.append(f"recentre_on must be one of {RECENTRE_ON}, got {cfg.recentre_on!r}")
    if cfg.recentre_cluster_clips < 1:
        problems.append(f"recentre_cluster_clips must be >= 1, got {cfg.recentre_cluster_clips}")
    if data.static.ndim != 3 or len(data.static) < 2 or data.static.shape[1] < 2:
        problems.append(f"the privacy loss needs >= 2 static clips for >= 2 training videos; static latents have "
                        f"shape {tuple(data.static.shape)} (extract with static_k >= 2)")
    if problems:
        raise TrainingDataError("cannot train the AAM:\n  " + "\n  ".join(problems))


def _ar_arrays(videos, classes):
    x = np.concatenate([v.feats for v in videos]).astype(np.float32)
    y = np.concatenate([[classes.index(v.meta["action"])] * len(v.feats) for v in videos])
    return torch.from_numpy(x), torch.from_numpy(y)


@torch.no_grad()
def val_ar_top1(adapter, head, videos, classes) -> float:
    """Top-1 with softmax averaged over (up to) 5 evenly spaced clips per video."""
    correct = 0
    for v in videos:
        idx = np.unique(np.linspace(0, len(v.feats) - 1, 5).round().astype(int))
        p = F.softmax(head(adapter(torch.from_numpy(v.feats[idx]))), -1).mean(0)
        correct += int(p.argmax()) == classes.index(v.meta["action"])
    return correct / max(1, len(videos))


def _pretrain_heads(data, cfg, tad_head, ad_head, gen, fixed=None):
    """TAD / AD heads start from heads fitted on raw features (as the paper does); on the kept subspace
    (`fixed`: the adapter's frozen linear stages) when the adapter publishes k dims."""
    if "tad" in cfg.tasks:
        opt = torch.optim.AdamW(tad_head.parameters(), lr=cfg.loop.head_lr)
        for _ in range(cfg.loop.pretrain_head_epochs):
            tad_step(tad_head, data, data.tad_train, fixed, opt, gen)
    if "ad" in cfg.tasks:
        opt = torch.optim.AdamW(ad_head.parameters(), lr=cfg.loop.head_lr, weight_decay=5e-4)
        for _ in range(cfg.loop.pretrain_head_epochs):
            loss = ad_loss(ad_head, data.ad_train, fixed, gen, batch=32)
            opt.zero_grad()
            loss.backward()
            opt.step()


def tad_loss_of(tad_head, data, videos, adapter):
    seqs = [torch.from_numpy(v.feats) for v in videos]
    x, mask = pad_sequences(seqs)                                   # (B, T, D), (B, T)
    if adapter is not None:
        x = adapter(x, mask)
    cls, reg = tad_head(x, mask)
    targets = stack_tad_targets([tad_targets(v, data.tad_classes) for v in videos], T=x.shape[1])
    return tad_loss(cls, reg, targets, mask)


def tad_step(tad_head, data, videos, adapter, opt, gen, batch=16):
    order = torch.randperm(len(videos), generator=gen).tolist()
    for i in range(0, len(order), batch):
        loss = tad_loss_of(tad_head, data, [videos[j] for j in order[i:i + batch]], adapter)
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(tad_head.parameters(), 1.0)
        opt.step()


def ad_loss(ad_head, videos, adapter, gen, batch=16):
    pick = torch.randperm(len(videos), generator=gen)[:batch].tolist()
    segs = []
    for j in pick:
        f = torch.from_numpy(videos[j].feats)                       # (T, D)
        segs.append(ad_segments(adapter(f) if adapter is not None else f))  # (32, D)
    scores = ad_head(torch.stack(segs))                            # (B, 32)
    labels = torch.tensor([float(videos[j].meta["anomaly"]) for j in pick])
    return ad_mil_loss(scores, labels)


class PairSampler:
    """Pairs of one video for the privacy term, from the training (not held-out) static-bearing videos."""

    def __init__(self, data: TrainingData, fit_idx: np.ndarray, kind: str, gen: torch.Generator):
        self.static = torch.from_numpy(data.static[fit_idx].astype(np.float32))       # (V, K, D)
        self.actions = None if data.static_actions is None else \
            [torch.from_numpy(data.static_actions[i]) for i in fit_idx]
        self.kinds = ("static_static", "static_action") if kind == "both" else (kind,)
        if self.actions is None or any(len(a) == 0 for a in self.actions):
            self.kinds = ("static_static",)
        self.gen = gen

    def sample(self, n: int):
        """(a, b, video rows): (n, D), (n, D), (n,) indices into the fit videos."""
        V, K, _ = self.static.shape
        vids = torch.randperm(V, generator=self.gen)[:min(n, V)]
        k = torch.stack([torch.randperm(K, generator=self.gen)[:2] for _ in range(len(vids))])  # (n, 2)
        a = self.static[vids, k[:, 0]]
        kind = self.kinds[int(torch.randint(len(self.kinds), (1,), generator=self.gen))]
        if kind == "static_static":
            b = self.static[vids, k[:, 1]]
        else:
            b = torch.stack([self.actions[v][int(torch.randint(len(self.actions[v]), (1,), generator=self.gen))]
                             for v in vids.tolist()])
        return a, b, vids


def fit_appearance_erasure(data: TrainingData, fit_idx: np.ndarray, rank: int, w_action: float = 1.0,
                           w_temporal: float = 0.0):
    """The erasure as aam_model fits it: the fit videos' static clips against the AR classes' spread
    (and, with w_temporal, the training videos' within-video spread). Returns an erasure.ErasureFit."""
    from splavu_core.aam.appearance_projection import fit_erasure

    clips = labels = None
    if data.ar_train and w_action > 0:
        clips = np.concatenate([v.feats for v in data.ar_train])
        labels = np.concatenate([[v.meta["action"]] * len(v.feats) for v in data.ar_train])
    videos = [v.feats for v in data.ar_train + data.tad_train + data.ad_train]
    return fit_erasure(data.static[fit_idx], rank, clips, labels, w_action=w_action, video_clips=videos,
                       w_temporal=w_temporal)


def fit_utility_keep(data: TrainingData, tasks, k: int, cfg: TrainConfig, transform=None):
    """The keep stage as aam_model fits it, with cfg's keep_* fields: the training videos of `tasks` (utility labels
    only) and the static clips, unlabelled; `transform` (the erasure, when there is one) applied first."""
    from splavu_core.aam.keep import fit_keep

    f = transform or (lambda x: x)
    train = {"ar": data.ar_train, "tad": data.tad_train, "ad": data.ad_train}
    task_videos = {t: [dataclasses.replace(v, feats=f(v.feats)) for v in train[t]] for t in tasks if train[t]}
    if not task_videos:  # no utility labels at all: motion directions of every training video
        task_videos = {"ar": [dataclasses.replace(v, feats=f(v.feats), meta={"action": "_"})
                              for v in data.ar_train + data.tad_train + data.ad_train]}
    static = f(data.static.reshape(-1, data.dim)).reshape(data.static.shape) if len(data.static) else data.static
    dynamic = [] if cfg.keep_w_dynamic <= 0 or data.static_actions is None else \
        [f(a) - s.mean(0) for a, s in zip(data.static_actions, static) if len(a)]  # (n_i, D): what motion adds
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
    labels = KMeans(c, n_init=4, random_state=cfg.seed).fit_predict(clips)
    if len(set(labels)) != c:
        raise TrainingDataError(f"recentring on clips: k-means found {len(set(labels))} distinct clusters of {c} "
                                f"asked for in {len(clips)} training clips (duplicate clips?); raise "
                                f"recentre_cluster_clips")
    return clips, [f"c{i:05d}" for i in labels]


def fit_closed_form(data: TrainingData, tasks, k: int, cfg: TrainConfig) -> dict:
    """The default adapter's closed-form stages as numpy, for the keep curve, from one keep fit: {False: the keep map,
    True: keep then recentring (only when `tasks` give >= 2 centroids, as train_aam decides)}, each a per-video map
    (T, D) -> (T, k); train_aam's adapter gives the same rows (tests/test_keep.py)."""
    from splavu_core.aam.keep import apply_keep, apply_recentre, fit_recentre

    fit = fit_utility_keep(data, tasks, k, cfg)
    maps = {False: lambda f: apply_keep(fit, f)}
    if n_centroids(data, tasks, cfg) >= 2:
        means, labels = recentre_targets(data, tasks, cfg, lambda f: apply_keep(fit, f))
        rfit = fit_recentre(means, labels, cfg.recentre_quantile, per_clip=cfg.recentre_on == "clips")
        maps[True] = lambda f: apply_recentre(rfit, apply_keep(fit, f))
    return maps


def _load_buffers(module, **arrays) -> None:
    """Copy fitted numpy arrays into a frozen stage's buffers of the same names."""
    with torch.no_grad():
        for name, a in arrays.items():
            getattr(module, name).copy_(torch.from_numpy(a))


def _fit_keep_into(adapter, data: TrainingData, cfg: TrainConfig, log) -> dict:
    transform = None
    if adapter.erase is not None:  # the keep stage sees what the adapter's own (fitted) erasure leaves
        def transform(x):
            with torch.no_grad():
                return adapter.erase(torch.from_numpy(np.ascontiguousarray(x, np.float32))).numpy()
    k = adapter.cfg.keep
    fit = fit_utility_keep(data, cfg.tasks, k, cfg, transform)
    _load_buffers(adapter.keep, mean=fit.mean, proj=fit.proj)
    ev = fit.eigenvalues
    if log:
        log(f"keep: publishing {k} utility directions of {data.dim} (tasks {', '.join(cfg.tasks) or 'none: motion'}; "
            f"utility ratio {ev[0]:.3f} .. {ev[k - 1]:.3f}; largest dropped {ev[k]:.3f})")
    return {"k": k, "tasks": list(cfg.tasks), "eigenvalues": [round(float(x), 5) for x in ev[:2 * k + 1]]}


def _fit_recentre_into(adapter, stage, data: TrainingData, cfg: TrainConfig, log) -> dict:
    """The recentring stage from its training videos' published means (the adapter without it) and their centroid
    (recentre_targets: clusters of clips, or utility classes); installed into the adapter."""
    from splavu_core.aam.keep import fit_recentre

    def publish(x):
        with torch.no_grad():
            return adapter(torch.from_numpy(np.ascontiguousarray(x, np.float32))).numpy()

    means, labels = recentre_targets(data, cfg.tasks, cfg, publish)
    fit = fit_recentre(means, labels, cfg.recentre_quantile, per_clip=cfg.recentre_on == "clips")
    _load_buffers(stage, centroids=fit.centroids, precision=fit.precision, gate=fit.gate)
    adapter.recentre = stage
    if log:
        what = "k-means clusters of the training clips" if cfg.recentre_on == "clips" else "trained classes"
        log(f"recentre: each video's kept mean -> its expected centroid among {len(fit.centroids)} {what} "
            f"(moved less past the {cfg.recentre_quantile:.0%} quantile of training distances, {float(fit.gate):.2f})")
    return {"classes": len(fit.centroids), "on": cfg.recentre_on, "quantile": cfg.recentre_quantile,
            "gate": round(float(fit.gate), 4)}


def _fit_erasure_into(adapter, data: TrainingData, fit_idx: np.ndarray, cfg: TrainConfig, log) -> dict:
    rank = adapter.cfg.erase_rank
    fit = fit_appearance_erasure(data, fit_idx, rank, cfg.erasure.erase_w_action, cfg.erasure.erase_w_temporal)
    _load_buffers(adapter.erase, mean=fit.mean, read=fit.read, write=fit.write)
    ev = fit.eigenvalues
    if log:
        log(f"erasure: removed {rank} appearance directions (ratio {ev[0]:.2f} .. {ev[rank - 1]:.2f}; "
            f"largest left {ev[rank]:.2f})")
    return {"rank": rank, "eigenvalues": [round(float(e), 4) for e in ev[:2 * rank + 1]]}


def _diagnose(adapter, data: TrainingData, fit_idx, held_idx, seed: int, steps: int) -> dict:
    def transform(x):
        with torch.no_grad():
            return adapter(torch.from_numpy(np.ascontiguousarray(x, np.float32))).numpy()

    was = adapter.training
    adapter.eval()
    out = pair_matching_report(data.static, data.static_actions, fit_idx, held_idx,
                               transform=transform, seed=seed, steps=steps)
    adapter.train(was)
    return _round(out)


def train_aam(data: TrainingData, cfg: TrainConfig, log=print) -> tuple[AnonymizingAdapter, AAMConfig, dict]:
    """Returns the selected adapter, its config, and a history of per-epoch losses and validation metrics.

    summary["diagnostics"]: fresh-critic pair matching on held-out videos before (raw) and after the adapter,
    during training and for the selected adapter (aam.diagnostics)."""
    check_data(data, cfg)
    loop = cfg.loop
    if loop.oracle and data.attributes is None:
        raise TrainingDataError("the oracle variant needs private-attribute labels (load_oracle_labels); "
                                "it is a diagnostic and is never trained by default")
    torch.manual_seed(cfg.seed)
    gen = torch.Generator().manual_seed(cfg.seed)
    adapter_kw = dict(cfg.adapter)
    adapter_kw.setdefault("erase_rank", int(round(cfg.erasure.erase_fraction * data.dim)))
    if adapter_kw.get("recentre"):  # on classes: the trained actions' (+ AD's); without task 'ar' there are none
        n_classes = n_centroids(data, cfg.tasks, cfg)               # the centroids fit_recentre will find
        if n_classes >= 2:
            adapter_kw["classes"] = n_classes                       # derived from the data, like dim
            adapter_kw["recentre_clips"] = cfg.recentre_on == "clips"
        else:
            adapter_kw["recentre"] = False
            if log:
                log("recentre: off (recentre_on 'classes' recentres on the trained actions' centroids; task 'ar' "
                    "is not trained)" if cfg.recentre_on == "classes" else
                    "recentre: off (fewer than 2 training clips to cluster)")
    acfg = AAMConfig(dim=data.dim, oracle=loop.oracle, **adapter_kw)
    adapter = AnonymizingAdapter(acfg)
    C, out = len(data.classes), acfg.out_dim                       # heads read the published width

    n_static = len(data.static)
    diagnose = cfg.heldout_fraction > 0 and n_static >= 8
    if diagnose:
        fit_idx, held_idx = heldout_split(n_static, cfg.heldout_fraction, cfg.seed, minimum=min(32, n_static // 4))
    else:
        fit_idx, held_idx = np.arange(n_static), np.arange(0)
    erasure = _fit_erasure_into(adapter, data, fit_idx, cfg, log) if acfg.erase_rank else None
    keep = _fit_keep_into(adapter, data, cfg, log) if acfg.keep else None
    # recentring is per video and fitted on what the other stages publish: trained blocks learn on lone clips
    # without it, and it is fitted after them (below)
    recentre_stage, adapter.recentre = adapter.recentre, None
    fixed = adapter.fixed_stages if acfg.keep else None            # heads pretrain on the kept subspace
    ar_head = ARHead(out, max(C, 2))
    tad_head = TADHead(out, max(len(data.tad_classes), 1))
    ad_head = ADHead(out)
    trainable = any(p.requires_grad for p in adapter.parameters())
    if trainable:
        _pretrain_heads(data, cfg, tad_head, ad_head, gen, fixed)

    x_ar, y_ar = _ar_arrays(data.ar_train, data.classes) if data.ar_train else (torch.zeros(0, data.dim), None)
    static = torch.from_numpy(data.static.astype(np.float32))      # (V, K, D)
    pool = torch.cat([x_ar, static.flatten(0, 1)]) if len(x_ar) else static.flatten(0, 1)
    with torch.no_grad():                                           # LC normaliser: mean per-dimension variance
        scale = float((adapter.fixed_stages(pool) if acfg.keep else pool).var(0).mean())
    opt = torch.optim.AdamW(list(adapter.parameters()) + list(ar_head.parameters()), lr=loop.lr)
    opt_tad = torch.optim.AdamW(tad_head.parameters(), lr=loop.head_lr)
    opt_ad = torch.optim.AdamW(ad_head.parameters(), lr=loop.head_lr, weight_decay=5e-4)
    sampler = PairSampler(data, fit_idx, loop.pairs, gen)
    critic = PairCritic(out, loop.critic_hidden) if loop.privacy == "critic" else None
    opt_critic = torch.optim.AdamW(critic.parameters(), lr=loop.critic_lr) if critic else None
    oracle = _Oracle(data, fit_idx, loop, out) if loop.oracle else None
    steps_per_epoch = max(1, len(x_ar) // loop.batch) if len(x_ar) else max(1, len(fit_idx) // max(2, loop.batch // 4))
    diag_epochs = set(np.linspace(1, loop.epochs, loop.diagnose_points).round().astype(int).tolist()) if diagnose else set()
    diag = {"raw": _round(pair_matching_report(data.static, data.static_actions, fit_idx, held_idx, seed=cfg.seed,
                                                steps=cfg.diagnose_steps))
            if diagnose else None, "during": []}
    history, best = [], (-1.0, copy.deepcopy(adapter.state_dict()), 0)
    t0 = time.perf_counter()
    if not trainable and log:
        log("closed-form adapter (no trainable stage): nothing to train after the fit")
    for epoch in range(1, loop.epochs + 1 if trainable else 1):
        sums = {}
        for _ in range(steps_per_epoch):
            parts = {}
            # clips for LC (+ AR): a random batch of training clips (static clips when no AR data)
            if len(x_ar):
                idx = torch.randint(len(x_ar), (loop.batch,), generator=gen)
                h = x_ar[idx]
            else:
                h = pool[torch.randint(len(pool), (loop.batch,), generator=gen)]
            z = adapter(h)                                          # (B, D)
            target = adapter.fixed_stages(h).detach()               # consistency with the erased / kept space
            parts["lc"] = F.mse_loss(z, target) / scale
            if "ar" in cfg.tasks:
                parts["ar"] = F.cross_entropy(ar_head(z), y_ar[idx])
            a, b, rows = sampler.sample(loop.batch if loop.privacy == "critic" else max(2, loop.batch // 4))
            if loop.w_b > 0:
                parts["privacy"] = _privacy_term(adapter, critic, opt_critic, a, b, loop)
            if oracle is not None:
                parts["oracle"] = oracle.step(adapter, a, b, rows)
            if "tad" in cfg.tasks:
                pick = torch.randperm(len(data.tad_train), generator=gen)[:16].tolist()
                parts["tad"] = tad_loss_of(tad_head, data, [data.tad_train[j] for j in pick], adapter)
            if "ad" in cfg.tasks:
                parts["ad"] = ad_loss(ad_head, data.ad_train, adapter, gen)
            privacy = parts.get("privacy", 0)
            sign = -1.0 if loop.privacy == "ntxent" else 1.0              # the paper maximises its NT-Xent
            loss = (loop.w_lc * parts["lc"] + loop.w_ar * parts.get("ar", 0) + loop.w_tad * parts.get("tad", 0)
                    + loop.w_ad * parts.get("ad", 0) + sign * loop.w_b * privacy + loop.w_b * parts.get("oracle", 0))
            opt.zero_grad()
            opt_tad.zero_grad()
            opt_ad.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(tad_head.parameters(), 1.0)
            opt.step()
            opt_tad.step()
            opt_ad.step()
            logged = {**parts, "total": loss}
            if critic is not None and loop.w_b > 0:
                logged["privacy"] = critic.last_match_loss          # the objective's own value: critic InfoNCE
            for name, v in logged.items():
                sums[name] = sums.get(name, 0.0) + float(v.detach() if torch.is_tensor(v) else v) / steps_per_epoch
        adapter.eval()
        val = val_ar_top1(adapter, ar_head, data.ar_val, data.classes) if data.ar_val and "ar" in cfg.tasks else None
        adapter.train()
        entry = {"epoch": epoch, **{k: round(v, 5) for k, v in sums.items()}, "val_ar_top1": val}
        if epoch in diag_epochs:
            d = _diagnose(adapter, data, fit_idx, held_idx, cfg.seed, cfg.diagnose_steps)
            diag["during"].append({"epoch": epoch, **d})
            entry.update({f"pm_{k}": v for k, v in d.items() if k not in ("chance", "group", "heldout")})
        history.append(entry)
        score = val if (loop.selection == "val_ar" and val is not None) else epoch
        if score >= best[0]:
            best = (score, copy.deepcopy(adapter.state_dict()), epoch)
        if log and (epoch % max(1, loop.epochs // 10) == 0 or epoch == 1):
            log(f"epoch {epoch}/{loop.epochs} " + " ".join(f"{k} {v:.4f}" for k, v in sums.items())
                + (f" val_ar_top1 {val:.3f}" if val is not None else "")
                + "".join(f" {k} {v:.3f}" for k, v in entry.items() if k.startswith("pm_")))
    adapter.load_state_dict(best[1])
    adapter.eval()
    if recentre_stage is not None:
        keep["recentre"] = _fit_recentre_into(adapter, recentre_stage, data, cfg, log)
    if diagnose:
        diag["selected"] = _diagnose(adapter, data, fit_idx, held_idx, cfg.seed, cfg.diagnose_steps)
        if log:
            log("pair matching of a fresh critic on held-out videos (chance {:.3f}): ".format(diag["raw"]["chance"])
                + ", ".join(f"{k} {diag['raw'][k]:.3f} -> {diag['selected'][k]:.3f}"
                            for k in diag["raw"] if k != "chance"))
    summary = {"selected_epoch": best[2], "history": history, "seconds": round(time.perf_counter() - t0, 2),
               "lc_scale": scale, "train_config": cfg.flat(), "erasure": erasure, "keep": keep,
               "diagnostics": diag if diagnose else None, "heldout_videos": int(len(held_idx)),
               "final": history[best[2] - 1] if best[2] else {},
               "parameters": sum(p.numel() for p in adapter.parameters())}
    return adapter, acfg, summary


def _round(d: dict) -> dict:
    return {k: round(v, 4) for k, v in d.items()}


def _privacy_term(adapter, critic, opt_critic, a, b, loop: LoopConfig) -> torch.Tensor:
    """The paper's NT-Xent of the adapter outputs (caller maximises it), or the learned critic's confusion."""
    za, zb = adapter(a), adapter(b)                                  # (n, D) each
    if critic is None:
        return nt_xent(za, zb, loop.temperature)
    for _ in range(loop.critic_steps):                               # the critic catches up on detached outputs
        loss_c = info_nce(critic.logits(za.detach(), zb.detach(), loop.temperature))
        opt_critic.zero_grad()
        loss_c.backward()
        opt_critic.step()
    critic.last_match_loss = loss_c.detach()
    for p in critic.parameters():                                    # only the adapter learns from the confusion
        p.requires_grad_(False)
    conf = confusion(critic.logits(za, zb, loop.temperature))
    for p in critic.parameters():
        p.requires_grad_(True)
    return conf


class _Oracle:
    """DIAGNOSTIC ONLY: a supervised attribute attacker on the training actors' private labels; the adapter
    is trained to push its predictions to the attributes' prevalence. Shows what this encoder permits at all."""

    def __init__(self, data: TrainingData, fit_idx: np.ndarray, loop: LoopConfig, width: int):
        y = torch.from_numpy(np.asarray(data.attributes, np.float32)[fit_idx])   # (V, A)
        self.y, self.prior = y, y.mean(0).clamp(0.02, 0.98)
        D, A = width, y.shape[1]                                    # D: the adapter's output width
        self.net = nn.Sequential(nn.Linear(D, D), nn.ReLU(), nn.Linear(D, A))
        self.opt = torch.optim.AdamW(self.net.parameters(), lr=1e-3)
        self.steps = loop.critic_steps

    def step(self, adapter, a, b, rows) -> torch.Tensor:
        x = torch.cat([adapter(a), adapter(b)])                     # static and (if paired) moving clips
        y = self.y[rows].repeat(2, 1)
        for _ in range(self.steps):
            loss = F.binary_cross_entropy_with_logits(self.net(x.detach()), y)
            self.opt.zero_grad()
            loss.backward()
            self.opt.step()
        for p in self.net.parameters():
            p.requires_grad_(False)
        conf = F.binary_cross_entropy_with_logits(self.net(x), self.prior.expand_as(y))
        for p in self.net.parameters():
            p.requires_grad_(True)
        return conf


def _label_free(v: VideoFeatures) -> VideoFeatures:
    """The video without its private-attribute labels: training must not be able to read them."""
    return dataclasses.replace(v, meta={k: val for k, val in v.meta.items() if not k.startswith("attr_")})


def load_training_data(store, ar: str | None = "ar", tad: str | None = "tad", ad: str | None = "ad") -> TrainingData:
    """Raw latents of the datasets that supply each task (None: not available), from the store only.

    Every attr_* label is dropped on load (see `load_oracle_labels` for the one diagnostic that reads them)."""
    from splavu_core.ingest.datasets import registered
    from splavu_core.tasks.loading import load_raw_features

    regs = registered(store)
    wanted = [d for d in dict.fromkeys((ar, tad, ad)) if d]
    unknown = [d for d in wanted if d not in regs]
    if unknown:
        raise TrainingDataError(f"dataset(s) {unknown} are not registered in {store.root} (known: {sorted(regs)})")
    shards = [s for d in wanted for s in regs[d]["shards"]]
    committed = set(store.committed_shards())
    missing = [s for s in shards if s not in committed]
    if missing:
        raise TrainingDataError(f"store {store.root} is missing the latents of shard(s) {missing}: "
                                f"materialise clip_latents for them before training")
    videos = {d: [_label_free(v) for v in load_raw_features(store, datasets=[d])] for d in wanted}
    by_id = {v.video_id: v for vs in videos.values() for v in vs}
    statics, static_ids = [], []
    for s in shards:
        part = store.read_shard(s)  # refuses latents of another encoder fingerprint
        if len(part.static):
            statics.append(part.static)
            static_ids += part.static_index.column("video_id").to_pylist()[::part.static.shape[1]]
    ar_videos = [v for v in videos.get(ar, []) if v.meta.get("action")]
    tad_train = [v for v in videos.get(tad, []) if v.split == "train"]
    classes = sorted({v.meta["action"] for v in ar_videos})
    tad_classes = sorted({s[2] for v in tad_train for s in (v.meta.get("segments") or [])})
    dim = next(len(v.feats[0]) for vs in videos.values() for v in vs)
    K = min((s.shape[1] for s in statics), default=0)
    actions = [by_id[i].feats if i in by_id else np.zeros((0, dim), np.float32) for i in static_ids]
    return TrainingData(ar_train=[v for v in ar_videos if v.split == "train"],
                        ar_val=[v for v in ar_videos if v.split == "val"],
                        tad_train=tad_train,
                        ad_train=[v for v in videos.get(ad, []) if v.split == "train" and v.meta.get("anomaly") is not None],
                        static=np.concatenate([s[:, :K] for s in statics]) if statics else np.zeros((0, 0, dim), np.float32),
                        classes=classes, tad_classes=tad_classes, dim=dim, static_ids=static_ids,
                        static_actions=actions if static_ids else None)


def load_oracle_labels(store, data: TrainingData) -> TrainingData:
    """DIAGNOSTIC ONLY (the `oracle` variant): the training videos' private attr_* labels from their manifests.

    Raises unless every static-bearing training video has every attribute. Never called by default training."""
    from splavu_core.tasks.loading import shard_manifest_rows

    rows = {}
    for shard in store.committed_shards():
        for vid, meta in shard_manifest_rows(store, shard).items():
            rows[vid] = meta
    cols = sorted({k for i in data.static_ids for k, v in (rows.get(i) or {}).items()
                   if k.startswith("attr_") and v is not None})
    missing = [i for i in data.static_ids if any((rows.get(i) or {}).get(c) is None for c in cols)]
    if not cols or missing:
        raise TrainingDataError(f"oracle: training videos lack attr_* labels (columns {cols}; "
                                f"{len(missing)} videos missing some, e.g. {missing[:3]})")
    y = np.array([[float(rows[i][c]) for c in cols] for i in data.static_ids], np.float32)
    return dataclasses.replace(data, attributes=y)
