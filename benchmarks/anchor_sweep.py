"""Anchored keep on validation (issue 29's exploration, prints JSON): each clip minus its own video's appearance
anchor (the mean of that video's static clips, one frame repeated), then the keep fit, beside plain keep of the
same width; every member scored in one pass by the attacker suite (keep_curve.score_family, probe seeds and a
bootstrap over the videos).

    python benchmarks/anchor_sweep.py --store store --k 8 14 20 [--static-cache /tmp/anchors.npz]

Appearance stays constant within a video and motion does not, so the anchor needs no label of any kind. The demo
store has static clips for training videos only, so this script encodes `--static-k` static clips (frames spread
over the video, as extraction picks them) for EVERY video with the store's encoder (checkpoint: --checkpoint, the
shipped demo encoder by default). Those are raw latents: the optional cache is for re-runs on one machine, never
for publishing. This is a measurement, not a publishable adapter: publishing anchored features needs static clips
extracted for every video and an anchor input to the adapter (not built yet).
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import time
from pathlib import Path

import numpy as np

from splavu_core.aam.keep import apply_keep
from splavu_core.aam.closed_form import fit_utility_keep
from splavu_core.evaluation import trivial
from splavu_core.evaluation.keep_curve import load_inputs, score_family
from splavu_core.extract.encoders.vfm import DEMO_CHECKPOINT, load_encoder
from splavu_core.extract.sampling import ClipSampling
from splavu_core.ingest.datasets import shard_rows
from splavu_core.ingest.video import DecordVideo
from splavu_core.store.feature_store import FeatureStore


def encode_anchors(store: FeatureStore, checkpoint: str, static_k: int, batch: int = 16) -> dict[str, np.ndarray]:
    """video_id -> (D,) mean of its static_k static clips, for every video of every committed shard."""
    enc = load_encoder(checkpoint, device="cpu")
    sampling = ClipSampling(static_k=static_k)
    sums, pending = {}, []

    def flush(force=False):
        while len(pending) >= batch or (force and pending):
            chunk, pending[:] = pending[:batch], pending[batch:]
            for (vid, _), e in zip(chunk, enc.embed_clips([f for _, f in chunk])):
                sums[vid] = sums.get(vid, 0.0) + e.astype(np.float64) / static_k

    for shard in store.committed_shards():
        manifest, rows = shard_rows(store, shard)
        for r in rows:
            v = DecordVideo(manifest.root / r["path"])
            frames = enc.preprocess.stage(v.frames(sampling.static_frames(v.info.n_frames))[:, None])  # (K, 1, ...)
            pending.extend((r["video_id"], f) for f in frames)  # one frame: a static clip
            flush()
    flush(force=True)
    return {k: v.astype(np.float32) for k, v in sums.items()}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--store", default="store")
    ap.add_argument("--checkpoint", default=str(DEMO_CHECKPOINT), help="the encoder that made the store's latents")
    ap.add_argument("--k", type=int, nargs="+", default=[8, 14, 20])
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    ap.add_argument("--static-k", type=int, default=2, help="static clips per video averaged into its anchor")
    ap.add_argument("--static-cache", help="npz of the anchors (raw-derived: keep it off shared storage)")
    ap.add_argument("--anchor-rank", type=int, nargs="+", default=[0],
                    help="anchored variants: 0 subtracts the whole anchor, m > 0 only its top-m appearance directions")
    ap.add_argument("--baselines", action="store_true",
                    help="add the trivial baselines of each width: pca_k and randproj_k on raw clips, and pca_k on "
                         "anchored clips (is the anchor alone doing the work?)")
    args = ap.parse_args()
    store = FeatureStore(args.store)
    t0 = time.perf_counter()
    cache = Path(args.static_cache) if args.static_cache else None
    if cache and cache.exists():
        z = np.load(cache)
        anchors = dict(zip(z["ids"].tolist(), z["anchors"]))
    else:
        anchors = encode_anchors(store, args.checkpoint, args.static_k)
        if cache:
            np.savez(cache, ids=np.array(list(anchors)), anchors=np.stack(list(anchors.values())))
    t_anchor = time.perf_counter() - t0
    inp = load_inputs(store)

    d = inp.data
    train_ids = [v.video_id for vs in (d.ar_train, d.tad_train, d.ad_train) for v in vs]
    a_train = np.stack([anchors[i] for i in dict.fromkeys(train_ids)]).astype(np.float64)
    a_mu = a_train.mean(0)
    _, _, a_vt = np.linalg.svd(a_train - a_mu, full_matrices=False)   # appearance directions, label-free

    def anchor_of(rank):
        """clip -> clip minus its video's anchor; rank m > 0 subtracts only the anchor's part in the top-m
        directions along which the training videos' anchors differ (appearance), keeping the rest (pose)."""
        if rank == 0:
            return lambda v: dataclasses.replace(v, feats=(v.feats - anchors[v.video_id]).astype(np.float32))
        u = a_vt[:rank].T                                              # (D, m)
        return lambda v: dataclasses.replace(
            v, feats=(v.feats - (anchors[v.video_id] - a_mu) @ u @ u.T).astype(np.float32))

    def member_name(rank):
        return "anchored" + (f"[m={rank}]" if rank else "")

    def on_data(f):
        return dataclasses.replace(d, ar_train=[f(v) for v in d.ar_train], ar_val=[f(v) for v in d.ar_val],
                                   tad_train=[f(v) for v in d.tad_train], ad_train=[f(v) for v in d.ad_train])

    variants = [(member_name(r), anchor_of(r)) for r in args.anchor_rank]
    # anchored once, used at every k
    fit_data = {label: on_data(f) for label, f in variants} | {"": d}
    scored = {label: {ds: [f(v) for v in vs] for ds, vs in inp.raw.items()} for label, f in variants} | {"": inp.raw}
    sets, members = {}, []
    for k in args.k:
        for label, f in variants + [("", None)]:
            name = f"{label} keep k={k}".strip()
            fit = fit_utility_keep(fit_data[label], inp.cfg.tasks, k, inp.cfg)
            sets[name] = {ds: [dataclasses.replace(v, feats=apply_keep(fit, v.feats)) for v in vs]
                          for ds, vs in scored[label].items()}
            members.append({"name": name, "k": k, "anchored": bool(f), "seen": list(inp.cfg.tasks)})
        if args.baselines:
            for label, f in [("", None), variants[0]]:
                raw = scored[label]
                base = trivial.baseline_sets(raw, trivial.training_clips(raw, inp.datasets), k)
                for bname, bset in base.items():
                    if f and bname.startswith("randproj"):
                        continue  # a random frame does not care what it rotates; one row of it is enough
                    name = f"{label} {bname}".strip()
                    sets[name] = bset
                    members.append({"name": name, "k": k, "anchored": bool(f), "seen": [], "trivial": True})
    score_family(store, inp, sets, members, [], split="val", seeds=args.seeds)
    for m in members:
        print(json.dumps(m), flush=True)
    print(json.dumps({"split": "val", "static_k": args.static_k, "videos_anchored": len(anchors),
                      "anchor_seconds": round(t_anchor, 1), "seconds": round(time.perf_counter() - t0, 1)}), flush=True)


if __name__ == "__main__":
    main()
