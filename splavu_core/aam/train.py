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
import time
from dataclasses import asdict, dataclass, field

import numpy as np
import torch
import torch.nn.functional as F

from ..features import VideoFeatures
from ..heads import (ADHead, ARHead, TADHead, ad_mil_loss, ad_segments, pad_sequences, stack_tad_targets,
                     tad_loss, tad_targets)
from .losses import nt_xent
from .model import AAMConfig, AnonymizingAdapter

TASKS = ("ar", "tad", "ad")


class TrainingDataError(ValueError):
    """The store cannot train this configuration; raised before any step runs."""


@dataclass
class TrainConfig:
    tasks: tuple = TASKS                 # utility tasks co-trained (any subset; empty = privacy + LC only)
    w_lc: float = 1.0                    # on variance-normalised LC (README: the sweep behind this choice)
    w_ar: float = 1.0
    w_tad: float = 1.0
    w_ad: float = 1.0
    w_b: float = 1.0
    temperature: float = 0.1
    lr: float = 1e-3                     # AAM + AR head
    head_lr: float = 1e-3                # TAD / AD heads (own optimizers)
    epochs: int = 60
    batch: int = 128                     # clips per step (AR); static pairs per step = batch // 4 videos
    pretrain_head_epochs: int = 30       # TAD / AD heads first fit on raw features
    seed: int = 0
    selection: str = "val_ar"            # keep the epoch with the best validation AR top-1 ("last": final epoch)
    adapter: dict = field(default_factory=lambda: {"layers": 3, "heads": 8, "sub_tokens": 8, "token_width": 64})

    def __post_init__(self):
        unknown = set(self.tasks) - set(TASKS)
        if unknown:
            raise ValueError(f"unknown task(s) {sorted(unknown)}; choose from {TASKS}")
        if self.selection not in ("val_ar", "last"):
            raise ValueError(f"selection must be 'val_ar' or 'last', got {self.selection!r}")


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


def check_data(data: TrainingData, cfg: TrainConfig) -> None:
    """Refuse configurations whose tasks have no labelled data, before any step."""
    problems = []
    if "ar" in cfg.tasks or cfg.selection == "val_ar":
        if not data.ar_train or len(data.classes) < 2:
            problems.append("task 'ar' (or val_ar selection) needs training videos with an 'action' label "
                            f"of >= 2 classes; found {len(data.ar_train)} videos, classes {data.classes}")
        if cfg.selection == "val_ar" and not data.ar_val:
            problems.append("selection 'val_ar' needs 'val' videos with an 'action' label; found none")
    if "tad" in cfg.tasks and not any(v.meta.get("segments") for v in data.tad_train):
        problems.append("task 'tad' needs training videos with 'segments'; found none")
    if "ad" in cfg.tasks:
        labels = {v.meta.get("anomaly") for v in data.ad_train} - {None}
        if labels != {0, 1}:
            problems.append(f"task 'ad' needs training videos with both anomaly labels 0 and 1; found {sorted(labels)}")
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


def _pretrain_heads(data, cfg, tad_head, ad_head, gen):
    """TAD / AD heads start from heads fitted on raw features (as the paper does)."""
    if "tad" in cfg.tasks:
        opt = torch.optim.AdamW(tad_head.parameters(), lr=cfg.head_lr)
        for _ in range(cfg.pretrain_head_epochs):
            tad_step(tad_head, data, data.tad_train, None, opt, gen, raw=True)
    if "ad" in cfg.tasks:
        opt = torch.optim.AdamW(ad_head.parameters(), lr=cfg.head_lr, weight_decay=5e-4)
        for _ in range(cfg.pretrain_head_epochs):
            loss = ad_loss(ad_head, data.ad_train, None, gen, batch=32)
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


def tad_step(tad_head, data, videos, adapter, opt, gen, raw=False, batch=16):
    order = torch.randperm(len(videos), generator=gen).tolist()
    for i in range(0, len(order), batch):
        loss = tad_loss_of(tad_head, data, [videos[j] for j in order[i:i + batch]], None if raw else adapter)
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


def train_aam(data: TrainingData, cfg: TrainConfig, log=print) -> tuple[AnonymizingAdapter, AAMConfig, dict]:
    """Returns the selected adapter, its config, and a history of per-epoch losses and validation metrics."""
    check_data(data, cfg)
    torch.manual_seed(cfg.seed)
    gen = torch.Generator().manual_seed(cfg.seed)
    acfg = AAMConfig(dim=data.dim, **cfg.adapter)
    adapter = AnonymizingAdapter(acfg)
    C = len(data.classes)
    ar_head = ARHead(data.dim, max(C, 2))
    tad_head = TADHead(data.dim, max(len(data.tad_classes), 1))
    ad_head = ADHead(data.dim)
    _pretrain_heads(data, cfg, tad_head, ad_head, gen)

    x_ar, y_ar = _ar_arrays(data.ar_train, data.classes) if data.ar_train else (torch.zeros(0, data.dim), None)
    static = torch.from_numpy(data.static.astype(np.float32))      # (V, K, D)
    pool = torch.cat([x_ar, static.flatten(0, 1)]) if len(x_ar) else static.flatten(0, 1)
    scale = float(pool.var(0).mean())                               # LC normaliser: mean per-dim variance
    opt = torch.optim.AdamW(list(adapter.parameters()) + list(ar_head.parameters()), lr=cfg.lr)
    opt_tad = torch.optim.AdamW(tad_head.parameters(), lr=cfg.head_lr)
    opt_ad = torch.optim.AdamW(ad_head.parameters(), lr=cfg.head_lr, weight_decay=5e-4)
    steps_per_epoch = max(1, len(x_ar) // cfg.batch) if len(x_ar) else max(1, len(static) // max(2, cfg.batch // 4))
    history, best = [], (-1.0, None, -1)
    t0 = time.perf_counter()
    for epoch in range(1, cfg.epochs + 1):
        sums = {}
        for _ in range(steps_per_epoch):
            parts = {}
            # clips for LC (+ AR): a random batch of training clips (static clips when no AR data)
            idx = torch.randint(len(pool), (cfg.batch,), generator=gen)
            if len(x_ar):
                idx = torch.randint(len(x_ar), (cfg.batch,), generator=gen)
                h = x_ar[idx]
            else:
                h = pool[idx]
            z = adapter(h)                                          # (B, D)
            parts["lc"] = F.mse_loss(z, h) / scale
            if "ar" in cfg.tasks:
                parts["ar"] = F.cross_entropy(ar_head(z), y_ar[idx])
            # privacy budget: two static clips of the same video, other videos as negatives
            nv = min(len(static), max(2, cfg.batch // 4))
            vids = torch.randperm(len(static), generator=gen)[:nv]
            k = torch.stack([torch.randperm(static.shape[1], generator=gen)[:2] for _ in range(nv)])  # (nv, 2)
            s1, s2 = static[vids, k[:, 0]], static[vids, k[:, 1]]
            parts["privacy"] = nt_xent(adapter(s1), adapter(s2), cfg.temperature)
            if "tad" in cfg.tasks:
                pick = torch.randperm(len(data.tad_train), generator=gen)[:16].tolist()
                parts["tad"] = tad_loss_of(tad_head, data, [data.tad_train[j] for j in pick], adapter)
            if "ad" in cfg.tasks:
                parts["ad"] = ad_loss(ad_head, data.ad_train, adapter, gen)
            loss = (cfg.w_lc * parts["lc"] + cfg.w_ar * parts.get("ar", 0) + cfg.w_tad * parts.get("tad", 0)
                    + cfg.w_ad * parts.get("ad", 0) - cfg.w_b * parts["privacy"])
            opt.zero_grad()
            opt_tad.zero_grad()
            opt_ad.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(tad_head.parameters(), 1.0)
            opt.step()
            opt_tad.step()
            opt_ad.step()
            for name, v in {**parts, "total": loss}.items():
                sums[name] = sums.get(name, 0.0) + float(v.detach() if torch.is_tensor(v) else v) / steps_per_epoch
        adapter.eval()
        val = val_ar_top1(adapter, ar_head, data.ar_val, data.classes) if data.ar_val and "ar" in cfg.tasks else None
        adapter.train()
        entry = {"epoch": epoch, **{k: round(v, 5) for k, v in sums.items()}, "val_ar_top1": val}
        history.append(entry)
        score = val if (cfg.selection == "val_ar" and val is not None) else epoch
        if score >= best[0]:
            best = (score, copy.deepcopy(adapter.state_dict()), epoch)
        if log and (epoch % max(1, cfg.epochs // 10) == 0 or epoch == 1):
            log(f"epoch {epoch}/{cfg.epochs} " + " ".join(f"{k} {v:.4f}" for k, v in sums.items())
                + (f" val_ar_top1 {val:.3f}" if val is not None else ""))
    adapter.load_state_dict(best[1])
    adapter.eval()
    summary = {"selected_epoch": best[2], "history": history, "seconds": round(time.perf_counter() - t0, 2),
               "lc_scale": scale, "train_config": asdict(cfg),
               "final": history[best[2] - 1], "parameters": sum(p.numel() for p in adapter.parameters())}
    return adapter, acfg, summary


def load_training_data(store, ar: str | None = "ar", tad: str | None = "tad", ad: str | None = "ad") -> TrainingData:
    """Raw latents of the datasets that supply each task (None: not available), from the store only."""
    from ..publish import load_video_features
    from ..registry import registered

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
    videos = {d: load_video_features(store, source="raw", datasets=[d]) for d in wanted}
    statics = []
    for s in shards:
        part = store.read_shard(s)  # refuses latents of another encoder fingerprint
        if len(part.static):
            statics.append(part.static)
    ar_videos = [v for v in videos.get(ar, []) if v.meta.get("action")]
    tad_train = [v for v in videos.get(tad, []) if v.split == "train"]
    classes = sorted({v.meta["action"] for v in ar_videos})
    tad_classes = sorted({s[2] for v in tad_train for s in (v.meta.get("segments") or [])})
    dim = next(len(v.feats[0]) for vs in videos.values() for v in vs)
    K = min((s.shape[1] for s in statics), default=0)
    return TrainingData(ar_train=[v for v in ar_videos if v.split == "train"],
                        ar_val=[v for v in ar_videos if v.split == "val"],
                        tad_train=tad_train,
                        ad_train=[v for v in videos.get(ad, []) if v.split == "train" and v.meta.get("anomaly") is not None],
                        static=np.concatenate([s[:, :K] for s in statics]) if statics else np.zeros((0, 0, dim), np.float32),
                        classes=classes, tad_classes=tad_classes, dim=dim)
