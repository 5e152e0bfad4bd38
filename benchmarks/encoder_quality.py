"""Does an encoder behave like a real VFM on the benchmark? (prints JSON)

    python benchmarks/encoder_quality.py --data data/synth [--checkpoint DIR]

Raw features of held-out *encoded* videos must both serve actions (linear-probe AR top-1 on the
`ar` test split, softmax averaged over 5 clips) and leak private attributes (the stronger of two
fresh MLP attackers, raw and standardised inputs, on the `privacy` set), as a real VideoMAE does.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from splavu_core.encoders.vfm import DEMO_CHECKPOINT, load_encoder  # noqa: E402
from splavu_core.evaluation.probes import action_recognition, privacy_attack  # noqa: E402
from splavu_core.extract import extract_shard  # noqa: E402
from splavu_core.features import VideoFeatures  # noqa: E402
from splavu_core.manifest import load_manifest  # noqa: E402
from splavu_core.sampling import ClipSampling  # noqa: E402


def features(m, enc, sampling) -> list[VideoFeatures]:
    out = extract_shard(m.name, m.rows, m.root, enc, sampling, batch_size=32)
    assert out.quarantine.num_rows == 0, out.quarantine.to_pylist()
    idx = out.index.to_pydict()
    rows = {r["video_id"]: r for r in m.rows}
    by_video: dict[str, list[int]] = {}
    for i, vid in enumerate(idx["video_id"]):
        by_video.setdefault(vid, []).append(i)
    vids = []
    for vid, ii in by_video.items():
        ii = np.array(ii)
        vids.append(VideoFeatures(vid, rows[vid]["split"], out.clips[ii], np.array(idx["start_s"])[ii],
                                  np.array(idx["end_s"])[ii], int(idx["end_frame"][ii[-1]]), 16.0, rows[vid]))
    return vids


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", default="data/synth")
    ap.add_argument("--checkpoint", default=str(DEMO_CHECKPOINT))
    args = ap.parse_args(argv)
    torch.manual_seed(0)
    enc = load_encoder(args.checkpoint, device="auto")
    s = ClipSampling(clip_len=enc.num_frames, static_k=0)
    t0 = time.perf_counter()
    ar = features(load_manifest(Path(args.data) / "ar" / "manifest.csv"), enc, s)
    priv_m = load_manifest(Path(args.data) / "privacy" / "manifest.csv")
    priv = features(priv_m, enc, s)
    secs = time.perf_counter() - t0
    res_ar = action_recognition([v for v in ar if v.split == "train"], [v for v in ar if v.split == "test"])
    res_p = privacy_attack([v for v in priv if v.split == "train"], [v for v in priv if v.split == "test"],
                           list(priv_m.attributes))
    chance, cmap = res_p["chance_cmap"], res_p["cmap"]
    print(json.dumps({
        "benchmark": "encoder_quality", "encoder": enc.source, "fingerprint": enc.fingerprint(s),
        "ar_top1": round(res_ar["top1"], 4), "ar_chance": round(1 / len(res_ar["classes"]), 4),
        "privacy_cmap": round(cmap, 4), "privacy_chance_cmap": round(chance, 4),
        "privacy_share_of_distance_to_1": round((cmap - chance) / (1 - chance), 4),
        "privacy_branches": {"raw": round(res_p["raw"]["cmap"], 4), "standardised": round(res_p["standardised"]["cmap"], 4)},
        "targets": {"ar_top1": 0.85, "privacy_share_of_distance_to_1": 0.5},
        "extract_seconds": round(secs, 1),
    }, indent=1))


if __name__ == "__main__":
    main()
