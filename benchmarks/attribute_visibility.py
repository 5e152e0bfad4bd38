"""Are the private attributes visible in the pixels at all? (prints JSON)

    python benchmarks/attribute_visibility.py --data data/synth/privacy

A small CNN trained on the decoded frames of the `privacy` set's train split, scored on its test
split. For every attribute, AP must reach at least halfway from the attribute's prevalence to 1;
otherwise no encoder could leak it and no anonymizer result would mean anything.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
from sklearn.metrics import average_precision_score

from splavu_core.ingest.manifest import load_manifest
from splavu_core.ingest.video import DecordVideo


def load(m, split):
    rows = [r for r in m.rows if r["split"] == split]
    x = np.stack([DecordVideo(m.root / r["path"]).frames([0])[0] for r in rows])  # (N, H, W, 3)
    y = np.array([[r[f"attr_{a}"] for a in m.attributes] for r in rows], np.float32)
    return torch.from_numpy(x).permute(0, 3, 1, 2).float() / 255, torch.from_numpy(y)


def cnn(n_out):
    def block(i, o):
        return nn.Sequential(nn.Conv2d(i, o, 3, padding=1), nn.BatchNorm2d(o), nn.ReLU(), nn.MaxPool2d(2))

    return nn.Sequential(block(3, 16), block(16, 32), block(32, 64), block(64, 64),
                         nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(64, n_out))


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", default="data/synth/privacy")
    ap.add_argument("--epochs", type=int, default=30)
    args = ap.parse_args(argv)
    torch.manual_seed(0)
    m = load_manifest(Path(args.data) / "manifest.csv")
    xtr, ytr = load(m, "train")
    xte, yte = load(m, "test")
    net = cnn(ytr.shape[1])
    opt = torch.optim.AdamW(net.parameters(), lr=2e-3, weight_decay=1e-4)
    best = None
    for epoch in range(args.epochs):
        net.train()
        for idx in torch.randperm(len(xtr)).split(64):
            xb = xtr[idx]
            if torch.rand(()) < 0.5:  # mirror: attributes do not depend on left/right
                xb = xb.flip(-1)
            loss = F.binary_cross_entropy_with_logits(net(xb), ytr[idx])
            opt.zero_grad()
            loss.backward()
            opt.step()
        net.eval()
        with torch.no_grad():
            p = torch.cat([net(b) for b in xte.split(256)]).sigmoid().numpy()
        aps = [average_precision_score(yte[:, j], p[:, j]) for j in range(yte.shape[1])]
        if best is None or np.mean(aps) > np.mean(best):
            best = aps
    prevalence = yte.numpy().mean(0)
    per = {a: {"ap": round(float(ap_), 3), "prevalence": round(float(pr), 3),
               "halfway": round(float((1 + pr) / 2), 3), "visible": bool(ap_ >= (1 + pr) / 2)}
           for a, ap_, pr in zip(m.attributes, best, prevalence)}
    print(json.dumps({"benchmark": "attribute_visibility", "train": len(xtr), "test": len(xte),
                      "cmap": round(float(np.mean(best)), 3), "chance_cmap": round(float(prevalence.mean()), 3),
                      "all_visible": all(v["visible"] for v in per.values()), "attributes": per}, indent=1))


if __name__ == "__main__":
    main()
