"""AAM training from cached latents vs. one epoch with the encoder in the loop (prints JSON).

    python benchmarks/train_aam.py --store STORE [--epochs 60] [--clips 256]

STORE must already hold the latents of the registered datasets ar / tad / ad (committed shards,
static latents of the training videos), as `make demo` leaves them.

(a) cached: wall time of load_training_data(store) + train_aam(data, TrainConfig(epochs=N)) (the
    other TrainConfig fields are the defaults `make demo` trains with), the epoch loop's seconds
    per epoch (it includes the per-epoch validation), and the optimiser steps.
(b) encoder in the loop: one epoch of the same training as a pixel-level method must run it:
    every clip a step consumes is decoded from its video (decord) and encoded by the frozen
    encoder (the store's provenance `encoder_source`; --checkpoint overrides) before the same
    adapter step. One epoch's clips are drawn with train_aam's own rules (seeded):
      ar      steps x batch AR training clips (LC + AR loss; drawn with replacement, as train_aam does)
      static  steps x 2 x min(V, batch // 4) static clips (NT-Xent pairs; one frame repeated)
      tad     every clip of the <= 16 TAD training videos each step's TAD loss takes
      ad      every clip of the <= 16 AD training videos each step's AD loss takes
      val     <= 5 clips of each AR validation video (the per-epoch model selection)
    Only --clips of them (split across the kinds in proportion) are decoded and encoded; the cost
    per clip of each kind is extrapolated linearly to the epoch's count of that kind. The adapter
    step itself costs what the cached epoch costs (same steps, same tensor shapes), so
        encoder-in-the-loop epoch = extrapolated (decode + encode) + cached epoch.
    The subset's features also go through one real adapter step (subset_adapter_step_s), to show
    the loop end to end. This is a lower bound for a pixel-level method: a frozen forward pass
    only, no augmentation, no backward pass through the encoder.
ratio = encoder-in-the-loop epoch / cached epoch (the paper reports ~34x: 185 min vs 5.4 min).
"""
from __future__ import annotations

import argparse
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

from splavu_core.aam.train import TrainConfig, load_training_data, train_aam
from splavu_core.extract import decode_video
from splavu_core.datasets import dataset_manifest, registered
from splavu_core.sampling import ClipSampling
from splavu_core.store import FeatureStore
from splavu_core.video import DecordVideo

KINDS = ("ar", "static", "tad", "ad", "val")
PAPER = {"cached_min": 5.4, "encoder_in_loop_min": 185.0, "ratio": round(185.0 / 5.4, 1)}


# ---------------------------------------------------------------- which clips one epoch consumes

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


def epoch_plan(data, cfg: TrainConfig, seed: int) -> dict:
    """The clips one epoch of train_aam consumes, drawn with its rules. Entries:
    ar/val: (video, clip position); static: (static video, k1, k2) pairs; tad/ad: video indices."""
    gen = torch.Generator().manual_seed(seed)
    ar_rows = [(i, c) for i, v in enumerate(data.ar_train) for c in range(len(v.feats))]
    V, K = data.static.shape[:2]
    steps = max(1, len(ar_rows) // cfg.batch) if ar_rows else max(1, V // max(2, cfg.batch // 4))
    plan = {k: [] for k in KINDS}
    for _ in range(steps):
        if ar_rows:
            plan["ar"] += [ar_rows[j] for j in torch.randint(len(ar_rows), (cfg.batch,), generator=gen).tolist()]
        else:  # LC on random static clips (train_aam's pool) when there is no AR data
            plan["static_lc"] = plan.get("static_lc", 0) + cfg.batch
        nv = min(V, max(2, cfg.batch // 4))
        for v in torch.randperm(V, generator=gen)[:nv].tolist():
            k = torch.randperm(K, generator=gen)[:2].tolist()
            plan["static"].append((v, k[0], k[1]))
        if "tad" in cfg.tasks:
            plan["tad"] += torch.randperm(len(data.tad_train), generator=gen)[:16].tolist()
        if "ad" in cfg.tasks:
            plan["ad"] += torch.randperm(len(data.ad_train), generator=gen)[:16].tolist()
    if "ar" in cfg.tasks:
        for i, v in enumerate(data.ar_val):
            plan["val"] += [(i, int(c)) for c in np.unique(np.linspace(0, len(v.feats) - 1, 5).round().astype(int))]
    counts = {"ar": len(plan["ar"]) + plan.pop("static_lc", 0), "static": 2 * len(plan["static"]),
              "tad": sum(len(data.tad_train[j].feats) for j in plan["tad"]),
              "ad": sum(len(data.ad_train[j].feats) for j in plan["ad"]), "val": len(plan["val"])}
    return {"steps": steps, "plan": plan, "counts": counts}


def subset_of(plan: dict, counts: dict, data, budget: int) -> tuple[dict, dict]:
    """The first entries of each kind, about budget * (kind's share of the epoch) clips each."""
    total = sum(counts.values())
    want = {k: max(1, round(budget * n / total)) if n else 0 for k, n in counts.items()}
    sub = {"ar": plan["ar"][:want["ar"]], "val": plan["val"][:want["val"]],
           "static": plan["static"][:max(2, math.ceil(want["static"] / 2))] if want["static"] else []}
    for k, videos in (("tad", data.tad_train), ("ad", data.ad_train)):
        sub[k], n = [], 0
        for j in dict.fromkeys(plan[k]):  # distinct videos, in the order the epoch uses them
            if n >= want[k]:
                break
            sub[k].append(j)
            n += len(videos[j].feats)
    n_sub = {"ar": len(sub["ar"]), "val": len(sub["val"]), "static": 2 * len(sub["static"]),
             "tad": sum(len(data.tad_train[j].feats) for j in sub["tad"]),
             "ad": sum(len(data.ad_train[j].feats) for j in sub["ad"])}
    return sub, n_sub


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


def decode_kind(kind: str, entries, data, videos: Videos, sampling: ClipSampling, static_vids) -> list[np.ndarray]:
    """Decoded clips (T, H, W, 3) uint8 of one kind's subset, in entry order."""
    out = []
    if kind in ("ar", "val"):
        src = data.ar_train if kind == "ar" else data.ar_val
        for i, pos in entries:
            v = src[i]
            out.append(decode_one_clip(videos.path(v.meta["dataset"], v.video_id), pos, sampling))
    elif kind == "static":  # the pair's two frames from one open video, each repeated clip_len times
        for s, k1, k2 in entries:
            d, vid, frames = static_vids[s]
            f = DecordVideo(videos.path(d, vid)).frames([frames[k1], frames[k2]])
            out += [np.repeat(f[0][None], sampling.clip_len, 0), np.repeat(f[1][None], sampling.clip_len, 0)]
    else:  # tad / ad: the whole video's clip sequence, decoded as extraction does
        src = data.tad_train if kind == "tad" else data.ad_train
        for j in entries:
            v = src[j]
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
    features: a copy of its step here drifted from the library once (it ignored the keep stage's width)."""
    def with_feats(src, idx, f):
        out, at = [], 0
        for j in idx:
            n = len(src[j].feats)
            out.append(dataclasses.replace(src[j], feats=f[at:at + n]))
            at += n
        return out

    def one(src, entries, f):  # each sampled clip as a one-clip video (what an AR step reads of it)
        return [dataclasses.replace(src[i], feats=f[j:j + 1], clip_start_s=src[i].clip_start_s[pos:pos + 1],
                                    clip_end_s=src[i].clip_end_s[pos:pos + 1]) for j, (i, pos) in enumerate(entries)]
    sub_data = dataclasses.replace(
        data, ar_train=one(data.ar_train, sub["ar"], feats.get("ar")), ar_val=one(data.ar_val, sub["val"], feats.get("val")),
        tad_train=with_feats(data.tad_train, sub["tad"], feats.get("tad")),
        ad_train=with_feats(data.ad_train, sub["ad"], feats.get("ad")),
        static=feats["static"].reshape(-1, 2, data.dim), static_ids=[static_vids[v][1] for v, _, _ in sub["static"]],
        static_actions=None, attributes=None)
    # the tasks the subset can train (a few sampled AD videos may hold one label only)
    usable = {"ar": len({v.meta["action"] for v in sub_data.ar_train}) >= 2,
              "tad": any(v.meta.get("segments") for v in sub_data.tad_train),
              "ad": {v.meta.get("anomaly") for v in sub_data.ad_train} >= {0, 1}}
    tasks = tuple(t for t in cfg.tasks if usable[t])
    step_cfg = dataclasses.replace(cfg, tasks=tasks, epochs=1, pretrain_head_epochs=1, heldout_fraction=0.0,
                                   selection="val_ar" if "ar" in tasks and sub_data.ar_val else "last")
    t = time.perf_counter()
    train_aam(sub_data, step_cfg, log=None)
    return time.perf_counter() - t


# ---------------------------------------------------------------- main

def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--store", required=True, help="a store with the latents of the registered datasets ar/tad/ad")
    ap.add_argument("--epochs", type=int, default=60, help="cached training epochs (`make demo` trains 60)")
    ap.add_argument("--batch", type=int, default=TrainConfig.batch, help="clips per step (TrainConfig.batch)")
    ap.add_argument("--clips", type=int, default=256, help="clips decoded + encoded for the encoder-in-the-loop estimate")
    ap.add_argument("--checkpoint", help="encoder checkpoint (default: the store's provenance encoder_source)")
    ap.add_argument("--encoder-batch", type=int, default=16, help="clips per encoder call (extraction's default)")
    ap.add_argument("--device", default="auto", help="encoder device (the AAM always trains on the CPU)")
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--verbose", action="store_true", help="training log on stderr")
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    store = FeatureStore(args.store)
    prov = store.provenance()
    cfg = TrainConfig(epochs=args.epochs, batch=args.batch, seed=args.seed)
    log = (lambda s: print(s, file=sys.stderr)) if args.verbose else None

    # (a) cached latents, end to end (the encoder is not loaded yet)
    t0 = time.perf_counter()
    data = load_training_data(store)
    load_s = time.perf_counter() - t0
    t = time.perf_counter()
    _, _, summary = train_aam(data, cfg, log=log)
    train_s = time.perf_counter() - t
    loop_s = summary["seconds"]  # the epoch loop only (after the TAD / AD head pre-training)
    cached_epoch_s = loop_s / cfg.epochs if summary["history"] else loop_s
    ep = epoch_plan(data, cfg, args.seed)
    steps, counts = ep["steps"], ep["counts"]

    # (b) encoder in the loop, on a subset, extrapolated per kind of clip
    checkpoint = args.checkpoint or prov["encoder_source"]
    from splavu_core.encoders.vfm import load_encoder

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
    sub, n_sub = subset_of(ep["plan"], counts, data, args.clips)

    first = decode_kind("static", sub["static"][:1], data, videos, sampling, static_vids)
    enc.embed(np.stack(first))  # warm-up: the first call allocates
    per_kind, feats = {}, {}
    for kind in KINDS:
        if not n_sub[kind]:
            continue
        t = time.perf_counter()
        clips = decode_kind(kind, sub[kind], data, videos, sampling, static_vids)
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

    result = {
        "benchmark": "train_aam", "store": str(store.root), "encoder": checkpoint, "family": enc.family, "dim": data.dim,
        "encoder_fingerprint_matches_store": fp_ok, "encoder_device": str(enc.device),
        "autocast": str(enc.autocast_dtype), "torch_threads": torch.get_num_threads(), "cpu_count": os.cpu_count(),
        "machine": platform.machine(),
        "data": {"ar_train_videos": len(data.ar_train), "ar_train_clips": int(sum(len(v.feats) for v in data.ar_train)),
                 "ar_val_videos": len(data.ar_val), "tad_train_videos": len(data.tad_train),
                 "ad_train_videos": len(data.ad_train), "static_videos": int(data.static.shape[0]),
                 "static_per_video": int(data.static.shape[1]), "classes": len(data.classes)},
        # the default (keep) adapter is closed form: no epoch loop, so the per-epoch figures describe trained adapters
        "adapter_is_closed_form": not summary["history"],
        "train_config": {"epochs": cfg.epochs, "batch": cfg.batch, "tasks": list(cfg.tasks),
                         "pretrain_head_epochs": cfg.pretrain_head_epochs, "adapter": cfg.adapter},
        "cached": {"seconds_end_to_end": round(load_s + train_s, 2), "load_latents_s": round(load_s, 2),
                   "train_aam_s": round(train_s, 2), "pretrain_heads_s": round(train_s - loop_s, 2),
                   "epoch_loop_s": round(loop_s, 2), "seconds_per_epoch": round(cached_epoch_s, 4),
                   "steps_per_epoch": steps, "steps": steps * cfg.epochs, "selected_epoch": summary["selected_epoch"],
                   "final_val_ar_top1": summary["final"].get("val_ar_top1")},
        "encoder_in_loop": {
            "clips_per_epoch": {**counts, "total": sum(counts.values())},
            "extrapolated_from_clips": sum(n_sub.values()), "per_kind": per_kind,
            "epoch_decode_s": round(dec_epoch, 2), "epoch_encode_s": round(enc_epoch, 2),
            "adapter_steps_s": round(cached_epoch_s, 4), "subset_adapter_step_s": round(step_s, 4),
            "seconds_per_epoch": round(loop_epoch_s, 2),
            "seconds_per_epoch_if_decode_fully_overlapped": round(overlapped_s, 2),
            "seconds_for_all_epochs": round(loop_epoch_s * cfg.epochs, 1),
        },
        "ratio_encoder_in_loop_vs_cached_epoch": round(loop_epoch_s / cached_epoch_s, 1),
        "ratio_if_decode_fully_overlapped": round(overlapped_s / cached_epoch_s, 1),
        "paper": PAPER,
    }
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
