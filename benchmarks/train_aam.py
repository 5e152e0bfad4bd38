"""AAM training from cached latents vs. one epoch with the encoder in the loop (prints JSON).

    python benchmarks/train_aam.py --store STORE [--epochs 60] [--clips 256]

STORE must already hold the latents of the registered datasets ar / tad / ad (committed shards,
static latents of the training videos), as `make demo` leaves them.

(a) cached: wall time of load_training_data(store) + the library's train_aam(data, TrainConfig(epochs=N))
    (the other fields are the defaults `make demo` trains with). Per epoch: the loop's seconds / N
    for a trained adapter; for the closed-form default (keep, no loop) the fit's seconds, its one pass.
(b) encoder in the loop: the same epoch as a pixel-level method must run it, every clip it reads
    decoded from its video (decord) and encoded by the frozen encoder (the store's provenance
    `encoder_source`; --checkpoint overrides). What an epoch reads is observed, not re-derived:
    one run of train_aam (1 epoch) with its adapter, keep fit and diagnostics wrapped logs each
    clip handed to the adapter (matched to its cached clip by content; the diagnostics' left out)
    or to the keep fit, by how a loader gets it:
      clips   one sampled clip of a video (AR batches, validation clips, a privacy pair's moving clip)
      videos  every clip of a video (TAD / AD sequences; every task video the keep fit reads)
      static  one frame repeated (the privacy pairs' static clips; the keep fit's static clips)
    Only --clips of them (split across the modes in proportion) are decoded and encoded; the cost
    per clip of each mode is extrapolated linearly to the epoch's count, so
        encoder-in-the-loop epoch = extrapolated (decode + encode) + cached epoch.
    The subset's features also go through train_aam itself (subset_adapter_step_s), to show the
    loop end to end. This is a lower bound for a pixel-level method: a frozen forward pass only,
    no augmentation, no backward pass through the encoder.
ratio = encoder-in-the-loop epoch / cached epoch (the paper reports ~34x: 185 min vs 5.4 min).
"""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import math
import os
import platform
import sys
import time
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import torch

import splavu_core.aam.train as lib
from splavu_core.aam.config import LoopConfig, TrainConfig
from splavu_core.aam.train import train_aam
from splavu_core.aam.training_data import load_training_data
from splavu_core.extract.sampling import ClipSampling
from splavu_core.extract.shards import decode_video
from splavu_core.ingest.datasets import dataset_manifest, registered
from splavu_core.ingest.video import DecordVideo
from splavu_core.store.feature_store import FeatureStore

MODES = ("clips", "videos", "static")  # how a pixel-level loader gets each read: one clip, a whole video, one frame
PAPER = {"cached_min": 5.4, "encoder_in_loop_min": 185.0, "ratio": round(185.0 / 5.4, 1)}


# ---------------------------------------------------------------- which clips one epoch reads, observed

def static_videos(store: FeatureStore, datasets: list[str], K: int) -> list[tuple[str, str, list[int]]]:
    """(dataset, video_id, frame indices of its K static clips), in the row order of TrainingData.static
    (load_training_data concatenates the static latents of the datasets' shards in this order)."""
    regs = registered(store)
    out = []
    for d in datasets:
        for shard in regs[d]["shards"]:
            t = pq.read_table(store.shard_dir(shard) / "static.parquet").to_pydict()
            frames: dict[str, list] = {}
            for vid, k, f in zip(t["video_id"], t["k"], t["frame_index"]):
                frames.setdefault(vid, []).append((k, f))
            out += [(d, vid, [f for _, f in sorted(kf)][:K]) for vid, kf in frames.items()]
    return out


def sources(data) -> dict[str, list]:
    return {"ar": data.ar_train, "val": data.ar_val, "tad": data.tad_train, "ad": data.ad_train}


class ReadLog:
    """The cached clips train_aam reads, observed on the library's own run instead of re-derived from its rules (a
    copy of them here drifted once): each input row of the adapter's forward passes (not the diagnostics'), matched
    by content to the clip it is; apart (fit_reads), the videos and static clips keep.fit_keep gets.
    Entries: ("clips", src, video, pos), ("videos", src, video), ("static", static video, k)."""

    def __init__(self, data):
        self.data, self.on, self.reads, self.fit_reads = data, True, [], []
        self.where = {}
        for src, videos in sources(data).items():  # first source wins: a clip read for two roles is one decode
            for i, v in enumerate(videos):
                for pos, row in enumerate(np.asarray(v.feats, np.float32)):
                    self.where.setdefault(row.tobytes(), (src, i, pos))
        for s, clips in enumerate(np.asarray(data.static, np.float32)):
            for k, row in enumerate(clips):
                self.where.setdefault(row.tobytes(), ("static", s, k))
        for s, clips in enumerate(data.static_actions or []):  # a static video's moving clips (privacy pairs)
            for pos, row in enumerate(np.asarray(clips, np.float32)):
                self.where.setdefault(row.tobytes(), ("moving", s, pos))

    def forward_input(self, h):
        x = h.detach().float().numpy()
        if x.ndim == 3:  # (B, T, D) padded videos: each one whole
            for rows in x:
                src, i, _ = self.where[rows[0].tobytes()]
                self.reads.append(("videos", src, i))
            return
        hits = [self.where[r.tobytes()] for r in x]
        src, i, _ = hits[0]
        if src in sources(self.data) and len(hits) > 1 and all(h_[:2] == (src, i) for h_ in hits) \
                and [h_[2] for h_ in hits] == list(range(len(sources(self.data)[src][i].feats))):
            self.reads.append(("videos", src, i))  # one video's clips in order
            return
        self.reads += [("static", s, k) if src_ == "static" else ("clips", src_, s, k) for src_, s, k in hits]

    def keep_fit_input(self, task_videos, static):
        ids = {v.video_id: (src, i) for src, vs in sources(self.data).items() if src != "val" for i, v in enumerate(vs)}
        self.fit_reads += [("videos", *ids[v.video_id]) for vs in task_videos.values() for v in vs]
        self.fit_reads += [("static", s, k) for s in range(static.shape[0]) for k in range(static.shape[1])]

    def clips(self, entry) -> int:
        return len(sources(self.data)[entry[1]][entry[2]].feats) if entry[0] == "videos" else 1


@contextlib.contextmanager
def observed(reads: ReadLog):
    """train_aam with its adapter, diagnostics and keep fit wrapped to log what they read; nothing else changes. The
    diagnostics run in train_aam (the raw latents, the fitted adapter) and in the paper loop (during its epochs)."""
    from splavu_core.aam import keep as keep_mod
    from splavu_core.aam import paper_loop

    class Adapter(lib.AnonymizingAdapter):
        def forward(self, h, mask=None):
            if reads.on:
                reads.forward_input(h)
            return super().forward(h, mask)

    def diagnose(*a, **kw):
        reads.on = False
        try:
            return real["diagnose_adapter"](*a, **kw)
        finally:
            reads.on = True

    def fit_keep(task_videos, static, *a, **kw):
        reads.keep_fit_input(task_videos, static)
        return real["fit_keep"](task_videos, static, *a, **kw)

    real = {"AnonymizingAdapter": lib.AnonymizingAdapter, "diagnose_adapter": lib.diagnose_adapter,
            "fit_keep": keep_mod.fit_keep}
    lib.AnonymizingAdapter, keep_mod.fit_keep = Adapter, fit_keep
    lib.diagnose_adapter = paper_loop.diagnose_adapter = diagnose
    try:
        yield reads
    finally:
        lib.AnonymizingAdapter, keep_mod.fit_keep = real["AnonymizingAdapter"], real["fit_keep"]
        lib.diagnose_adapter = paper_loop.diagnose_adapter = real["diagnose_adapter"]


@contextlib.contextmanager
def timed_fits():
    """Seconds of train_aam's closed-form fits (keep, projection): a closed-form adapter's whole work, which its
    summary's loop seconds do not include."""
    seconds, real = {}, {"keep": lib.fit_keep_into, "projection": lib.fit_projection_into}

    def timer(name):
        def run(*a, **kw):
            t = time.perf_counter()
            try:
                return real[name](*a, **kw)
            finally:
                seconds[name] = time.perf_counter() - t
        return run

    lib.fit_keep_into, lib.fit_projection_into = timer("keep"), timer("projection")
    try:
        yield seconds
    finally:
        lib.fit_keep_into, lib.fit_projection_into = real["keep"], real["projection"]


def epoch_reads(data, cfg: TrainConfig) -> ReadLog:
    """What one epoch of training reads (the fit, for a closed-form adapter): one observed run of train_aam, with
    epochs 1, no head pre-training (it reads no adapter output) and short diagnostics (excluded anyway)."""
    with observed(ReadLog(data)) as reads:
        _, _, summary = train_aam(data, cfg.replace(epochs=1, pretrain_head_epochs=0, diagnose_steps=1), log=None)
    if not summary["history"]:  # closed form: the fit is the one pass (a trained adapter fits its keep stage once)
        reads.reads = reads.fit_reads
    if not reads.reads:
        raise SystemExit("train_aam read nothing this benchmark observes (a closed-form adapter without a keep stage?)")
    return reads


def subset_of(reads: ReadLog, budget: int) -> tuple[dict, dict, dict]:
    """The first reads of each mode, about budget * (mode's share of the epoch's clips) clips each (whole videos:
    distinct ones, in order). Returns the subset, its clip counts and the epoch's, per mode."""
    counts = {m: sum(reads.clips(e) for e in reads.reads if e[0] == m) for m in MODES}
    total = sum(counts.values())
    sub, n_sub = {m: [] for m in MODES}, dict.fromkeys(MODES, 0)
    for e in dict.fromkeys(reads.reads):
        want = max(1, round(budget * counts[e[0]] / total))
        if e[0] != "static" and n_sub[e[0]] < want:
            sub[e[0]].append(e)
            n_sub[e[0]] += reads.clips(e)
    if counts["static"]:  # two static clips of each of the first videos read (>= 2: the subset's step pairs them)
        want = max(2, math.ceil(budget * counts["static"] / total / 2))
        first = list(dict.fromkeys(e[1] for e in reads.reads if e[0] == "static"))[:want]
        sub["static"] = [("static", s, k) for s in first for k in (0, 1)]
        n_sub["static"] = len(sub["static"])
    return sub, n_sub, counts


# ---------------------------------------------------------------- decode + encode

class Videos:
    """Manifest rows and dataset folders of the registered datasets (paths to decode)."""

    def __init__(self, store: FeatureStore, datasets):
        self.m = {d: dataset_manifest(store, d) for d in datasets}
        self.rows = {d: {r["video_id"]: r for r in m.rows} for d, m in self.m.items()}

    def row(self, dataset, video_id):
        return self.rows[dataset][video_id]

    def path(self, dataset, video_id) -> Path:
        return self.m[dataset].root / self.row(dataset, video_id)["path"]


def decode_one_clip(path: Path, pos: int, sampling: ClipSampling) -> np.ndarray:
    """(T, H, W, 3): only the frames of clip `pos` (a pixel-level AR loader decodes one sampled clip)."""
    v = DecordVideo(path)
    return v.frames(sampling.clips(v.info.n_frames, v.info.fps)[pos].frames)


def decode_mode(mode: str, entries, data, videos: Videos, sampling: ClipSampling, static_vids) -> list[np.ndarray]:
    """Decoded clips (T, H, W, 3) uint8 of one mode's subset, in entry order."""
    out, src = [], sources(data)
    for e in entries:
        if mode == "clips":
            if e[1] == "moving":
                d, vid, _ = static_vids[e[2]]
            else:
                d, vid = src[e[1]][e[2]].meta["dataset"], src[e[1]][e[2]].video_id
            out.append(decode_one_clip(videos.path(d, vid), e[3], sampling))
        elif mode == "static":  # one frame, repeated clip_len times
            d, vid, frames = static_vids[e[1]]
            f = DecordVideo(videos.path(d, vid)).frames([frames[e[2]]])
            out.append(np.repeat(f[0][None], sampling.clip_len, 0))
        else:  # the whole video's clip sequence, decoded as extraction does
            v = src[e[1]][e[2]]
            d = videos.m[v.meta["dataset"]]
            dv = decode_video(videos.row(v.meta["dataset"], v.video_id), d.root, sampling, want_static=False)
            assert dv.error is None, dv.error
            assert len(dv.clip_frames) == len(v.feats), \
                f"{v.video_id}: {len(dv.clip_frames)} clips decoded, {len(v.feats)} cached"
            out += list(dv.clip_frames)
    return out


def encode(enc, clips: list[np.ndarray], batch: int) -> np.ndarray:
    return np.concatenate([enc.embed(np.stack(clips[i:i + batch])) for i in range(0, len(clips), batch)])


# ---------------------------------------------------------------- the adapter step on freshly encoded features

def adapter_step(data, cfg: TrainConfig, sub: dict, feats: dict, static_vids) -> float:
    """train_aam itself (the library's fit, and one epoch of a trained adapter) on the subset's freshly encoded
    features: each sampled clip a one-clip video of its source, each whole video with its new clips, the static
    clips paired."""
    src, parts = sources(data), {k: [] for k in ("ar", "val", "tad", "ad")}
    at = 0
    for e in sub["videos"]:
        v = src[e[1]][e[2]]
        parts[e[1]].append(dataclasses.replace(v, feats=feats["videos"][at:at + len(v.feats)]))
        at += len(v.feats)
    for j, e in enumerate(sub["clips"]):
        if e[1] == "moving":  # a privacy pair's moving clip: not training data of the subset
            continue
        v, pos = src[e[1]][e[2]], e[3]
        parts[e[1]].append(dataclasses.replace(v, feats=feats["clips"][j:j + 1], clip_start_s=v.clip_start_s[pos:pos + 1],
                                               clip_end_s=v.clip_end_s[pos:pos + 1]))
    static = feats["static"].reshape(-1, 2, data.dim) if sub["static"] else np.zeros((0, 2, data.dim), np.float32)
    sub_data = dataclasses.replace(
        data, ar_train=parts["ar"], ar_val=parts["val"], tad_train=parts["tad"], ad_train=parts["ad"], static=static,
        static_ids=[static_vids[e[1]][1] for e in sub["static"][::2]], static_actions=None, attributes=None)
    # the tasks the subset can train (a few sampled AD videos may hold one label only)
    usable = {"ar": len({v.meta["action"] for v in sub_data.ar_train}) >= 2,
              "tad": any(v.meta.get("segments") for v in sub_data.tad_train),
              "ad": {v.meta.get("anomaly") for v in sub_data.ad_train} >= {0, 1}}
    tasks = tuple(t for t in cfg.tasks if usable[t])
    step_cfg = cfg.replace(tasks=tasks, epochs=1, pretrain_head_epochs=1, heldout_fraction=0.0,
                           selection="val_ar" if "ar" in tasks and sub_data.ar_val else "last")
    t = time.perf_counter()
    train_aam(sub_data, step_cfg, log=None)
    return time.perf_counter() - t


# ---------------------------------------------------------------- main

def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--store", required=True, help="a store with the latents of the registered datasets ar/tad/ad")
    ap.add_argument("--epochs", type=int, default=60, help="cached training epochs (`make demo` trains 60)")
    ap.add_argument("--batch", type=int, default=LoopConfig.batch, help="clips per step (LoopConfig.batch)")
    ap.add_argument("--clips", type=int, default=256, help="clips decoded + encoded for the encoder-in-the-loop estimate")
    ap.add_argument("--checkpoint", help="encoder checkpoint (default: the store's provenance encoder_source)")
    ap.add_argument("--encoder-batch", type=int, default=16, help="clips per encoder call (extraction's default)")
    ap.add_argument("--device", default="auto", help="encoder device (the AAM always trains on the CPU)")
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--config", default="{}", help='other TrainConfig fields by flat name as JSON, e.g. '
                    '\'{"adapter": {"keep": 14, "layers": 1}, "lr": 3e-3}\' (a trained block on the keep stage)')
    ap.add_argument("--verbose", action="store_true", help="training log on stderr")
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    store = FeatureStore(args.store)
    prov = store.provenance()
    cfg = TrainConfig.from_flat({"epochs": args.epochs, "batch": args.batch, "seed": args.seed, **json.loads(args.config)})
    log = (lambda s: print(s, file=sys.stderr)) if args.verbose else None

    # (a) cached latents, end to end (the encoder is not loaded yet)
    t0 = time.perf_counter()
    data = load_training_data(store)
    load_s = time.perf_counter() - t0
    t = time.perf_counter()
    with timed_fits() as fit_s:
        _, _, summary = train_aam(data, cfg, log=log)
    train_s = time.perf_counter() - t
    closed_form = not summary["history"]
    loop_s = summary["seconds"]  # the epoch loop only (after the fits and the TAD / AD head pre-training)
    cached_epoch_s = sum(fit_s.values()) if closed_form else loop_s / cfg.loop.epochs  # closed form: the fit is its pass
    reads = epoch_reads(data, cfg)

    # (b) encoder in the loop, on a subset, extrapolated per kind of clip
    checkpoint = args.checkpoint or prov["encoder_source"]
    from splavu_core.extract.encoders.vfm import load_encoder

    enc = load_encoder(checkpoint, device=args.device)
    sampling = ClipSampling(**prov["sampling"])
    fp_ok = enc.fingerprint(sampling) == store.encoder_fingerprint()
    if not fp_ok:
        print(f"warning: encoder {checkpoint} has fingerprint {enc.fingerprint(sampling)}, the store's latents come from "
              f"{store.encoder_fingerprint()}: timings stand, features differ", file=sys.stderr)
    datasets = sorted({v.meta["dataset"] for v in data.ar_train + data.ar_val + data.tad_train + data.ad_train})
    static_vids = static_videos(store, [d for d in dict.fromkeys(("ar", "tad", "ad")) if d in registered(store)],
                                data.static.shape[1])
    assert len(static_vids) == len(data.static), f"{len(static_vids)} static videos indexed, {len(data.static)} loaded"
    videos = Videos(store, sorted(set(datasets) | {d for d, _, _ in static_vids}))
    sub, n_sub, counts = subset_of(reads, args.clips)

    mode = next(m for m in MODES if sub[m])
    enc.embed(np.stack(decode_mode(mode, sub[mode][:1], data, videos, sampling, static_vids)[:1]))  # warm-up: allocates
    per_kind, feats = {}, {}
    for kind in MODES:
        if not n_sub[kind]:
            continue
        t = time.perf_counter()
        clips = decode_mode(kind, sub[kind], data, videos, sampling, static_vids)
        dec = time.perf_counter() - t
        t = time.perf_counter()
        feats[kind] = encode(enc, clips, args.encoder_batch)
        encs = time.perf_counter() - t
        assert len(feats[kind]) == n_sub[kind]
        scale = counts[kind] / n_sub[kind]
        per_kind[kind] = {"epoch_clips": counts[kind], "timed_clips": n_sub[kind], "decode_s": round(dec, 3),
                          "encode_s": round(encs, 3), "ms_per_clip": round(1e3 * (dec + encs) / n_sub[kind], 2),
                          "epoch_decode_s": dec * scale, "epoch_encode_s": encs * scale}
        del clips
    step_s = adapter_step(data, cfg, sub, feats, static_vids)
    dec_epoch = sum(k["epoch_decode_s"] for k in per_kind.values())
    enc_epoch = sum(k["epoch_encode_s"] for k in per_kind.values())
    for k in per_kind.values():
        k["epoch_decode_s"], k["epoch_encode_s"] = round(k["epoch_decode_s"], 2), round(k["epoch_encode_s"], 2)
    loop_epoch_s = dec_epoch + enc_epoch + cached_epoch_s
    overlapped_s = max(dec_epoch, enc_epoch) + cached_epoch_s

    by_source = {}
    for e in reads.reads:
        src = "static" if e[0] == "static" else e[1]
        by_source[src] = by_source.get(src, 0) + reads.clips(e)
    result = {
        "benchmark": "train_aam", "store": str(store.root), "encoder": checkpoint, "family": enc.family, "dim": data.dim,
        "encoder_fingerprint_matches_store": fp_ok, "encoder_device": str(enc.device),
        "autocast": str(enc.autocast_dtype), "torch_threads": torch.get_num_threads(), "cpu_count": os.cpu_count(),
        "machine": platform.machine(),
        "data": {"ar_train_videos": len(data.ar_train), "ar_train_clips": int(sum(len(v.feats) for v in data.ar_train)),
                 "ar_val_videos": len(data.ar_val), "tad_train_videos": len(data.tad_train),
                 "ad_train_videos": len(data.ad_train), "static_videos": int(data.static.shape[0]),
                 "static_per_video": int(data.static.shape[1]), "classes": len(data.classes)},
        # the default (keep) adapter is closed form: no epoch loop; its "epoch" is the fit's one pass over what it reads
        "adapter_is_closed_form": closed_form,
        "train_config": {"epochs": cfg.loop.epochs, "batch": cfg.loop.batch, "tasks": list(cfg.tasks),
                         "pretrain_head_epochs": cfg.loop.pretrain_head_epochs, "adapter": cfg.adapter},
        "cached": {"seconds_end_to_end": round(load_s + train_s, 2), "load_latents_s": round(load_s, 2),
                   "train_aam_s": round(train_s, 2), "fits_s": round(sum(fit_s.values()), 4),
                   "outside_loop_s": round(train_s - loop_s, 2),  # fits, head pre-training, diagnostics
                   "epoch_loop_s": round(loop_s, 2), "epochs_run": len(summary["history"]),
                   "seconds_per_epoch": round(cached_epoch_s, 4), "selected_epoch": summary["selected_epoch"],
                   "final_val_ar_top1": summary["final"].get("val_ar_top1")},
        "encoder_in_loop": {
            "clips_per_epoch": {**counts, "total": sum(counts.values())},
            "clips_per_epoch_by_source": by_source,
            "extrapolated_from_clips": sum(n_sub.values()), "per_kind": per_kind,
            "epoch_decode_s": round(dec_epoch, 2), "epoch_encode_s": round(enc_epoch, 2),
            "adapter_steps_s": round(cached_epoch_s, 4), "subset_adapter_step_s": round(step_s, 4),
            "seconds_per_epoch": round(loop_epoch_s, 2),
            "seconds_per_epoch_if_decode_fully_overlapped": round(overlapped_s, 2),
            "seconds_for_all_epochs": round(loop_epoch_s * (1 if closed_form else cfg.loop.epochs), 1),
        },
        "ratio_encoder_in_loop_vs_cached_epoch": round(loop_epoch_s / cached_epoch_s, 1),
        "ratio_if_decode_fully_overlapped": round(overlapped_s / cached_epoch_s, 1),
        "paper": PAPER,
    }
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
