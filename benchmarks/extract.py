"""Extraction throughput, measured in one run (prints JSON).

    python benchmarks/extract.py [--data DIR] [--checkpoint DIR] [--videos N] [--static-k K]

Four paths on the same videos, back to back in one process (ratios are what this measures; wall times on shared
cores are noisy, so each path also reports clips per CPU-second of this process):
- bare_forward: the model's forward alone on random input already in its layout, one batch at a time on torch's
  threads (the ceiling the issue measured);
- bare_forward_workers: the same forward run as extraction runs it (encoder_workers batches at once, one thread each
  on CPU): the ceiling of splavu's own threading;
- decode_only: decoding and staging the same clips on the decode threads, nothing encoded: the other half of a
  CPU's work, so decode_inclusive_ceiling = 1 / (1 / bare_forward_workers + 1 / decode_only) is the best a CPU can
  do when decode and forward share its cores perfectly (a GPU runs them on different devices: there the ceiling
  is the smaller of the two);
- encoder_only: FrozenEncoder.embed (prepare + forward) on clips decoded beforehand;
- end_to_end: splavu's path: threaded decode overlapped with batched encoding, then the Zarr shard commit;
- naive: decode a whole video, encode clip by clip at batch 1, then write.
Targets (CPU): end_to_end >= 0.9 x bare_forward and >= 1 x naive.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import torch

from splavu_core.encoders.vfm import DEMO_CHECKPOINT, load_encoder
from splavu_core.extract import decode_video, encoder_workers, extract_shard, manifest_hash
from splavu_core.manifest import load_manifest
from splavu_core.sampling import ClipSampling
from splavu_core.store import FeatureStore
from splavu_core.threads import intra_op_threads
from splavu_core.video import DecordVideo


class Timer:
    """Wall and process CPU time of a block (CPU time counts every thread of this process)."""

    def __enter__(self):
        self.t, self.c = time.perf_counter(), time.process_time()
        return self

    def __exit__(self, *exc):
        self.wall, self.cpu = time.perf_counter() - self.t, time.process_time() - self.c


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", help="a dataset folder with manifest.csv (default: generate the demo 'tad' set)")
    ap.add_argument("--checkpoint", default=str(DEMO_CHECKPOINT))
    ap.add_argument("--videos", type=int, default=40)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--static-k", type=int, default=0, help="static clips per video in end_to_end (0: clips only, "
                    "the same work in every path)")
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
    s = ClipSampling(clip_len=enc.num_frames, static_k=0)  # clips only, same work in all paths

    # warm-up (first call allocates)
    first = DecordVideo(m.root / rows[0]["path"])
    enc.embed(np.stack([first.frames(c.frames) for c in s.clips(first.info.n_frames, first.info.fps)[:2]]))

    decoded = []
    for r in rows:
        v = DecordVideo(m.root / r["path"])
        decoded += [v.frames(c.frames) for c in s.clips(v.info.n_frames, v.info.fps)]
    n_clips = len(decoded)
    timers = {}

    # 0. the bare model forward: the same number of clips, random input already prepared, no copies
    S = enc.preprocess.crop
    x = torch.randn(args.batch, enc.num_frames, 3, S, S, device=enc.device)
    with torch.no_grad(), torch.autocast(enc.device.type, dtype=enc.autocast_dtype or torch.float32,
                                         enabled=enc.autocast_dtype is not None):
        with Timer() as timers["bare_forward"]:
            for _ in range(0, n_clips, args.batch):
                enc.model(pixel_values=x).last_hidden_state.float().mean(1).cpu()

    # 0b. the same forward run as extraction runs it (encoder_workers batches at once, one intra-op thread each on
    # CPU): the ceiling of splavu's own threading, so end_to_end / this is the overhead of everything else
    workers = encoder_workers(enc)
    with torch.no_grad(), intra_op_threads(1 if enc.device.type == "cpu" and workers > 1 else None), \
            ThreadPoolExecutor(workers) as pool, Timer() as timers["bare_forward_workers"]:
        list(pool.map(lambda _: enc.embed_prepared(x), range(0, n_clips, args.batch)))

    # 0c. decoding alone, as the decode threads do it (decode + stage), nothing encoded
    with ThreadPoolExecutor(max(1, args.decode_threads)) as pool, Timer() as timers["decode_only"]:
        staged = list(pool.map(lambda r: decode_video(r, m.root, s, False, stage=enc.preprocess.stage), rows))
    assert sum(len(d.clips) for d in staged) == n_clips and not any(d.error for d in staged)
    del staged

    # 1. encoder alone on pre-decoded clips
    with Timer() as timers["encoder_only"]:
        for i in range(0, n_clips, args.batch):
            enc.embed(np.stack(decoded[i:i + args.batch]))
    del decoded
    n_bare = len(range(0, n_clips, args.batch)) * args.batch

    # 2. end to end: decode (threads) || encode, then commit the shard
    store = FeatureStore(work / "store")
    s_e2e = ClipSampling(clip_len=enc.num_frames, static_k=args.static_k)
    with Timer() as timers["end_to_end"]:
        out = extract_shard("bench-000", rows, m.root, enc, s_e2e, batch_size=args.batch,
                            decode_threads=args.decode_threads, static_splits=("train", "val", "test"))
        store.write_shard("bench-000", out, enc.provenance(s_e2e), manifest_hash(rows))
    assert len(out.clips) == n_clips
    n_e2e = n_clips + out.static.shape[0] * out.static.shape[1] if out.static.size else n_clips

    # 3. naive loop
    import zarr

    with Timer() as timers["naive"]:
        embs = []
        for r in rows:
            v = DecordVideo(m.root / r["path"])
            frames = v.all_frames()
            for c in s.clips(v.info.n_frames, v.info.fps):
                embs.append(enc.embed(frames[c.frames][None])[0])
        zarr.open_array(str(work / "naive.zarr"), mode="w", shape=(len(embs), enc.dim), dtype="float32")[:] = np.stack(embs)

    counts = {"bare_forward": n_bare, "bare_forward_workers": n_bare, "decode_only": n_clips, "encoder_only": n_clips,
              "end_to_end": n_e2e, "naive": len(embs)}
    wall = {k: counts[k] / t.wall for k, t in timers.items()}
    if enc.device.type == "cpu":
        ceiling = 1 / (1 / wall["bare_forward_workers"] + 1 / wall["decode_only"])
    else:
        ceiling = min(wall["bare_forward_workers"], wall["decode_only"])
    cpu = {k: counts[k] / t.cpu for k, t in timers.items()}
    result = {
        "benchmark": "extract", "encoder": enc.source, "family": enc.family, "dim": enc.dim,
        "device": str(enc.device), "autocast": str(enc.autocast_dtype), "torch_threads": torch.get_num_threads(),
        "decode_threads": args.decode_threads, "batch": args.batch, "videos": len(rows), "clips": n_clips,
        "static_k": args.static_k, "clips_end_to_end": n_e2e,
        "cpu_count": os.cpu_count(), "machine": platform.machine(), "load_avg": [round(x, 2) for x in os.getloadavg()],
        "clips_per_s": {k: round(v, 1) for k, v in wall.items()},
        "clips_per_cpu_s": {k: round(v, 1) for k, v in cpu.items()},
        "ratio_end_to_end_vs_bare_forward": round(wall["end_to_end"] / wall["bare_forward"], 3),
        "encoder_workers": workers,
        "ratio_end_to_end_vs_bare_forward_workers": round(wall["end_to_end"] / wall["bare_forward_workers"], 3),
        "decode_inclusive_ceiling_clips_per_s": round(ceiling, 1),
        "ratio_end_to_end_vs_decode_inclusive_ceiling": round(wall["end_to_end"] / ceiling, 3),
        "ratio_end_to_end_vs_encoder_only": round(wall["end_to_end"] / wall["encoder_only"], 3),
        "ratio_end_to_end_vs_naive": round(wall["end_to_end"] / wall["naive"], 3),
        "cpu_ratio_end_to_end_vs_bare_forward": round(cpu["end_to_end"] / cpu["bare_forward"], 3),
        "targets": {"end_to_end_vs_bare_forward": 0.9, "end_to_end_vs_naive": 1.0},
    }
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
