"""Cost of anonymizing in latent space (splavu) vs in pixel space, measured in one run (prints JSON).

    python benchmarks/pixel_baselines.py [--data data/synth/ar] [--videos 40] [--repeats 2]

On the same videos, with the same frozen encoder, each path timed end to end into a store:
- raw:            splavu's extraction (clip latents + static latents of train videos, as the AAM needs);
- raw_clips_only: the same without static latents (what a pixel baseline extracts: the fair overhead base);
- pixel_<name>:   decode -> person mask (rendered silhouettes) -> transform -> encode -> commit;
- anonymize:      splavu_core.publish.anonymized_tables.anonymize_shard of the raw shard (Zarr read, adapter, guards, Parquet),
                  with a default-size adapter (benchmarks/publish.py make_adapter: trained-looking weights).

Ratios: change_ratio = pixel / anonymize (a change of anonymizer: re-decode and re-encode every video vs
re-anonymize cached latents; the AAM's training, once per anonymizer and independent of archive size, is
not in it: see benchmarks/train_aam.py); transform_overhead = pixel / raw_clips_only;
produce_ratio_excl_training = pixel / (raw + anonymize).
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import platform
import tempfile
import time
from pathlib import Path

import torch

from splavu_core.extract.encoders.vfm import DEMO_CHECKPOINT, load_encoder
from splavu_core.extract.pixel import BASELINES, PixelAnonymizer
from splavu_core.extract.sampling import ClipSampling
from splavu_core.extract.shards import extract_shard, manifest_hash
from splavu_core.ingest.manifest import load_manifest
from splavu_core.publish.anonymized_tables import anonymize_shard
from splavu_core.store.feature_store import FeatureStore

SHARD = "bench-000"


def make_adapter(*args, **kw) -> Path:
    """benchmarks/publish.py's trained-looking adapter, loaded from its file: benchmarks/ is not a package."""
    spec = importlib.util.spec_from_file_location("bench_publish", Path(__file__).with_name("publish.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.make_adapter(*args, **kw)


def timed_extract(root: Path, rows, data_root, enc, sampling, static_splits, pixel=None) -> tuple[float, dict]:
    prov = enc.provenance(sampling)
    if pixel is not None:
        prov = pixel.provenance(prov)
    store = FeatureStore(root)
    t0 = time.perf_counter()
    latents = extract_shard(SHARD, rows, data_root, enc, sampling, static_splits=static_splits, pixel=pixel)
    marker = store.write_shard(SHARD, latents, prov, manifest_hash(rows))
    return time.perf_counter() - t0, marker


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", help="a synthetic dataset folder with manifest.csv and masks (default: data/synth/ar, "
                                   "else the demo 'ar' set is generated)")
    ap.add_argument("--checkpoint", default=str(DEMO_CHECKPOINT))
    ap.add_argument("--videos", type=int, default=40)
    ap.add_argument("--baselines", nargs="*", default=list(BASELINES))
    ap.add_argument("--repeats", type=int, default=2, help="rounds over every path, interleaved; the fastest counts "
                                                           "(shared machines: the others are noise)")
    args = ap.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="splavu-pixel-bench-"))
    data = Path(args.data) if args.data else Path("data/synth/ar")
    if not (data / "manifest.csv").is_file():
        from splavu_core.ingest.synth.datasets import generate

        generate(work / "synth", "demo", seed=0, datasets=("ar",))
        data = work / "synth" / "ar"
    m = load_manifest(data / "manifest.csv")
    rows = m.rows[: args.videos]
    enc = load_encoder(args.checkpoint)
    sampling = ClipSampling(clip_len=enc.num_frames)
    timed_extract(work / "warmup", rows[:2], m.root, enc, sampling, ("train",))  # first-call allocations

    runs: dict[str, list[float]] = {}
    for r in range(args.repeats):  # each round: every path once, into fresh stores
        t, marker = timed_extract(work / f"raw{r}", rows, m.root, enc, sampling, ("train",))
        runs.setdefault("raw", []).append(t)
        runs.setdefault("raw_clips_only", []).append(timed_extract(work / f"clips{r}", rows, m.root, enc, sampling, ())[0])
        for name in args.baselines:
            pixel = PixelAnonymizer.named(name, "rendered")
            t, mk = timed_extract(work / f"pixel_{name}{r}", rows, m.root, enc, sampling, (), pixel)
            assert mk["clips"] == marker["clips"], f"pixel_{name}: {mk['clips']} clips, raw {marker['clips']}"
            runs.setdefault(f"pixel_{name}", []).append(t)
        raw_store = FeatureStore(work / f"raw{r}")
        adapter_dir = make_adapter(raw_store, enc.dim, seed=0, fingerprint=raw_store.encoder_fingerprint())
        runs.setdefault("anonymize", []).append(anonymize_shard(raw_store, SHARD, adapter_dir)["seconds"])
    secs = {k: min(v) for k, v in runs.items()}
    clips = {"raw": {"clips": marker["clips"], "static_videos": marker["static_videos"]}}

    n = marker["clips"]
    out = {
        "benchmark": "pixel_baselines", "videos": len(rows), "clips": n, **clips,
        "seconds": {k: round(v, 3) for k, v in secs.items()}, "repeats": args.repeats,
        "all_seconds": {k: [round(x, 3) for x in v] for k, v in runs.items()},
        "clips_per_s": {k: round(n / v, 1) for k, v in secs.items()},
        "change_ratio": {f"pixel_{b}": round(secs[f"pixel_{b}"] / secs["anonymize"], 1) for b in args.baselines},
        "transform_overhead": {f"pixel_{b}": round(secs[f"pixel_{b}"] / secs["raw_clips_only"], 3) for b in args.baselines},
        "produce_ratio_excl_training": {f"pixel_{b}": round(secs[f"pixel_{b}"] / (secs["raw"] + secs["anonymize"]), 3)
                                        for b in args.baselines},
        "encoder": args.checkpoint, "device": str(enc.device), "torch_threads": torch.get_num_threads(),
        "cpus": os.cpu_count(), "platform": platform.platform(),
    }
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
