"""The paper's joint training loop, for adapters with a trained stage (AAMConfig layers > 0); the default adapter is a
closed form (aam/closed_form.py) and never enters it. It trains from cached latents only (the frozen encoder never
runs here).

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

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

from splavu_core.aam.config import LoopConfig, TrainConfig
from splavu_core.aam.diagnostics import PairCritic, diagnose_adapter
from splavu_core.aam.losses import confusion, info_nce, nt_xent
from splavu_core.aam.model import AnonymizingAdapter
from splavu_core.aam.training_data import TrainingData, training_clips
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


def train_loop(adapter: AnonymizingAdapter, data: TrainingData, cfg: TrainConfig, fit_idx: np.ndarray,
               held_idx: np.ndarray, diagnose: bool, lc_scale: float, log) -> dict:
    """The epochs of the joint step on the adapter's trainable stage (its fitted appearance projection and keep stages
    stay frozen; recentring is fitted after, by the caller, on what the selected epoch publishes). Loads the selected epoch's
    weights and leaves the adapter in eval mode. lc_scale: the LC term's normaliser.

    Returns {"history": per-epoch losses and validation metrics, "selected_epoch", "seconds" (of the epochs, unrounded),
    "raw" and "during": fresh-critic pair matching on held-out videos, of the raw latents and at diagnose_points
    epochs (None and [] when not `diagnose`)}."""
    loop = cfg.loop
    gen = torch.Generator().manual_seed(cfg.seed)
    acfg = adapter.cfg
    C, out = len(data.classes), acfg.out_dim                       # heads read the published width
    fixed = adapter.fixed_stages if acfg.keep else None            # heads pretrain on the kept subspace
    ar_head = ARHead(out, max(C, 2))
    tad_head = TADHead(out, max(len(data.tad_classes), 1))
    ad_head = ADHead(out)
    _pretrain_heads(data, cfg, tad_head, ad_head, gen, fixed)

    x_ar, y_ar, pool = training_clips(data)
    opt = torch.optim.AdamW(list(adapter.parameters()) + list(ar_head.parameters()), lr=loop.lr)
    opt_tad = torch.optim.AdamW(tad_head.parameters(), lr=loop.head_lr)
    opt_ad = torch.optim.AdamW(ad_head.parameters(), lr=loop.head_lr, weight_decay=5e-4)
    sampler = PairSampler(data, fit_idx, loop.pairs, gen)
    critic = PairCritic(out, loop.critic_hidden) if loop.privacy == "critic" else None
    opt_critic = torch.optim.AdamW(critic.parameters(), lr=loop.critic_lr) if critic else None
    oracle = _Oracle(data, fit_idx, loop, out) if loop.oracle else None
    steps_per_epoch = max(1, len(x_ar) // loop.batch) if len(x_ar) else max(1, len(fit_idx) // max(2, loop.batch // 4))
    diag_epochs = set(np.linspace(1, loop.epochs, loop.diagnose_points).round().astype(int).tolist()) if diagnose else set()
    raw = diagnose_adapter(None, data, fit_idx, held_idx, cfg.seed, cfg.diagnose_steps) if diagnose else None
    during, history, best = [], [], (-1.0, copy.deepcopy(adapter.state_dict()), 0)
    t0 = time.perf_counter()
    for epoch in range(1, loop.epochs + 1):
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
            target = adapter.fixed_stages(h).detach()               # consistency with the projected / kept space
            parts["lc"] = F.mse_loss(z, target) / lc_scale
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
            d = diagnose_adapter(adapter, data, fit_idx, held_idx, cfg.seed, cfg.diagnose_steps)
            during.append({"epoch": epoch, **d})
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
    return {"history": history, "selected_epoch": best[2], "seconds": time.perf_counter() - t0, "raw": raw,
            "during": during}
