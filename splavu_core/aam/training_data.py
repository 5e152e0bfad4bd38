"""What the AAM trains on: the cached latents of the registered datasets, read from the store only.

No private-attribute label is kept on load; `load_oracle_labels` is the one diagnostic that reads them."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import numpy as np
import torch

from splavu_core.aam.config import RECENTRE_ON, TrainConfig
from splavu_core.tasks.features import VideoFeatures


class TrainingDataError(ValueError):
    """The store cannot train this configuration; raised before any step runs."""


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


def static_clip_readers(cfg: TrainConfig) -> list[str]:
    """What in `cfg` fits on the training videos' static clips. The closed-form default (keep + recentring) reads
    none: its weights are the same with 4, 2 or no static clips per video, which then feed only its held-out
    pair-matching diagnostic (skipped without them)."""
    out = []
    if cfg.layers and cfg.loop.epochs > 0:
        out.append("the paper's privacy loss (trained layers)")
    if cfg.projection.projection_fraction > 0 or cfg.projection.projection_rank:
        out.append("the appearance projection")
    if cfg.keep_w_app > 0 or cfg.keep_w_dynamic > 0:
        out.append("the keep fit's appearance / dynamic terms")
    return out


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
    readers = static_clip_readers(cfg)
    if readers and (data.static.ndim != 3 or len(data.static) < 2 or data.static.shape[1] < 2):
        problems.append(f"{' and '.join(readers)} need(s) >= 2 static clips for >= 2 training videos; static "
                        f"latents have shape {tuple(data.static.shape)} (extract with static_k >= 2)")
    if problems:
        raise TrainingDataError("cannot train the AAM:\n  " + "\n  ".join(problems))



def training_clips(data: TrainingData) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]:
    """(x, y, pool): the AR training clips (N, D) and their class indices (None without AR videos), and what the
    latent consistency reads: those clips, then every static clip (N + V * K, D)."""
    if data.ar_train:
        x = torch.from_numpy(np.concatenate([v.feats for v in data.ar_train]).astype(np.float32))
        y = torch.from_numpy(np.concatenate([[data.classes.index(v.meta["action"])] * len(v.feats)
                                             for v in data.ar_train]))
    else:
        x, y = torch.zeros(0, data.dim), None
    static = torch.from_numpy(data.static.astype(np.float32)).flatten(0, 1)   # (V * K, D)
    return x, y, (torch.cat([x, static]) if len(x) else static)


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


def without_subjects(data: TrainingData, raw: dict, subjects) -> tuple[TrainingData, dict]:
    """What erasing `subjects` (subject_id values) leaves, in memory: the training data without their videos (static
    clips included), and raw (dataset -> videos: the scored sets) without them. For benchmarks of a refit after an
    erasure (benchmarks/publish_rule.py, cluster_seeds.py); `splavu forget` erases from the store itself."""
    subjects = {str(s) for s in subjects}

    def keep(vs):
        return [v for v in vs if str(v.meta.get("subject_id")) not in subjects]
    gone = {v.video_id for v in data.ar_train + data.tad_train + data.ad_train + list(data.ar_val or [])
            if str(v.meta.get("subject_id")) in subjects}
    rows = [i for i, vid in enumerate(data.static_ids) if vid not in gone]
    out = dataclasses.replace(data, ar_train=keep(data.ar_train), ar_val=keep(data.ar_val or []),
                              tad_train=keep(data.tad_train), ad_train=keep(data.ad_train),
                              static=data.static[rows] if len(data.static) else data.static,
                              static_ids=[data.static_ids[i] for i in rows],
                              static_actions=[data.static_actions[i] for i in rows] if data.static_actions else None)
    return out, {d: keep(vs) for d, vs in raw.items()}


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
