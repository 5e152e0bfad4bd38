"""int8 dynamic quantisation of the encoder's linear layers on CPU: speed and fidelity to fp32 (prints JSON).

    python benchmarks/extract_int8.py [--data DIR] [--checkpoint DIR] [--videos N] [--rounds R]

A candidate for cheaper CPU extraction (issue 45), measured, not a default: the same clips, decoded once, embedded by
the shipped encoder in fp32 and by a copy whose nn.Linear layers are quantised to int8 per tensor with dynamic
activation scales (torch.ao.quantization.quantize_dynamic); each path --rounds times in alternating order, its best
round kept. Fidelity: per-clip cosine between the two latents and the relative L2 error, and how often a clip's
nearest other clip (cosine) is the same under both, which is what neighbours, k-means and the probes read.
torch marks torch.ao.quantization as deprecated (torchao replaces it), another reason this stays a measurement.
"""
from __future__ import annotations

import argparse
import copy
import json
import os
import platform
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from extract import add_clip_args, dataset_folder  # benchmarks/extract.py, beside this script

from splavu_core.extract.encoders.vfm import int8_linear, load_encoder
from splavu_core.extract.sampling import ClipSampling
from splavu_core.ingest.manifest import load_manifest
from splavu_core.ingest.video import DecordVideo


def quantised(enc):
    """A copy of the FrozenEncoder whose model's nn.Linear layers are int8 (what `extract --quantize int8` loads)."""
    q = copy.copy(enc)
    q.model = int8_linear(enc.model)
    return q


def embed_all(enc, clips: list[np.ndarray], batch: int) -> np.ndarray:
    return np.concatenate([enc.embed(np.stack(clips[i:i + batch])) for i in range(0, len(clips), batch)])  # (N, D)


def nearest(x: np.ndarray) -> np.ndarray:
    z = x / np.linalg.norm(x, axis=1, keepdims=True)
    sim = z @ z.T
    np.fill_diagonal(sim, -np.inf)
    return sim.argmax(1)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_clip_args(ap)
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args(argv)
    m = load_manifest(dataset_folder(args.data, Path(tempfile.mkdtemp(prefix="splavu-int8-"))) / "manifest.csv")
    enc = load_encoder(args.checkpoint, device="cpu")
    s = ClipSampling(clip_len=enc.num_frames, static_k=0)
    clips = []
    for r in m.rows[: args.videos]:
        v = DecordVideo(m.root / r["path"])
        clips += [v.frames(c.frames) for c in s.clips(v.info.n_frames, v.info.fps)]
    paths = {"fp32": enc, "int8_dynamic": quantised(enc)}
    for e in paths.values():  # warm-up: first calls allocate
        e.embed(np.stack(clips[:2]))
    best: dict[str, float] = {}
    out: dict[str, np.ndarray] = {}
    for i in range(args.rounds):
        for name in (list(paths) if i % 2 == 0 else list(paths)[::-1]):
            t = time.perf_counter()
            out[name] = embed_all(paths[name], clips, args.batch)
            best[name] = max(best.get(name, 0.0), len(clips) / (time.perf_counter() - t))
    a, b = out["fp32"].astype(np.float64), out["int8_dynamic"].astype(np.float64)
    cos = (a * b).sum(1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))
    rel = np.linalg.norm(a - b, axis=1) / np.linalg.norm(a, axis=1)
    print(json.dumps({
        "benchmark": "extract_int8", "encoder": enc.source, "dim": enc.dim, "videos": min(args.videos, len(m.rows)),
        "clips": len(clips), "batch": args.batch, "rounds": args.rounds, "torch_threads": torch.get_num_threads(),
        "cpu_count": os.cpu_count(), "machine": platform.machine(), "quantized_engine": torch.backends.quantized.engine,
        "clips_per_s": {k: round(v, 1) for k, v in best.items()},
        "speedup_int8_vs_fp32": round(best["int8_dynamic"] / best["fp32"], 3),
        "cosine": {"mean": round(float(cos.mean()), 5), "p01": round(float(np.quantile(cos, 0.01)), 5),
                   "min": round(float(cos.min()), 5)},
        "relative_l2": {"mean": round(float(rel.mean()), 5), "p99": round(float(np.quantile(rel, 0.99)), 5)},
        "same_nearest_clip": round(float((nearest(a) == nearest(b)).mean()), 4),
    }, indent=1))


if __name__ == "__main__":
    main()
