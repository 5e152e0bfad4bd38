"""Reproduce the shipped demo encoder: a small VideoMAE pretrained on freshly rendered clips.

    python -m splavu_core.extract.encoders.train_demo --out DIR --steps 3600                      # from scratch
    python -m splavu_core.extract.encoders.train_demo --out DIR --init splavu_core/extract/encoders/demo_checkpoint --steps 2700

A real VFM is pretrained on millions of videos and ends up encoding both motion and appearance.
This stands in for that: a supervised action head over the v2 world's actions (motion and hand-object
interactions), appearance heads over a *pretraining* vocabulary (skin tone, hair, shirt colour,
scene...) and a gait head (stride rate, arm swing, bounce of walking clips), trained on clips rendered
in memory from generator seeds disjoint from every benchmark dataset. Evaluation sets are never seen.
`--init` starts from a saved encoder (safetensors via `from_pretrained`); the heads start fresh.
"""
from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

from splavu_core.extract.encoders.preprocess import Preprocess
from splavu_core.ingest.synth.figure import ACTIONS_V2, GAIT_RANGES, IDLE, INTERACTIONS, random_actor
from splavu_core.ingest.synth.render import random_shot, render

CLIP_LEN, SIZE = 16, 112
CLASSES = ACTIONS_V2 + (IDLE,)
INTERACTION_IDS = [CLASSES.index(a) for a in INTERACTIONS]
WALKS = torch.tensor([CLASSES.index(a) for a in ("walk_left", "walk_right")])
VOCAB = {"skin": 4, "female": 2, "face": 2, "striped": 2, "shirt": 6, "hat": 2, "hair": 4, "scene": 4}
SEED_BASE = 10_000  # benchmark datasets use keys (seed, code < 100, ...): disjoint


def encoder_config():
    from transformers import VideoMAEConfig  # transformers: seconds to import

    return VideoMAEConfig(image_size=SIZE, patch_size=16, num_frames=CLIP_LEN, tubelet_size=4, hidden_size=192,
                          num_hidden_layers=4, num_attention_heads=3, intermediate_size=768,
                          use_mean_pooling=False, attn_implementation="sdpa")


def gait_targets(actor) -> np.ndarray:
    """The actor's gait parameters scaled to [0, 1]: (3,)."""
    return np.array([(getattr(actor, k) - lo) / (hi - lo) for k, (lo, hi) in GAIT_RANGES.items()], dtype=np.float32)


def sample_clip(key) -> tuple[np.ndarray, int, dict, np.ndarray]:
    """One fresh training clip: (T, H, W, 3) uint8, action index (-100 for static close-ups), appearance
    labels, gait targets."""
    rng = np.random.default_rng(key)
    actor = random_actor(rng)
    if rng.random() < 0.2:  # static close-up, like the photos a VFM also sees
        frames = render(actor, [("wave", 0, CLIP_LEN)], CLIP_LEN, rng, shot=random_shot(rng, closeup=True), static_frame=0)
        return frames, -100, actor.vocabulary(), gait_targets(actor)
    a = int(rng.integers(len(CLASSES)))
    timeline = [] if CLASSES[a] == IDLE else [(CLASSES[a], 0, CLIP_LEN)]
    return render(actor, timeline, CLIP_LEN, rng), a, actor.vocabulary(), gait_targets(actor)


class Pool:
    """Rendered clips kept in memory; a few are replaced by fresh renders every step."""

    def __init__(self, size: int, seed: int):
        self.seed, self.next = seed, 0
        self.frames = np.empty((size, CLIP_LEN, SIZE, SIZE, 3), dtype=np.uint8)
        self.action = np.empty(size, dtype=np.int64)
        self.vocab = {k: np.empty(size, dtype=np.int64) for k in VOCAB}
        self.gait = np.empty((size, len(GAIT_RANGES)), dtype=np.float32)
        for i in range(size):
            self._fill(i)

    def _fill(self, i):
        frames, a, v, g = sample_clip((SEED_BASE + self.seed, self.next))
        self.next += 1
        self.frames[i], self.action[i], self.gait[i] = frames, a, g
        for k in VOCAB:
            self.vocab[k][i] = v[k]

    def refresh(self, n, rng):
        for i in rng.choice(len(self.action), n, replace=False):
            self._fill(int(i))

    def batch(self, idx):
        return (self.frames[idx], torch.from_numpy(self.action[idx]),
                {k: torch.from_numpy(v[idx]) for k, v in self.vocab.items()}, torch.from_numpy(self.gait[idx]))


class Pretrainer(nn.Module):
    def __init__(self, init: str | None = None):
        super().__init__()
        from transformers import VideoMAEModel  # transformers: seconds to import

        self.encoder = (VideoMAEModel.from_pretrained(init, attn_implementation="sdpa") if init
                        else VideoMAEModel(encoder_config()))
        d = self.encoder.config.hidden_size
        self.action = nn.Linear(d, len(CLASSES))
        self.heads = nn.ModuleDict({k: nn.Linear(d, n) for k, n in VOCAB.items()})
        self.gait = nn.Linear(d, len(GAIT_RANGES))

    def forward(self, pixels):
        h = self.encoder(pixel_values=pixels).last_hidden_state.mean(1)  # (B, D): the embedding we store
        return self.action(h), {k: head(h) for k, head in self.heads.items()}, self.gait(h)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--steps", type=int, default=3600)
    ap.add_argument("--batch", type=int, default=24)
    ap.add_argument("--lr", type=float, default=5e-4)
    ap.add_argument("--pool", type=int, default=3000)
    ap.add_argument("--held", type=int, default=320, help="held-out renders for model selection")
    ap.add_argument("--refresh", type=int, default=6)
    ap.add_argument("--eval-every", type=int, default=300)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--init", help="start from this saved encoder (a folder with model.safetensors)")
    args = ap.parse_args(argv)
    torch.manual_seed(args.seed)
    torch.set_num_threads(args.threads)
    rng = np.random.default_rng(args.seed)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    pre = Preprocess(short_side=SIZE, crop=SIZE)
    t0 = time.time()
    pool = Pool(args.pool, args.seed)
    held = Pool(args.held, args.seed + 1)  # held-out renders (own seeds) for model selection
    print(f"rendered pool in {time.time() - t0:.0f}s", flush=True)
    model = Pretrainer(args.init)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.05)
    warm = 200
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1, (s + 1) / warm) * 0.5 * (1 + math.cos(math.pi * min(1, s / args.steps))))
    log, best = [], -1.0
    for step in range(1, args.steps + 1):
        model.train()
        frames, action, vocab, gait = pool.batch(rng.choice(args.pool, args.batch, replace=False))
        logits, app, gait_hat = model(pre(frames))
        loss_a = F.cross_entropy(logits, action, ignore_index=-100)
        loss_v = sum(F.cross_entropy(app[k], vocab[k]) for k in VOCAB) / len(VOCAB)
        walking = torch.isin(action, WALKS)  # gait shows only while walking
        loss_g = F.mse_loss(gait_hat[walking], gait[walking]) if walking.any() else gait_hat.sum() * 0
        loss = loss_a + loss_v + loss_g
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        pool.refresh(args.refresh, rng)
        if step % 50 == 0:
            print(f"step {step} loss_action {loss_a.item():.3f} loss_appearance {loss_v.item():.3f} "
                  f"loss_gait {loss_g.item():.4f} "
                  f"{time.time() - t0:.0f}s", flush=True)
        if step % args.eval_every == 0 or step == args.steps:
            acc, app_acc, extra = evaluate(model, held, pre)
            entry = {"step": step, "minutes": round((time.time() - t0) / 60, 2), "loss": round(loss.item(), 4),
                     "heldout_action_top1": acc, **extra, "heldout_appearance_acc": app_acc}
            log.append(entry)
            print(json.dumps(entry), flush=True)
            if acc >= best:
                best = acc
                save(model, out, pre, entry, args)
    (out / "training_log.json").write_text(json.dumps({"args": vars(args), "log": log}, indent=1) + "\n")


@torch.no_grad()
def evaluate(model, held, pre):
    model.eval()
    idx = np.arange(len(held.action))
    app_correct = {k: 0 for k in VOCAB}
    hits, labels, gait_err = [], [], []
    for i in range(0, len(idx), 48):
        frames, action, vocab, gait = held.batch(idx[i:i + 48])
        logits, app, gait_hat = model(pre(frames))
        m = action >= 0
        hits.append((logits.argmax(1)[m] == action[m]).numpy())
        labels.append(action[m].numpy())
        walking = torch.isin(action, WALKS)
        gait_err.append((gait_hat[walking] - gait[walking]).abs().mean(1).numpy())
        for k in VOCAB:
            app_correct[k] += int((app[k].argmax(1) == vocab[k]).sum())
    hits, labels, gait_err = np.concatenate(hits), np.concatenate(labels), np.concatenate(gait_err)
    inter = np.isin(labels, INTERACTION_IDS)
    extra = {"heldout_interaction_top1": round(float(hits[inter].mean()), 4) if inter.any() else None,
             "heldout_motion_top1": round(float(hits[~inter].mean()), 4) if (~inter).any() else None,
             "heldout_gait_abs_err": round(float(gait_err.mean()), 4) if len(gait_err) else None}
    return round(float(hits.mean()), 4), {k: round(v / len(idx), 3) for k, v in app_correct.items()}, extra


def save(model, out, pre, entry, args):
    model.encoder.save_pretrained(out, safe_serialization=True)
    cfg = {"do_resize": True, "size": {"shortest_edge": pre.short_side}, "do_center_crop": True,
           "crop_size": {"height": pre.crop, "width": pre.crop}, "do_rescale": True, "rescale_factor": pre.rescale,
           "do_normalize": True, "image_mean": list(pre.mean), "image_std": list(pre.std),
           "image_processor_type": "VideoMAEImageProcessor"}
    (out / "preprocessor_config.json").write_text(json.dumps(cfg, indent=1) + "\n")
    (out / "selected.json").write_text(json.dumps({"selected": entry, "args": vars(args)}, indent=1) + "\n")


if __name__ == "__main__":
    main()
