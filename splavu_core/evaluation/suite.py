"""Feature sets, metric rows and the report built from them (the protocols are protocols.py, the scoring with
intervals scoring.py, the gates ../gates.py: one evaluation stack).

A *feature set* is the raw latents ("raw"), the published anonymized table of an AAM version ("splavu"), a pixel
baseline's store, a trivial projection (trivial.py) or an ablation variant anonymized in memory. Its metric rows
{feature_set, aam_version, task, metric, value, sd, ci_low, ci_high, chance, n_seeds, split, created_at} are merged
by `write_metric_rows` into <root>/metrics/<feature_set>-<aam_version or "raw">.parquet (the catalog's `metrics`
view). `build_report` turns rows into the privacy-utility report:

Report JSON: {"encoder_fingerprint": str, "aam_version": str,
              "rows": [{"name", <REPORT_KEYS>..., "intervals", "changes", "derived_intervals", "attackers"}],
              "costs": splavu_core.store.costs.compare(...)   (privacy_utility_report only)}
Non-raw rows add "leakage_removed" / "clip_leakage_removed" / "linkage_removed" (the strongest attacker's share of
above-chance leakage removed) and "relative_change" = {key: (anon - raw) / raw}. A metric of a skipped task is null.

No dagster here.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import re
from collections.abc import Mapping, Sequence
from datetime import datetime, timezone
from pathlib import Path

import numpy as np
import pyarrow as pa

from splavu_core.serve.catalog import METRICS_SCHEMA
from splavu_core.store.feature_store import FeatureStore
from splavu_core.tasks.features import VideoFeatures

# task -> dataset that supplies it (the synthetic benchmark's names; override with datasets=).
# clip_privacy: the same attack on the action clips the product publishes (train actors -> test actors)
DEFAULT_DATASETS: dict[str, str] = {"ar": "ar", "tad": "tad", "ad": "ad", "privacy": "privacy",
                                    "clip_privacy": "ar", "reid": "ar", "bias_f": "bias_f", "bias_m": "bias_m",
                                    "gait": "gait"}
TASKS = tuple(DEFAULT_DATASETS)
# report key -> (task, metric)
REPORT_METRICS: dict[str, tuple[str, str]] = {
    "privacy_cmap": ("privacy", "cmap"), "privacy_f1": ("privacy", "f1"),
    "privacy_chance_cmap": ("privacy", "chance_cmap"), "clip_privacy_cmap": ("clip_privacy", "cmap"),
    "clip_privacy_chance_cmap": ("clip_privacy", "chance_cmap"), "ar_top1": ("ar", "top1"), "tad_map": ("tad", "mAP"),
    "ad_auc": ("ad", "auc"), "bias_f_gap": ("bias_f", "shortcut_gap"), "bias_m_gap": ("bias_m", "shortcut_gap"),
    "gait_top1": ("gait", "top1"), "reid_rank1": ("reid", "rank1"), "reid_map": ("reid", "map")}
REPORT_KEYS = ("name",) + tuple(REPORT_METRICS)
DERIVED_KEYS = ("leakage_removed", "clip_leakage_removed", "linkage_removed", "relative_change")  # non-raw rows
RELATIVE_KEYS = tuple(k for k in REPORT_METRICS if not k.endswith("chance_cmap"))
PRIVACY_TASKS = {"privacy": "leakage_removed", "clip_privacy": "clip_leakage_removed"}  # task -> derived key
UTILITY_KEYS = ("ar_top1", "tad_map", "ad_auc")
RAW = "raw"


def _now() -> datetime:
    return datetime.now(timezone.utc)


# ---------------------------------------------------------------- derived rows: leakage removed, relative change

def metric_value(rows: Sequence[dict], task: str, metric: str) -> float | None:
    """The value of (task, metric) in rows (the last one if repeated); None when absent or NaN."""
    vals = [r["value"] for r in rows if r["task"] == task and r["metric"] == metric]
    if not vals or vals[-1] is None or math.isnan(vals[-1]):
        return None
    return float(vals[-1])


def leakage_removed_or_none(raw_cmap, anon_cmap, chance) -> float | None:
    """(raw − anon) / (raw − chance): the share of above-chance leakage removed; None where raw is at chance."""
    if None in (raw_cmap, anon_cmap, chance) or raw_cmap <= chance:
        return None  # nothing leaks above chance in the raw features: the share is undefined
    return float((raw_cmap - anon_cmap) / (raw_cmap - chance))


def relative_change_or_none(raw, new) -> float | None:
    """(new − raw) / raw, e.g. cMAP 70.47 -> 49.92 gives −0.29; None where undefined."""
    if raw is None or new is None or raw == 0:
        return None
    return float((new - raw) / raw)


# ---------------------------------------------------------------- the metrics table

def safe_name(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.]+", "_", name)


def metrics_key(feature_set: str, aam_version: str | None) -> str:
    return f"metrics/{safe_name(feature_set)}-{safe_name(aam_version or RAW)}.parquet"


def metrics_table(rows: Sequence[dict]) -> pa.Table:
    return pa.Table.from_pylist([{k: r.get(k) for k in METRICS_SCHEMA.names} for r in rows], schema=METRICS_SCHEMA)


def write_metric_rows(store: FeatureStore, rows: Sequence[dict]) -> list[Path]:
    """Merge rows into <root>/metrics/<feature_set>-<aam_version or raw>.parquet, one file per pair.

    A task's rows replace that task's earlier rows in the file (re-evaluating is idempotent); other
    tasks' rows stay. Each file is rewritten atomically under a lock."""
    groups: dict[tuple, list[dict]] = {}
    for r in rows:
        groups.setdefault((r["feature_set"], r["aam_version"]), []).append(r)
    paths = []
    with store.lock("metrics"):
        for (feature_set, version), new in groups.items():
            key = metrics_key(feature_set, version)
            tasks = {r["task"] for r in new}
            old = metrics_table(store.files.read_parquet(key).to_pylist()).to_pylist() if store.files.isfile(key) else []
            kept = [r for r in old if r["task"] not in tasks]
            store.files.write_parquet(key, metrics_table(kept + list(new)))
            paths.append(store.loc(key))
    return paths


def read_metric_rows(store: FeatureStore, feature_set: str, aam_version: str | None) -> list[dict]:
    """The rows of one feature set (aam_version None: the raw baseline) from its metrics file ([] if none)."""
    key = metrics_key(feature_set, aam_version)
    if not store.files.isfile(key):
        return []
    return [r for r in metrics_table(store.files.read_parquet(key).to_pylist()).to_pylist()
            if r["feature_set"] == feature_set and r["aam_version"] == aam_version]


# ---------------------------------------------------------------- the report

def report_row(name: str, rows: Sequence[dict]) -> dict:
    """One report row (REPORT_KEYS) from a feature set's metric rows; null for a metric never measured.
    Rows scored with intervals (splavu_core.evaluation.scoring) add "intervals" {key: {value, sd, ci_low, ci_high,
    chance, n_seeds, signal}} and, for a non-raw set, "changes" {key: paired difference vs raw with its interval}
    plus "retention" / "leakage" intervals."""
    out = {"name": name, **{k: metric_value(rows, t, m) for k, (t, m) in REPORT_METRICS.items()}}
    iv, ch, extra = {}, {}, {}
    for k, (t, m) in REPORT_METRICS.items():
        r = _stat_row(rows, t, m)
        if r is not None:
            iv[k] = {**r, "signal": _signal(r, k)}
        d = _stat_row(rows, t, f"delta_{m}")
        if d is not None:
            ch[k] = {**d, "real": d["ci_low"] > 0 or d["ci_high"] < 0}
    for key, (t, m) in {"ar_retention": ("ar", "retention_top1"), "tad_retention": ("tad", "retention_mAP"),
                        "ad_retention": ("ad", "retention_auc"), "leakage_removed": ("privacy", "leakage_removed"),
                        "clip_leakage_removed": ("clip_privacy", "leakage_removed"),
                        "linkage_removed": ("reid", "linkage_removed")}.items():
        r = _stat_row(rows, t, m)
        if r is not None:
            extra[key] = r
    att = attacker_stats(rows)
    if att:
        out["attackers"] = att
    rd = reader_stats(rows)
    if rd:
        out["readers"] = rd
    at = attribute_stats(rows)
    if at:
        out["attributes"] = at
    if iv:
        out["intervals"] = iv
    if ch:
        out["changes"] = ch
    if extra:
        out["derived_intervals"] = extra
    return out


STAT_KEYS = ("value", "sd", "ci_low", "ci_high", "chance", "n_seeds")
ATTACKED = {"privacy": ("cmap", "leakage_removed"), "clip_privacy": ("cmap", "leakage_removed"),
            "reid": ("rank1", "linkage_removed")}


ATTRIBUTED = {"privacy": ("ap", "removed_ap"), "clip_privacy": ("ap", "removed_ap")}
READ = {"ar": ("top1", "retention_top1"), "tad": ("mAP", "retention_mAP"), "ad": ("auc", "retention_auc")}


def _bracketed(rows: Sequence[dict], tasks: Mapping[str, tuple[str, str]], second: str) -> dict:
    """task -> member -> {"score": stat of '<score>[member]', second: stat of '<other>[member]'}."""
    out: dict = {}
    for task, (score, other) in tasks.items():
        for r in rows:
            m = r["metric"]
            for key, prefix in (("score", score), (second, other)):
                if r["task"] == task and m.startswith(prefix + "[") and r.get("ci_low") is not None:
                    name = m[len(prefix) + 1:-1]
                    out.setdefault(task, {}).setdefault(name, {})[key] = {k: r.get(k) for k in STAT_KEYS}
    return out


def attacker_stats(rows: Sequence[dict]) -> dict:
    """task -> attacker -> {"score": its cMAP / rank-1 stat, "removed": its leakage (linkage) removed stat} from
    the per-attacker rows (metric 'cmap[mlp]', 'leakage_removed[mlp]', ...)."""
    return _bracketed(rows, ATTACKED, "removed")


def attribute_stats(rows: Sequence[dict]) -> dict:
    """task -> attribute -> {"score": the strongest attacker's AP on it, "removed": the share of raw's above-chance
    AP on it removed} from the per-attribute rows (metric 'ap[skin_dark]', 'removed_ap[skin_dark]', ...)."""
    return _bracketed(rows, ATTRIBUTED, "removed")


def reader_stats(rows: Sequence[dict]) -> dict:
    """task -> utility reader -> {"score": its top-1 / mAP / AUC stat, "retained": its retention stat} from the
    per-reader rows (metric 'top1[mlp]', 'retention_top1[mlp]', ...)."""
    return _bracketed(rows, READ, "retained")


def _stat_row(rows: Sequence[dict], task: str, metric: str) -> dict | None:
    hits = [r for r in rows if r["task"] == task and r["metric"] == metric and r.get("ci_low") is not None]
    return {k: hits[-1].get(k) for k in STAT_KEYS} if hits else None


def _signal(stat: dict, key: str) -> bool | None:
    """Is the metric beyond chance by more than its interval? None where no chance is defined (e.g. a gap)."""
    if key.endswith("_gap"):  # a bias gap shows bias only when its interval leaves 0 (the favoured group ahead)
        return stat["ci_low"] > 0
    if stat.get("chance") is None:
        return None
    return stat["ci_low"] > stat["chance"]


def add_derived(raw_row: dict, row: dict) -> dict:
    """`row` plus leakage_removed and relative_change against raw_row."""
    removed = {key: leakage_removed_or_none(raw_row.get(f"{task}_cmap"), row.get(f"{task}_cmap"),
                                            raw_row.get(f"{task}_chance_cmap"))
               for task, key in PRIVACY_TASKS.items()}
    di = row.get("derived_intervals") or {}
    removed = {k: (di[k]["value"] if k in di else v) for k, v in removed.items()}
    removed["linkage_removed"] = di["linkage_removed"]["value"] if "linkage_removed" in di else None
    return {**row, **removed,
            "relative_change": {k: relative_change_or_none(raw_row.get(k), row.get(k)) for k in RELATIVE_KEYS}}


def variant_rows(raw_rows: Sequence[dict], variants: Mapping[str, Sequence[dict]]) -> list[dict]:
    """Report rows: raw first, then one per variant (name -> its metric rows) with the derived keys."""
    raw = report_row(RAW, raw_rows)
    return [raw] + [add_derived(raw, report_row(name, rows)) for name, rows in variants.items()]


def build_report(encoder_fingerprint: str | None, aam_version: str | None, raw_rows: Sequence[dict],
                 variants: Mapping[str, Sequence[dict]]) -> dict:
    return {"encoder_fingerprint": str(encoder_fingerprint or ""), "aam_version": str(aam_version or ""),
            "rows": variant_rows(raw_rows, variants)}


def utility_retention(raw_row: dict, row: dict, keys: Sequence[str] = UTILITY_KEYS) -> dict[str, float | None]:
    """anon / raw per utility metric (None where either is missing or raw is 0)."""
    out = {}
    for k in keys:
        r, a = raw_row.get(k), row.get(k)
        out[k] = None if r in (None, 0) or a is None else float(a / r)
    return out


def mean_utility_retention(raw_row: dict, row: dict, keys: Sequence[str] = UTILITY_KEYS) -> float | None:
    vals = [v for v in utility_retention(raw_row, row, keys).values() if v is not None]
    return float(np.mean(vals)) if vals else None


# ---------------------------------------------------------------- loading a store's feature sets

def task_datasets(which: Sequence[str], datasets: Mapping[str, str] | None = None) -> dict[str, str]:
    datasets = {**DEFAULT_DATASETS, **(datasets or {})}
    return {t: datasets[t] for t in which}


def raw_shards(store: FeatureStore, dataset: str) -> list[str]:
    from splavu_core.ingest.datasets import dataset_of

    return [s for s in store.committed_shards() if dataset_of(s) == dataset]


def load_feature_sets(store: FeatureStore, which: Sequence[str], source: str, version: str | None = None,
                      datasets: Mapping[str, str] | None = None) -> dict[str, list[VideoFeatures]]:
    """dataset -> videos for the tasks `which`, from raw latents or the anonymized tables of `version`.

    A dataset with no committed raw shards is left out (its tasks get skipped). For source='anonymized'
    every committed raw shard of the dataset must have a table of `version`: a partial table would
    silently score a subset, so it raises instead."""
    from splavu_core.publish.anonymized_tables import load_video_features, published_shards
    from splavu_core.store.ledger import PublishError

    out = {}
    for ds in dict.fromkeys(task_datasets(which, datasets).values()):
        shards = raw_shards(store, ds)
        if not shards:
            continue
        if source == "anonymized":
            missing = sorted(set(shards) - published_shards(store, version))
            if missing:
                raise PublishError(f"AAM version {version} has no anonymized tables for shard(s) {missing} of "
                                   f"dataset {ds!r}: materialise anonymized_features for them first")
        out[ds] = load_video_features(store, source=source, version=version, shards=shards)
    return out


# ---------------------------------------------------------------- anonymizing in memory

def anonymize_videos(adapter, videos: Sequence[VideoFeatures]) -> list[VideoFeatures]:
    """f_A applied to each video's clips in memory: the same rows `anonymize_shard` would publish (same
    batching code), each video a new VideoFeatures with the same labels."""
    from splavu_core.publish.anonymized_tables import run_adapter

    videos = list(videos)
    if not videos:
        return []
    adapter.eval()
    clips = np.ascontiguousarray(np.concatenate([v.feats for v in videos]), np.float32)
    vids = np.concatenate([[i] * len(v.feats) for i, v in enumerate(videos)]).astype(str)
    clip_index = np.concatenate([np.arange(len(v.feats)) for v in videos])
    feats = run_adapter(adapter, adapter.cfg, clips, vids, clip_index)
    bounds = np.cumsum([0] + [len(v.feats) for v in videos])
    return [dataclasses.replace(v, feats=np.ascontiguousarray(feats[a:b]), meta=dict(v.meta))
            for v, a, b in zip(videos, bounds[:-1], bounds[1:])]


# ---------------------------------------------------------------- the privacy budget measurement

def shard_hashes(store: FeatureStore, shards: Sequence[str]) -> list:
    return [(s, (store.committed(s) or {}).get("manifest_hash")) for s in shards]


def config_key(obj) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()[:16]
