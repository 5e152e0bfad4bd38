"""Does an encoder behave like a real VFM on the benchmark? (prints JSON)

    python benchmarks/encoder_quality.py --data data/synth [--checkpoint DIR] [--record]

Raw features of held-out *encoded* videos must both serve actions (linear-probe AR top-1 on the
`ar` test split, softmax averaged over 5 clips; also split into motion-only and hand-object interaction
classes on a v2 benchmark) and leak private attributes (the stronger of two fresh MLP attackers, raw and
standardised inputs, on the `privacy` set), as a real VideoMAE does; gait retrieval top-1 on the `gait`
set says whether identity is readable from walking alone. `--record` appends the JSON to the checkpoint's
training_log.json ("benchmark_quality"), so the shipped encoder carries its measured numbers.
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np
import torch

from splavu_core.evaluation.protocols import action_recognition, gait_retrieval, privacy_attack, top1_among
from splavu_core.evaluation.scoring import _usable_attributes
from splavu_core.extract.encoders.vfm import DEMO_CHECKPOINT, load_encoder
from splavu_core.extract.sampling import ClipSampling
from splavu_core.extract.shards import extract_shard
from splavu_core.ingest.manifest import load_manifest
from splavu_core.ingest.synth.figure import INTERACTIONS
from splavu_core.tasks.features import VideoFeatures


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
    ap.add_argument("--record", action="store_true", help="append the result to <checkpoint>/training_log.json")
    ap.add_argument("--store", help="read the raw latents of a store this encoder extracted instead of extracting")
    args = ap.parse_args(argv)
    torch.manual_seed(0)
    enc = load_encoder(args.checkpoint, device="auto")
    s = ClipSampling(clip_len=enc.num_frames, static_k=0)
    t0 = time.perf_counter()
    priv_m = load_manifest(Path(args.data) / "privacy" / "manifest.csv")
    gait_m = Path(args.data) / "gait" / "manifest.csv"
    if args.store:
        from splavu_core.publish.anonymized_tables import load_video_features
        from splavu_core.store.feature_store import FeatureStore

        store = FeatureStore(args.store)
        if store.files.read_json("store.json").get("weights_sha256") != enc.weights_hash:
            raise SystemExit(f"{args.store} was extracted by another encoder ({store.encoder_fingerprint()})")
        by = {n: load_video_features(store, "raw", datasets=[n]) for n in ("ar", "privacy", "gait")}
        ar, priv, gait = by["ar"], by["privacy"], by["gait"]
    else:
        ar = features(load_manifest(Path(args.data) / "ar" / "manifest.csv"), enc, s)
        priv = features(priv_m, enc, s)
        gait = features(load_manifest(gait_m), enc, s) if gait_m.exists() else []
    secs = time.perf_counter() - t0
    sc_ar = action_recognition([v for v in ar if v.split == "train"], [v for v in ar if v.split == "test"], seeds=[0])
    classes = sc_ar.details["classes"]
    res_ar = {"top1": sc_ar.metrics["top1"](0, None), "classes": classes,
              "pred": [classes[i] for i in sc_ar.details["pred"][0]], "true": [classes[i] for i in sc_ar.details["true"]]}
    p_train, p_test = [v for v in priv if v.split == "train"], [v for v in priv if v.split == "test"]
    res_p = privacy_attack(p_train, p_test, _usable_attributes(p_train, p_test, list(priv_m.attributes)), seeds=[0])
    chance, cmap = res_p.chance["cmap"], res_p.metrics["cmap"](0, None)
    motion = [c for c in res_ar["classes"] if c not in INTERACTIONS]
    inter = top1_among(res_ar["pred"], res_ar["true"], INTERACTIONS)
    groups = {"ar_top1_interaction": round(inter, 4),
              "ar_top1_motion": round(top1_among(res_ar["pred"], res_ar["true"], motion), 4)} if inter is not None else {}
    gait_out = {}
    if gait:
        subj = np.array([v.meta["subject_id"] for v in gait], dtype=object)
        same = np.array([(subj == x).sum() - 1 for x in subj])
        gait_out = {"gait_top1": round(gait_retrieval(gait).metrics["top1"](0, None), 4),
                    "gait_chance_top1": round(float((same / (len(gait) - 1)).mean()), 4)}
    result = {
        "benchmark": "encoder_quality", "encoder": enc.source, "fingerprint": enc.fingerprint(s),
        "data": args.data, "store": args.store, "ar_top1": round(res_ar["top1"], 4), "ar_chance": round(1 / len(res_ar["classes"]), 4),
        **groups, **gait_out,
        "privacy_cmap": round(cmap, 4), "privacy_chance_cmap": round(chance, 4),
        "privacy_share_of_distance_to_1": round((cmap - chance) / (1 - chance), 4),
        "privacy_strongest": res_p.details["strongest"],
        "privacy_attackers": {k: round(v, 4) for k, v in res_p.details["attacker_cmap"].items()},
        "targets": {"ar_top1": 0.85, "privacy_share_of_distance_to_1": 0.5},
        "extract_seconds": round(secs, 1),
    }
    print(json.dumps(result, indent=1))
    if args.record:
        log_path = Path(args.checkpoint) / "training_log.json"
        log = json.loads(log_path.read_text())
        log["benchmark_quality"] = [r for r in log.get("benchmark_quality", []) if r.get("data") != args.data] + [result]
        log_path.write_text(json.dumps(log, indent=1) + "\n")


if __name__ == "__main__":
    main()
