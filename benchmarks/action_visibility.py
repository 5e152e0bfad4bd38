"""Do the actions need the person's interior? A pixel CNN on raw vs person-blackened frames (prints JSON)

    python benchmarks/action_visibility.py --data data/synth/ar

The same small 3D CNN is trained from scratch twice on the `ar` set's decoded clips: once on the raw
frames, once on the frames `pixel_blacken` hands the encoder (person region, held object included, set to
black; the renderer's true masks). The epoch is chosen on the val split, top-1 is reported on the test
split (disjoint actors), for the motion-only classes, the hand-object interaction classes, and the three
classes that share one arm motion and differ only by the object (drink, eat, phone: chance 1/3 among
them; `same_motion_predicted_within`: how often the motion itself is still read, i.e. the prediction is
one of the three). If blackening costs the interaction classes and not the motion classes, the benchmark's utility
lives inside the person region, where a pixel anonymizer must destroy it.
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

from splavu_core.evaluation.protocols import top1_among
from splavu_core.extract.pixel import PixelAnonymizer
from splavu_core.ingest.manifest import load_manifest
from splavu_core.ingest.synth.figure import INTERACTIONS
from splavu_core.ingest.video import DecordVideo

SAME_MOTION = ("drink", "eat", "phone")
FRAMES = np.arange(0, 16, 2)  # 8 frames of the first 16-frame clip


def load(m, split, blacken: PixelAnonymizer | None, side: int):
    """(N, 3, 8, side, side) float clips and (N,) action names."""
    rows = [r for r in m.rows if r["split"] == split]
    clips = []
    for r in rows:
        path = m.root / r["path"]
        x = DecordVideo(path).frames(FRAMES)                                    # (8, H, W, 3) uint8
        if blacken is not None:
            x = blacken(path, FRAMES, x)
        x = torch.from_numpy(x).permute(3, 0, 1, 2).float() / 255               # (3, 8, H, W)
        clips.append(F.adaptive_avg_pool3d(x, (len(FRAMES), side, side)))
    return torch.stack(clips), np.array([r["action"] for r in rows])


def c3d(n_out: int) -> nn.Module:
    def block(i, o, t):
        return nn.Sequential(nn.Conv3d(i, o, 3, padding=1), nn.BatchNorm3d(o), nn.ReLU(), nn.MaxPool3d((t, 2, 2)))

    return nn.Sequential(block(3, 16, 1), block(16, 32, 2), block(32, 48, 2), block(48, 64, 2),
                         nn.AdaptiveAvgPool3d(1), nn.Flatten(), nn.Linear(64, n_out))


def fit(data, classes, epochs: int, seed: int) -> dict:
    torch.manual_seed(seed)
    (xtr, ytr), (xva, yva), (xte, yte) = data
    idx = {c: i for i, c in enumerate(classes)}
    ytr_t = torch.tensor([idx[a] for a in ytr])
    net = c3d(len(classes))
    opt = torch.optim.AdamW(net.parameters(), lr=2e-3, weight_decay=1e-4)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, epochs)

    def predict(x):
        net.eval()
        with torch.no_grad():
            return np.array(classes)[torch.cat([net(b) for b in x.split(64)]).argmax(1).numpy()]

    best = (-1.0, None)
    for _ in range(epochs):
        net.train()
        for b in torch.randperm(len(xtr)).split(32):
            loss = F.cross_entropy(net(xtr[b]), ytr_t[b])
            opt.zero_grad()
            loss.backward()
            opt.step()
        sched.step()
        val = float((predict(xva) == yva).mean())
        if val > best[0]:
            best = (val, predict(xte))
    pred = best[1]

    def top1(names):
        return round(top1_among(pred, yte, names), 3)

    trio = np.isin(yte, SAME_MOTION)
    motion = [c for c in classes if c not in INTERACTIONS]
    return {"val_top1": round(best[0], 3), "test_top1": top1(classes), "motion_top1": top1(motion),
            "interaction_top1": top1(list(INTERACTIONS)), "same_motion_top1": top1(list(SAME_MOTION)),
            "same_motion_predicted_within": round(float(np.isin(pred[trio], SAME_MOTION).mean()), 3)}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", default="data/synth/ar")
    ap.add_argument("--epochs", type=int, default=20)
    ap.add_argument("--side", type=int, default=56, help="frames are area-downsampled to side x side")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    m = load_manifest(Path(args.data) / "manifest.csv")
    classes = sorted({r["action"] for r in m.rows})
    if not set(SAME_MOTION) <= set(classes):
        raise SystemExit(f"{args.data}: no interaction classes (a v1 benchmark?); write v2 with `splavu synth`")
    out = {"benchmark": "action_visibility", "data": args.data, "classes": len(classes), "epochs": args.epochs,
           "side": args.side, "frames": len(FRAMES)}
    for name, blacken in (("raw", None), ("pixel_blacken", PixelAnonymizer.named("blacken", "rendered"))):
        t0 = time.perf_counter()
        data = [load(m, s, blacken, args.side) for s in ("train", "val", "test")]
        out[name] = {**fit(data, classes, args.epochs, args.seed), "seconds": round(time.perf_counter() - t0, 1)}
    out["n_test"] = int(len(data[2][1]))
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
