"""Extraction throughput, measured in one run (prints JSON).

    python benchmarks/extract.py [--data DIR] [--checkpoint DIR] [--videos N] [--static-k K] [--rounds R]

Six paths on the same videos in one process, each run --rounds times in alternating order, its best round kept
(ratios are what this measures; wall times on shared cores are noisy, so each path also reports clips per
CPU-second of this process):
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

from splavu_core.extract.encoders.vfm import DEMO_CHECKPOINT, load_encoder
from splavu_core.extract.sampling import ClipSampling
from splavu_core.extract.shards import decode_video, encoder_workers, extract_shard, manifest_hash
from splavu_core.ingest.manifest import load_manifest
from splavu_core.ingest.video import DecordVideo
from splavu_core.store.feature_store import FeatureStore
from splavu_core.threads import intra_op_threads


class Timer:
    """Wall and process CPU time of a block (CPU time counts every thread of this process)."""

    def __enter__(self):
        self.t, self.c = time.perf_counter(), time.process_time()
        return self

    def __exit__(self, *exc):
        self.wall, self.cpu = time.perf_counter() - self.t, time.process_time() - self.c


def add_clip_args(ap: argparse.ArgumentParser) -> None:
    """The options the extraction benchmarks share: which videos, which encoder, how many, batch size."""
    ap.add_argument("--data", help="a dataset folder with manifest.csv (default: generate the demo 'tad' set)")
    ap.add_argument("--checkpoint", default=str(DEMO_CHECKPOINT))
    ap.add_argument("--videos", type=int, default=40)
    ap.add_argument("--batch", type=int, default=16)


def dataset_folder(data: str | None, work: Path) -> Path:
    """--data, or the demo's 'tad' set generated under `work`."""
    if data:
        return Path(data)
    from splavu_core.ingest.synth.datasets import generate

    generate(work / "synth", "demo", seed=0, datasets=("tad",))
    return work / "synth" / "tad"


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_clip_args(ap)
    ap.add_argument("--static-k", type=int, default=0, help="static clips per video in end_to_end (0: clips only, "
                    "the same work in every path)")
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    ap.add_argument("--decode-threads", type=int, default=2)
    ap.add_argument("--device", default="auto")
    ap.add_argument("--rounds", type=int, default=2, help="times each path runs, in alternating order; the best "
                    "round of each counts")
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    work = Path(tempfile.mkdtemp(prefix="splavu-bench-"))
    m = load_manifest(dataset_folder(args.data, work) / "manifest.csv")
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
    n_bare = len(range(0, n_clips, args.batch)) * args.batch
    S = enc.preprocess.crop
    x = torch.randn(args.batch, enc.num_frames, 3, S, S, device=enc.device)
    workers = encoder_workers(enc)
    s_e2e = ClipSampling(clip_len=enc.num_frames, static_k=args.static_k)
    import zarr

    def bare_forward():  # the same number of clips, random input already prepared, no copies
        with torch.no_grad(), torch.autocast(enc.device.type, dtype=enc.autocast_dtype or torch.float32,
                                             enabled=enc.autocast_dtype is not None):
            for _ in range(0, n_clips, args.batch):
                enc.model(pixel_values=x).last_hidden_state.float().mean(1).cpu()
        return n_bare

    def bare_forward_workers():  # as extraction runs it: encoder_workers batches at once, one thread each on CPU
        with torch.no_grad(), intra_op_threads(1 if enc.device.type == "cpu" and workers > 1 else None), \
                ThreadPoolExecutor(workers) as pool:
            list(pool.map(lambda _: enc.embed_prepared(x), range(0, n_clips, args.batch)))
        return n_bare

    def decode_only():  # as the decode threads do it (decode + stage), nothing encoded
        with ThreadPoolExecutor(max(1, args.decode_threads)) as pool:
            staged = list(pool.map(lambda r: decode_video(r, m.root, s, False, stage=enc.preprocess.stage), rows))
        assert sum(len(d.clips) for d in staged) == n_clips and not any(d.error for d in staged)
        return n_clips

    def encoder_only():  # on clips decoded beforehand
        for i in range(0, n_clips, args.batch):
            enc.embed(np.stack(decoded[i:i + args.batch]))
        return n_clips

    def end_to_end():  # decode (threads) || encode, then commit the shard
        store = FeatureStore(Path(tempfile.mkdtemp(dir=work)) / "store")
        out = extract_shard("bench-000", rows, m.root, enc, s_e2e, batch_size=args.batch,
                            decode_threads=args.decode_threads, static_splits=("train", "val", "test"))
        store.write_shard("bench-000", out, enc.provenance(s_e2e), manifest_hash(rows))
        assert len(out.clips) == n_clips
        return n_clips + out.static.shape[0] * out.static.shape[1] if out.static.size else n_clips

    def naive():  # decode a whole video, encode clip by clip at batch 1, then write
        embs = []
        for r in rows:
            v = DecordVideo(m.root / r["path"])
            frames = v.all_frames()
            for c in s.clips(v.info.n_frames, v.info.fps):
                embs.append(enc.embed(frames[c.frames][None])[0])
        zarr.open_array(str(Path(tempfile.mkdtemp(dir=work)) / "naive.zarr"), mode="w", shape=(len(embs), enc.dim),
                        dtype="float32")[:] = np.stack(embs)
        return len(embs)

    paths = {f.__name__: f for f in (bare_forward, bare_forward_workers, decode_only, encoder_only, end_to_end, naive)}
    # rounds in alternating order, each path's best round kept: a burst of another job on shared cores slows one
    # round of one path, not the ratio
    rounds: dict[str, list[tuple[float, float]]] = {k: [] for k in paths}  # path -> [(clips/s, clips/cpu-s)]
    counts = {}
    for i in range(args.rounds):
        for name in (list(paths) if i % 2 == 0 else list(paths)[::-1]):
            with Timer() as t:
                counts[name] = paths[name]()
            rounds[name].append((counts[name] / t.wall, counts[name] / t.cpu))
    wall = {k: max(r[0] for r in v) for k, v in rounds.items()}
    cpu = {k: max(r[1] for r in v) for k, v in rounds.items()}
    n_e2e = counts["end_to_end"]
    if enc.device.type == "cpu":
        ceiling = 1 / (1 / wall["bare_forward_workers"] + 1 / wall["decode_only"])
    else:
        ceiling = min(wall["bare_forward_workers"], wall["decode_only"])
    result = {
        "benchmark": "extract", "encoder": enc.source, "family": enc.family, "dim": enc.dim,
        "device": str(enc.device), "autocast": str(enc.autocast_dtype), "torch_threads": torch.get_num_threads(),
        "decode_threads": args.decode_threads, "batch": args.batch, "videos": len(rows), "clips": n_clips,
        "static_k": args.static_k, "clips_end_to_end": n_e2e,
        "cpu_count": os.cpu_count(), "machine": platform.machine(), "load_avg": [round(x, 2) for x in os.getloadavg()],
        "rounds": args.rounds,
        "clips_per_s": {k: round(v, 1) for k, v in wall.items()},
        "clips_per_s_each_round": {k: [round(r[0], 1) for r in v] for k, v in rounds.items()},
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
