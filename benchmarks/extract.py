"""Extraction throughput and where its time goes, measured in one run (prints JSON).

    python benchmarks/extract.py [--data DIR] [--checkpoint DIR] [--videos N] [--static-k K] [--rounds R]
                                 [--decoders 1,2,...] [--decoder decord|nvdec|auto] [--device auto|cpu|cuda]

The paths below run on the same videos in one process, each --rounds times in alternating order, its best round kept
(ratios are what this measures; wall times on shared cores are noisy, so each path also reports clips per CPU-second:
this process's and its decoder processes', the cost that another job on the cores does not change):
- bare_forward: the model's forward alone on random input already in its layout, one batch at a time on torch's
  threads;
- bare_forward_workers: the same forward run as extraction runs it (encoder_workers batches at once, one thread each
  on CPU): the forward ceiling;
- decode_only[n]: n decoder processes decoding the same videos and handing their frames over in shared memory,
  nothing encoded: the decode ceiling with n workers (n in --decoders, default 1 .. the cores);
- prepare_only / copy_only: one batch's uint8 clips prepared on the encoder's device (crop or resize, float,
  normalise) / copied from host memory to the device (CUDA only), repeated for every clip;
- encoder_only: FrozenEncoder.embed (prepare + forward) on clips decoded beforehand;
- end_to_end[n]: splavu's path with n decoder processes (decode || copy || prepare + forward, then the Zarr commit),
  with each stage's busy seconds (decode, copy, prepare, forward, write; summed over the processes and threads that
  ran it: splavu_core/extract/stage_times.py);
- end_to_end_threads: the path before issue 61 (decode threads in this process, SPLAVU_DECODE_WORKERS=0), whose
  shard must have the same bytes (zarr_bytes_identical);
- naive: decode a whole video, encode clip by clip at batch 1, then write;
- with --decoder nvdec (or auto on a GPU that has it): decode_only_nvdec and end_to_end_nvdec, NVDEC decoding.
Ratios: end_to_end / min(decode ceiling, forward ceiling) (the bound on a GPU, where they run on different devices);
on CPU also / the decode-inclusive ceiling 1 / (1 / forward + 1 / decode) (both share the cores);
decode_workers_speedup = decode_only[N] / decode_only[1]; end_to_end / end_to_end_threads.
Targets (CPU): decode_workers_speedup >= 1.7 at 2 workers on 2 cores; end_to_end >= 1.0 x end_to_end_threads;
identical Zarr bytes. GPU: benchmarks/extract_gpu.sh.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import torch

from splavu_core.extract import decode_pool
from splavu_core.extract.decode_pool import Task, available_cores, decoder_pool
from splavu_core.extract.encoders.vfm import DEMO_CHECKPOINT, load_encoder
from splavu_core.extract.sampling import ClipSampling
from splavu_core.extract.shards import (_decode_on_gpu, _from_threads, choose_decoder, encoder_workers, extract_shard,
                                        manifest_hash)
from splavu_core.extract.stage_times import StageTimes
from splavu_core.ingest.manifest import load_manifest
from splavu_core.ingest.video import DecordVideo
from splavu_core.store.feature_store import FeatureStore
from splavu_core.threads import intra_op_threads


def decoders_cpu_s() -> float:
    """CPU seconds this process's idle decoder processes have used (decode_pool keeps them between shards)."""
    tick, total = os.sysconf("SC_CLK_TCK"), 0.0
    for pool in decode_pool._idle.values():
        for pid in pool.pids:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            total += (int(fields[11]) + int(fields[12])) / tick  # utime, stime
    return total


class Timer:
    """Wall and CPU time of a block: every thread of this process, and its decoder processes."""

    def __enter__(self):
        self.t, self.c = time.perf_counter(), time.process_time() + decoders_cpu_s()
        return self

    def __exit__(self, *exc):
        self.wall, self.cpu = time.perf_counter() - self.t, time.process_time() + decoders_cpu_s() - self.c


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


def cpu_name() -> str:
    try:
        return next(line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                    if line.startswith("model name"))
    except (OSError, StopIteration):
        return platform.processor()


def shard_bytes(store: Path, shard: str) -> str:
    """One hash of a committed shard's files (the quarantine table has a timestamp, so it is left out)."""
    d = store / "latents" / shard
    h = hashlib.sha256()
    for f in sorted(p for p in d.rglob("*") if p.is_file() and p.name != "quarantine.parquet"):
        h.update(str(f.relative_to(d)).encode() + f.read_bytes())
    return h.hexdigest()


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_clip_args(ap)
    ap.add_argument("--static-k", type=int, default=0, help="static clips per video in the end_to_end paths (0: clips "
                    "only, the same work in every path)")
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    ap.add_argument("--decode-threads", type=int, default=2, help="decode threads of end_to_end_threads and NVDEC")
    ap.add_argument("--decoders", default="", help="decoder process counts to run, e.g. 1,2,4 (default: 1 .. the "
                    "cores); the last is end_to_end's, against 1 for decode_workers_speedup")
    ap.add_argument("--encoder-workers", type=int, default=0, help="batches encoded at once (0: encoder_workers')")
    ap.add_argument("--decoder", default="decord", choices=("decord", "nvdec", "auto"),
                    help="nvdec / auto: also the NVDEC paths (GPU decoding)")
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
    cuda = enc.device.type == "cuda"
    s = ClipSampling(clip_len=enc.num_frames, static_k=0)  # clips only, same work in all paths
    decoders = [int(n) for n in args.decoders.split(",")] if args.decoders else list(range(1, available_cores() + 1))
    decoders = sorted(set(decoders) | {1})
    nvdec = choose_decoder(args.decoder, enc.device) == "nvdec"

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
    u8 = [torch.from_numpy(np.ascontiguousarray(c)) for c in decoded[: args.batch]]  # one batch, host uint8
    u8_dev = [c.to(enc.device) for c in u8]
    workers = encoder_workers(enc, args.encoder_workers)
    s_e2e = ClipSampling(clip_len=enc.num_frames, static_k=args.static_k)
    stores = {}
    stage_times: dict[str, list[StageTimes]] = {}

    def sync():
        if cuda:
            torch.cuda.synchronize()

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

    def decode_only(n):  # n decoder processes, frames handed over in shared memory, nothing encoded
        def run():
            resize = (enc.preprocess.short_side, enc.preprocess.crop)
            tasks = [Task(i, str(m.root / r["path"]), False, s, resize) for i, r in enumerate(rows)]
            with decoder_pool(n) as pool:
                got = sum(len(d.clips) for d in pool.decode(tasks) if not d.error)
            assert got == n_clips, (got, n_clips)
            return n_clips
        run.__name__ = f"decode_only_{n}"
        return run

    def decode_only_nvdec():  # NVDEC in the decode threads, frames on the GPU, nothing encoded
        got = sum(len(d.clips) for d in _from_threads(lambda r: _decode_on_gpu(r, m.root, s, False), rows,
                                                         args.decode_threads, None) if not d.error)
        sync()
        assert got == n_clips, (got, n_clips)
        return n_clips

    def prepare_only():  # one batch of host uint8 clips prepared on the device, as many times as there are batches
        with intra_op_threads(1 if enc.device.type == "cpu" and workers > 1 else None), \
                ThreadPoolExecutor(workers) as pool:
            list(pool.map(lambda _: enc.preprocess.on_device(u8_dev, enc.num_frames), range(0, n_clips, args.batch)))
        sync()
        return n_bare

    def copy_only():  # one batch of host uint8 clips to the device (pinned, then copied), for every batch
        for _ in range(0, n_clips, args.batch):
            [c.pin_memory().to(enc.device, non_blocking=True) for c in u8]
        sync()
        return n_bare

    def encoder_only():  # on clips decoded beforehand
        for i in range(0, n_clips, args.batch):
            enc.embed(np.stack(decoded[i:i + args.batch]))
        return n_clips

    def end_to_end(name: str, **kw):  # decode || encode, then commit the shard
        def run():
            times = StageTimes()
            root = Path(tempfile.mkdtemp(dir=work)) / "store"
            out = extract_shard("bench-000", rows, m.root, enc, s_e2e, batch_size=args.batch, workers=args.encoder_workers,
                                decode_threads=args.decode_threads, static_splits=("train", "val", "test"), times=times,
                                **kw)
            t0 = time.perf_counter()
            FeatureStore(root).write_shard("bench-000", out, enc.provenance(s_e2e), manifest_hash(rows))
            times.add(write=time.perf_counter() - t0)
            stores[name] = root
            stage_times.setdefault(name, []).append(times)
            assert len(out.clips) == n_clips
            return n_clips + out.static.shape[0] * out.static.shape[1] if out.static.size else n_clips
        run.__name__ = name
        return run

    def naive():  # decode a whole video, encode clip by clip at batch 1, then write
        import zarr

        embs = []
        for r in rows:
            v = DecordVideo(m.root / r["path"])
            frames = v.all_frames()
            for c in s.clips(v.info.n_frames, v.info.fps):
                embs.append(enc.embed(frames[c.frames][None])[0])
        zarr.open_array(str(Path(tempfile.mkdtemp(dir=work)) / "naive.zarr"), mode="w", shape=(len(embs), enc.dim),
                        dtype="float32")[:] = np.stack(embs)
        return len(embs)

    paths = [bare_forward, bare_forward_workers, prepare_only, *([copy_only] if cuda else []), encoder_only,
             *(decode_only(n) for n in decoders), end_to_end("end_to_end_threads", decoders=0, decoder="decord"),
             *(end_to_end(f"end_to_end_{n}", decoders=n, decoder="decord") for n in decoders), naive]
    if nvdec:
        paths += [decode_only_nvdec, end_to_end("end_to_end_nvdec", decoder="nvdec")]
    paths = {f.__name__: f for f in paths}
    for n in decoders:  # start each size's decoder processes once: a shard in `splavu extract` finds them started
        paths[f"decode_only_{n}"]()
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
    best = {k: int(np.argmax([r[0] for r in rounds[k]])) for k in stage_times}

    def stages(name):  # the best round's busy seconds per stage, and each as a share of that round's wall time
        t = stage_times[name][best[name]].as_dict()
        wall_s = counts[name] / rounds[name][best[name]][0]
        return {"wall_s": round(wall_s, 3), "busy_s": t, "busy_share": {k: round(v / wall_s, 3) for k, v in t.items()}}

    N = decoders[-1]
    e2e, decode_ceiling, forward_ceiling = wall[f"end_to_end_{N}"], wall[f"decode_only_{N}"], wall["bare_forward_workers"]
    per_workers = [{"decoders": n, "decode_only_clips_per_s": round(wall[f"decode_only_{n}"], 1),
                    "end_to_end_clips_per_s": round(wall[f"end_to_end_{n}"], 1),
                    "decode_speedup_vs_1": round(wall[f"decode_only_{n}"] / wall["decode_only_1"], 3),
                    **stages(f"end_to_end_{n}")} for n in decoders]
    identical = shard_bytes(stores[f"end_to_end_{N}"], "bench-000") == shard_bytes(stores["end_to_end_threads"],
                                                                                  "bench-000")
    result = {
        "benchmark": "extract", "encoder": enc.source, "family": enc.family, "dim": enc.dim,
        "device": str(enc.device), "device_name": torch.cuda.get_device_name(enc.device) if cuda else cpu_name(),
        "autocast": str(enc.autocast_dtype), "torch_threads": torch.get_num_threads(),
        "encoder_workers": workers, "decode_threads": args.decode_threads, "decoders": N, "batch": args.batch,
        "videos": len(rows), "clips": n_clips, "static_k": args.static_k, "clips_end_to_end": counts[f"end_to_end_{N}"],
        "cpu_count": os.cpu_count(), "cores_available": available_cores(), "machine": platform.machine(),
        "load_avg": [round(x, 2) for x in os.getloadavg()], "rounds": args.rounds,
        "clips_per_s": {k: round(v, 1) for k, v in wall.items()},
        "clips_per_s_each_round": {k: [round(r[0], 1) for r in v] for k, v in rounds.items()},
        "clips_per_cpu_s": {k: round(v, 1) for k, v in cpu.items()},
        "workers": per_workers,
        "stages_threads": stages("end_to_end_threads"),
        "decode_ceiling_clips_per_s": round(decode_ceiling, 1),
        "forward_ceiling_clips_per_s": round(forward_ceiling, 1),
        "ratio_end_to_end_vs_min_ceiling": round(e2e / min(decode_ceiling, forward_ceiling), 3),
        "decode_workers_speedup": round(wall[f"decode_only_{N}"] / wall["decode_only_1"], 3),
        "ratio_end_to_end_vs_threads": round(e2e / wall["end_to_end_threads"], 3),
        "cpu_ratio_end_to_end_vs_threads": round(cpu[f"end_to_end_{N}"] / cpu["end_to_end_threads"], 3),
        "zarr_bytes_identical": identical,
        "ratio_end_to_end_vs_bare_forward": round(e2e / wall["bare_forward"], 3),
        "ratio_end_to_end_vs_naive": round(e2e / wall["naive"], 3),
        "targets": {"decode_workers_speedup": 1.7, "ratio_end_to_end_vs_threads": 1.0, "zarr_bytes_identical": True},
    }
    if not cuda:  # decode and forward share the cores: the best they can do together is a harmonic sum
        ceiling = 1 / (1 / forward_ceiling + 1 / decode_ceiling)
        result["decode_inclusive_ceiling_clips_per_s"] = round(ceiling, 1)
        result["ratio_end_to_end_vs_decode_inclusive_ceiling"] = round(e2e / ceiling, 3)
    else:
        result["targets"]["ratio_end_to_end_vs_min_ceiling"] = 0.8
    if nvdec:
        result["stages_nvdec"] = stages("end_to_end_nvdec")
        result["ratio_nvdec_end_to_end_vs_min_ceiling"] = round(
            wall["end_to_end_nvdec"] / min(wall["decode_only_nvdec"], forward_ceiling), 3)
        result["targets"]["nvdec_end_to_end_clips_per_s"] = 2000
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
