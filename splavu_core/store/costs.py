"""Wall time of every step that turns videos into published features, recorded as the step runs.

    <root>/costs/<feature_set>/<stage>/<key>.json   {feature_set, stage, key, seconds, videos, clips, recorded_at}

    feature_set  "raw" / "splavu" / "pixel_<name>"
    stage        extract (key: shard) | train (key: AAM version) | anonymize (key: <version>/<shard>)

    <root>/costs/demo.json   the last `splavu demo`: wall seconds per stage (DEMO_STAGES) and the datasets it left out

One small file per unit of work, written atomically, so concurrent runs never contend and a rerun
of the same unit replaces its figure. Only work actually done is recorded (a skipped shard is not).
`compare` turns the ledger into the report's cost section.
"""
from __future__ import annotations

import os
import platform
import re
import subprocess
from collections.abc import Sequence
from datetime import datetime, timezone
from pathlib import Path

from splavu_core.store.feature_store import FeatureStore
from splavu_core.store.fs import join

STAGES = ("extract", "train", "anonymize")
# `make demo` end to end: install (the Makefile's setup), synth, extract (ingest + encoder), fit (the publish rule's
# candidates scored on the selection split, then the AAM), publish (anonymize + catalog), gates (the gated shard run's
# time beyond an ungated one), evaluate
DEMO_STAGES = ("install", "synth", "extract", "fit", "publish", "gates", "evaluate")
DEMO = "costs/demo.json"


def provenance() -> dict[str, str]:
    """Where a figure came from: the code's commit ("unknown" outside a git checkout; "+dirty" with uncommitted
    changes) and the machine, since machines differ several-fold in speed."""
    def git(*args):
        return subprocess.run(["git", *args], cwd=Path(__file__).resolve().parent, capture_output=True, text=True,
                              check=True, timeout=10).stdout.strip()
    try:
        commit = git("rev-parse", "--short", "HEAD") or "unknown"
        commit += "+dirty" if git("status", "--porcelain", "--untracked-files=no") else ""
    except (OSError, subprocess.SubprocessError):
        commit = "unknown"
    machine = (f"{platform.system()} {platform.release()} {platform.machine()}, Python {platform.python_version()}, "
               f"{os.cpu_count()} CPU cores")
    return {"commit": commit, "machine": machine}


def _dir(feature_set: str, stage: str) -> str:
    assert stage in STAGES, f"unknown cost stage {stage!r}; choose from {STAGES}"
    return join("costs", feature_set, stage)


def record(store: FeatureStore, feature_set: str, stage: str, key: str, seconds: float, **counts) -> dict:
    entry = {"feature_set": feature_set, "stage": stage, "key": key, "seconds": float(seconds), **counts,
             "recorded_at": datetime.now(timezone.utc).isoformat()}
    store.files.write_json(join(_dir(feature_set, stage), f"{re.sub(r'[^A-Za-z0-9_.-]+', '_', key)}.json"), entry)
    return entry


def record_demo(store: FeatureStore, stages: dict[str, float | None], left_out: dict[str, str], **extra) -> dict:
    """The last demo's stage wall times (None: not measured, e.g. install outside `make demo`) and what it did not
    run (group -> why), for the report's cost section."""
    unknown = set(stages) - set(DEMO_STAGES)
    assert not unknown, f"unknown demo stage(s) {sorted(unknown)}; choose from {DEMO_STAGES}"
    entry = {"stages": {s: (None if stages.get(s) is None else round(float(stages[s]), 1)) for s in DEMO_STAGES},
             "left_out": dict(left_out), **extra, "recorded_at": datetime.now(timezone.utc).isoformat()}
    store.files.write_json(DEMO, entry)
    return entry


def read_demo(store: FeatureStore) -> dict | None:
    try:
        return store.files.read_json(DEMO)
    except FileNotFoundError:
        return None


def entries(store: FeatureStore, feature_set: str, stage: str) -> dict[str, dict]:
    """key -> entry of one feature set and stage."""
    d = _dir(feature_set, stage)
    if not store.files.isdir(d):
        return {}
    return {e["key"]: e for e in (store.files.read_json(k) for k in sorted(store.files.glob(d, ".json")))}


def total(have: dict[str, dict], keys: Sequence[str]) -> tuple[float | None, list[str]]:
    """Sum of seconds of the entries `have` (from `entries`) over `keys`, or None and the keys not recorded."""
    missing = [k for k in keys if k not in have]
    return (None if missing or not keys else float(sum(have[k]["seconds"] for k in keys))), missing


def _ratio(a: float | None, b: float | None) -> float | None:
    return None if a is None or not b else float(a / b)


def splavu_costs(ledger: dict[str, dict], version: str, shards: Sequence[str]) -> dict:
    """ledger: stage -> entries of the splavu path ("extract" of raw, "train", "anonymize")."""
    extract, miss_e = total(ledger["extract"], shards)
    train, miss_t = total(ledger["train"], [version])
    anon, miss_a = total(ledger["anonymize"], [f"{version}/{s}" for s in shards])
    change = None if train is None or anon is None else train + anon
    return {"shards": len(shards), "extract_seconds": extract, "train_seconds": train, "anonymize_seconds": anon,
            "produce_seconds": None if extract is None or change is None else extract + change,
            "change_seconds": change,
            "missing": [f"raw extract {k}" for k in miss_e] + [f"train {k}" for k in miss_t]
                       + [f"anonymize {k}" for k in miss_a]}


def compare(store: FeatureStore, version: str, shards: Sequence[str],
            baselines: dict[str, FeatureStore]) -> dict:
    """The cost of producing published features from videos, and of changing the anonymizer.

    splavu:  produce = extract raw + train the AAM + anonymize; change = train + anonymize (cached latents)
    pixel_x: produce = extract with the transform; change = the same again (every video re-decoded, re-encoded)
    "splavu" covers `shards`; each baseline is compared with splavu on the shards it has (its own
    "splavu_*" figures), pixel / splavu. A figure never recorded (work done before the ledger existed) is
    null and named in "missing"."""
    shards = list(shards)
    ledger = {"extract": entries(store, "raw", "extract"), "train": entries(store, "splavu", "train"),
              "anonymize": entries(store, "splavu", "anonymize")}  # read once, summed per comparison
    out = {"shards": shards, "aam_version": version, "splavu": splavu_costs(ledger, version, shards)}
    demo = read_demo(store)
    if demo:
        out["demo"] = demo
    for name, bstore in baselines.items():
        have = set(bstore.committed_shards())
        mine = [s for s in shards if s in have]
        secs, miss = total(entries(bstore, name, "extract"), mine)
        sp = splavu_costs(ledger, version, mine)
        out[name] = {"shards": len(mine), "produce_seconds": secs, "change_seconds": secs,
                     "splavu_produce_seconds": sp["produce_seconds"], "splavu_change_seconds": sp["change_seconds"],
                     "produce_ratio_vs_splavu": _ratio(secs, sp["produce_seconds"]),
                     "change_ratio_vs_splavu": _ratio(secs, sp["change_seconds"]),
                     "missing": [f"extract {k}" for k in miss] + sp["missing"]}
    return out
