"""Extraction throughput, measured in one run (prints JSON).

    python benchmarks/extract.py [--data DIR] [--checkpoint DIR] [--videos N]

- encoder_only: the encoder on clips decoded beforehand (the ceiling);
- end_to_end: splavu's path: threaded decode overlapped with batched encoding, then the Zarr shard commit;
- naive: decode a whole video, encode clip by clip at batch 1, then write.
Targets: end_to_end / encoder_only >= 0.8, end_to_end / naive >= 2.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from splavu_core.encoders.vfm import DEMO_CHECKPOINT, load_encoder  # noqa: E402
from splavu_core.extract import extract_shard, manifest_hash  # noqa: E402
from splavu_core.manifest import load_manifest  # noqa: E402
from splavu_core.sampling import ClipSampling  # noqa: E402
from splavu_core.store import FeatureStore  # noqa: E402
from splavu_core.video import DecordVideo  # noqa: E402


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", help="a dataset folder with manifest.csv (default: generate the demo 'tad' set)")
    ap.add_argument("--checkpoint", default=str(DEMO_CHECKPOINT))
    ap.add_argument("--videos", type=int, default=40)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    ap.add_argument("--decode-threads", type=int, default=2)
    ap.add_argument("--device", default="auto")
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    work = Path(tempfile.mkdtemp(prefix="splavu-bench-"))
    if args.data:
        data = Path(args.data)
    else:
        from splavu_core.synth.datasets import generate

        generate(work / "synth", "demo", seed=0, datasets=("tad",))
        data = work / "synth" / "tad"
    m = load_manifest(data / "manifest.csv")
    rows = m.rows[: args.videos]
    enc = load_encoder(args.checkpoint, device=args.device)
    s = ClipSampling(clip_len=enc.num_frames, static_k=0)  # clips only, same work in all three paths

    # warm-up (first call allocates)
    first = DecordVideo(m.root / rows[0]["path"])
    enc.embed(np.stack([first.frames(c.frames) for c in s.clips(first.info.n_frames, first.info.fps)[:2]]))

    # 1. encoder alone on pre-decoded clips
    decoded = []
    for r in rows:
        v = DecordVideo(m.root / r["path"])
        decoded += [v.frames(c.frames) for c in s.clips(v.info.n_frames, v.info.fps)]
    n_clips = len(decoded)
    t = time.perf_counter()
    for i in range(0, n_clips, args.batch):
        enc.embed(np.stack(decoded[i:i + args.batch]))
    encoder_only = n_clips / (time.perf_counter() - t)
    del decoded

    # 2. end to end: decode (threads) || encode, then commit the shard
    store = FeatureStore(work / "store")
    t = time.perf_counter()
    out = extract_shard("bench-000", rows, m.root, enc, s, batch_size=args.batch, decode_threads=args.decode_threads)
    store.write_shard("bench-000", out, enc.provenance(s), manifest_hash(rows))
    end_to_end = len(out.clips) / (time.perf_counter() - t)
    assert len(out.clips) == n_clips

    # 3. naive loop
    import zarr

    t = time.perf_counter()
    embs = []
    for r in rows:
        v = DecordVideo(m.root / r["path"])
        frames = v.all_frames()
        for c in s.clips(v.info.n_frames, v.info.fps):
            embs.append(enc.embed(frames[c.frames][None])[0])
    zarr.open_array(str(work / "naive.zarr"), mode="w", shape=(len(embs), enc.dim), dtype="float32")[:] = np.stack(embs)
    naive = len(embs) / (time.perf_counter() - t)

    result = {
        "benchmark": "extract", "encoder": enc.source, "family": enc.family, "dim": enc.dim,
        "device": str(enc.device), "autocast": str(enc.autocast_dtype), "torch_threads": torch.get_num_threads(),
        "decode_threads": args.decode_threads, "batch": args.batch, "videos": len(rows), "clips": n_clips,
        "cpu_count": os.cpu_count(), "machine": platform.machine(),
        "clips_per_s": {"encoder_only": round(encoder_only, 1), "end_to_end": round(end_to_end, 1), "naive": round(naive, 1)},
        "ratio_end_to_end_vs_encoder_only": round(end_to_end / encoder_only, 3),
        "ratio_end_to_end_vs_naive": round(end_to_end / naive, 3),
        "targets": {"end_to_end_vs_encoder_only": 0.8, "end_to_end_vs_naive": 2.0},
    }
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
