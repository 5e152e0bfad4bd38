"""The evaluation suite: every protocol of DESIGN.md section 4 on one feature set, as metric rows.

A *feature set* is the raw latents ("raw"), the published anonymized table of an AAM version ("splavu"),
or an ablation variant anonymized in memory. `evaluate_feature_set` runs the probes (each trains a fresh
head on exactly the features it scores) and returns metric rows

    {feature_set, aam_version, task, metric, value, split, created_at}

which `write_metric_rows` merges into <root>/metrics/<feature_set>-<aam_version or "raw">.parquet (the
catalog's `metrics` view). `build_report` turns rows into the privacy-utility report (JSON schema below),
`privacy_budget_measure` is what the blocking publication gate measures.

Report JSON: {"encoder_fingerprint": str, "aam_version": str,
              "rows": [{"name", "privacy_cmap", "privacy_f1", "privacy_chance_cmap", "ar_top1", "tad_map",
                        "ad_auc", "bias_f_gap", "bias_m_gap", "gait_top1"}],
              "costs": splavu_core.costs.compare(...)   (privacy_utility_report only)}
Rows are named raw, splavu, and pixel_<name> for each pixel baseline (splavu_core.pixel).
Non-raw rows add "leakage_removed" = (raw - anon) / (raw - chance) of the privacy cMAP and
"relative_change" = {key: (anon - raw) / raw}. A metric of a skipped task is null.

No dagster here.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import os
import re
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime, timezone
from pathlib import Path

import numpy as np
import pyarrow as pa

from ..catalog import METRICS_SCHEMA
from ..features import VideoFeatures, split_of
from ..ledger import (DEFAULT_PRIVACY_BUDGET, PRIVACY_BUDGET_ENV, _verdict_one,  # noqa: F401  (verdict rules
                      budget_verdict)                                             # live in the ledger now)
from ..store import FeatureStore, StoreError

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
    "ad_auc": ("ad", "auc"), "bias_f_gap": ("bias_f", "gap"), "bias_m_gap": ("bias_m", "gap"),
    "gait_top1": ("gait", "top1"), "reid_rank1": ("reid", "rank1"), "reid_map": ("reid", "map")}
REPORT_KEYS = ("name",) + tuple(REPORT_METRICS)
DERIVED_KEYS = ("leakage_removed", "clip_leakage_removed", "linkage_removed", "relative_change")  # non-raw rows
RELATIVE_KEYS = tuple(k for k in REPORT_METRICS if not k.endswith("chance_cmap"))
PRIVACY_TASKS = {"privacy": "leakage_removed", "clip_privacy": "clip_leakage_removed"}  # task -> derived key
UTILITY_KEYS = ("ar_top1", "tad_map", "ad_auc")
RAW = "raw"


class EvalResult(list):
    """The metric rows (a list), plus what was skipped and why, and each probe's full output."""

    def __init__(self, rows=(), skipped: dict[str, str] | None = None, details: dict[str, dict] | None = None):
        super().__init__(rows)
        self.skipped = skipped or {}
        self.details = details or {}


def _now() -> datetime:
    return datetime.now(timezone.utc)


def _row(feature_set, aam_version, task, metric, value, split, created_at) -> dict:
    return {"feature_set": feature_set, "aam_version": aam_version, "task": task, "metric": metric,
            "value": float(value), "split": split, "created_at": created_at}


# ---------------------------------------------------------------- the tasks

def privacy_attributes(videos: Sequence[VideoFeatures]) -> list[str]:
    """Every attr_<name> label present in the videos' meta (sorted)."""
    return sorted({k for v in videos for k, val in v.meta.items() if k.startswith("attr_") and val is not None})


def _usable_attributes(train, test, attributes) -> tuple[list[str], list[str]]:
    """Attributes with both classes in train and in test (AP is undefined otherwise)."""
    keep, dropped = [], []
    for a in attributes:
        col = a if a.startswith("attr_") else f"attr_{a}"
        ok = all(len({v.meta.get(col) for v in part} - {None}) == 2 for part in (train, test))
        (keep if ok else dropped).append(a)
    return keep, dropped


def _run_ar(videos, kw):
    from .probes import action_recognition, top1_among

    train, test = split_of(videos, "train"), split_of(videos, "test")
    if not train or not test:
        return None, f"needs train and test videos with 'action' (have {len(train)} / {len(test)})"
    r = action_recognition(train, test, **kw)
    per_class = {f"top1[{c}]": top1_among(r["pred"], r["true"], [c]) for c in sorted(set(r["true"]))}
    return {"top1": r["top1"], **per_class}, None


def _run_tad(videos, kw):
    from .probes import temporal_detection

    train, test = split_of(videos, "train"), split_of(videos, "test")
    if not train or not any(v.meta.get("segments") for v in test):
        return None, "needs train videos and test videos with 'segments'"
    classes = sorted({s[2] for v in train + test for s in (v.meta.get("segments") or [])})
    return temporal_detection(train, test, classes=classes, **kw), None


def _run_ad(videos, kw):
    from .probes import anomaly_detection

    train, test = split_of(videos, "train"), split_of(videos, "test")
    if {v.meta.get("anomaly") for v in train} != {0, 1}:
        return None, "needs train videos with both anomaly labels 0 and 1"
    if {v.meta.get("anomaly") for v in test} != {0, 1}:
        return None, "needs test videos with both anomaly labels 0 and 1 (frame AUC is undefined otherwise)"
    return anomaly_detection(train, test, **kw), None


def _run_privacy(videos, kw, attributes=None):
    """Attackers train on the `train` split and are scored on `test` (on `ar`: disjoint actors)."""
    from .probes import privacy_attack

    train, test = split_of(videos, "train"), split_of(videos, "test")
    if not train or not test:
        return None, f"needs train and test videos (have {len(train)} / {len(test)})"
    attributes, dropped = _usable_attributes(train, test, attributes or privacy_attributes(videos))
    if not attributes:
        return None, f"no attribute has both classes in train and test (dropped {dropped})"
    r = privacy_attack(train, test, attributes=attributes, **kw)
    out = {"cmap": r["cmap"], "f1": r["f1"], "chance_cmap": r["chance_cmap"],
           "cmap_raw_branch": r["raw"]["cmap"], "cmap_standardised_branch": r["standardised"]["cmap"],
           "f1_raw_branch": r["raw"]["f1"], "f1_standardised_branch": r["standardised"]["f1"],
           "n_attributes": len(attributes)}
    return out, {"attributes": attributes, "dropped_attributes": dropped, "branch": r["branch"]}


def _run_bias(videos, kw):
    from .probes import bias

    train, test = split_of(videos, "train"), split_of(videos, "test")
    groups = {v.meta.get("group") for v in test} - {None}
    if not train or len(groups) < 2:
        return None, f"needs train videos and a test split with >= 2 groups (test groups: {sorted(groups)})"
    return bias(train, test, **kw), None


def _run_gait(videos, kw):
    from .probes import gait_retrieval

    videos = [v for v in videos if v.meta.get("subject_id") is not None]
    if len(videos) < 2:
        return None, "needs >= 2 videos with 'subject_id'"
    return gait_retrieval(videos), None


def _split_label(videos, default="test") -> str:
    splits = {v.split for v in videos}
    return default if splits <= {default} else "all"


def evaluate_feature_set(videos_by_dataset: Mapping[str, Sequence[VideoFeatures]], name: str,
                         aam_version: str | None, which: Sequence[str] = TASKS,
                         datasets: Mapping[str, str] | None = None,
                         probe_kwargs: Mapping[str, dict] | None = None,
                         attributes: Sequence[str] | None = None, created_at: datetime | None = None,
                         log: Callable[[str], None] | None = None) -> EvalResult:
    """Run the protocols `which` on one feature set; returns its metric rows (an EvalResult).

    videos_by_dataset: dataset name -> videos (all splits). datasets: task -> dataset name (default
    DEFAULT_DATASETS). A task whose dataset is absent or empty, or whose data cannot support the protocol
    (e.g. a bias test split with one group), is skipped: result.skipped[task] says why.
    probe_kwargs: task -> extra kwargs of its probe ("bias" applies to bias_f and bias_m, falling back to "ar").
    Metrics: ar top1, top1[<class>] (per test class) | tad mAP, mAP@<tIoU> | ad auc | privacy cmap (stronger attacker), f1, chance_cmap,
    cmap/f1 of each branch, n_attributes | bias_* top1, acc_<group>, gap | gait top1.
    """
    datasets = {**DEFAULT_DATASETS, **(datasets or {})}
    probe_kwargs = dict(probe_kwargs or {})
    created_at = created_at or _now()
    unknown = set(which) - set(TASKS)
    assert not unknown, f"unknown task(s) {sorted(unknown)}; choose from {TASKS}"
    out = EvalResult()
    for task in which:
        ds = datasets[task]
        videos = list(videos_by_dataset.get(ds) or [])
        if not videos:
            out.skipped[task] = f"dataset {ds!r} is not in the store"
            if log:
                log(f"{name}: skipping {task}: {out.skipped[task]}")
            continue
        kw = dict(probe_kwargs.get(task) or {})
        detail = None
        if task == "ar":
            metrics, why = _run_ar(videos, kw)
        elif task == "tad":
            metrics, why = _run_tad(videos, kw)
        elif task == "ad":
            metrics, why = _run_ad(videos, kw)
        elif task in PRIVACY_TASKS:
            kw = dict(probe_kwargs.get(task) or probe_kwargs.get("privacy") or {})
            metrics, detail = _run_privacy(videos, kw, attributes if task == "privacy" else None)
            why = detail if isinstance(detail, str) else None
        elif task in ("bias_f", "bias_m"):
            metrics, why = _run_bias(videos, dict(probe_kwargs.get("bias") or probe_kwargs.get("ar") or {}))
        else:
            metrics, why = _run_gait(videos, kw)
        if metrics is None:
            out.skipped[task] = f"dataset {ds!r}: {why}"
            if log:
                log(f"{name}: skipping {task}: {out.skipped[task]}")
            continue
        split = _split_label(videos) if task == "gait" else "test"
        for metric, value in metrics.items():
            if isinstance(value, (int, float, np.floating, np.integer)):
                out.append(_row(name, aam_version, task, metric, value, split, created_at))
        out.details[task] = {"dataset": ds, **metrics, **(detail if isinstance(detail, dict) else {})}
    return out


# ---------------------------------------------------------------- derived rows: leakage removed, relative change

def metric_value(rows: Sequence[dict], task: str, metric: str) -> float | None:
    """The value of (task, metric) in rows (the last one if repeated); None when absent or NaN."""
    vals = [r["value"] for r in rows if r["task"] == task and r["metric"] == metric]
    if not vals or vals[-1] is None or math.isnan(vals[-1]):
        return None
    return float(vals[-1])


def leakage_removed_or_none(raw_cmap, anon_cmap, chance) -> float | None:
    from .probes import leakage_removed

    if None in (raw_cmap, anon_cmap, chance) or raw_cmap <= chance:
        return None  # nothing leaks above chance in the raw features: the share is undefined
    return leakage_removed(raw_cmap, anon_cmap, chance)


def relative_change_or_none(raw, new) -> float | None:
    from .probes import relative_change

    if raw is None or new is None or raw == 0:
        return None
    return relative_change(raw, new)


def derived_rows(raw_rows: Sequence[dict], anon_rows: Sequence[dict], created_at: datetime | None = None) -> list[dict]:
    """Rows of the anonymized set computed against raw: privacy leakage_removed and cmap_relative_change."""
    if not anon_rows:
        return []
    a = anon_rows[0]
    created_at = created_at or _now()
    out = []
    for task in PRIVACY_TASKS:
        raw_c, anon_c = metric_value(raw_rows, task, "cmap"), metric_value(anon_rows, task, "cmap")
        chance = metric_value(raw_rows, task, "chance_cmap")
        lr = leakage_removed_or_none(raw_c, anon_c, chance)
        if lr is not None:
            out.append(_row(a["feature_set"], a["aam_version"], task, "leakage_removed", lr, "test", created_at))
        rc = relative_change_or_none(raw_c, anon_c)
        if rc is not None:
            out.append(_row(a["feature_set"], a["aam_version"], task, "cmap_relative_change", rc, "test", created_at))
    return out


# ---------------------------------------------------------------- the metrics table

def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.]+", "_", name)


def metrics_key(feature_set: str, aam_version: str | None) -> str:
    return f"metrics/{_safe(feature_set)}-{_safe(aam_version or RAW)}.parquet"


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
            old = metrics_table(store.fs.read_parquet(key).to_pylist()).to_pylist() if store.fs.isfile(key) else []
            kept = [r for r in old if r["task"] not in tasks]
            store.fs.write_parquet(key, metrics_table(kept + list(new)))
            paths.append(store.loc(key))
    return paths


def read_metric_rows(store: FeatureStore, feature_set: str, aam_version: str | None) -> list[dict]:
    """The rows of one feature set (aam_version None: the raw baseline) from its metrics file ([] if none)."""
    key = metrics_key(feature_set, aam_version)
    if not store.fs.isfile(key):
        return []
    return [r for r in metrics_table(store.fs.read_parquet(key).to_pylist()).to_pylist()
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


def attacker_stats(rows: Sequence[dict]) -> dict:
    """task -> attacker -> {"score": its cMAP / rank-1 stat, "removed": its leakage (linkage) removed stat} from
    the per-attacker rows (metric 'cmap[mlp]', 'leakage_removed[mlp]', ...)."""
    out: dict = {}
    for task, (score, removed) in ATTACKED.items():
        for r in rows:
            m = r["metric"]
            for key, prefix in (("score", score), ("removed", removed)):
                if r["task"] == task and m.startswith(prefix + "[") and r.get("ci_low") is not None:
                    name = m[len(prefix) + 1:-1]
                    out.setdefault(task, {}).setdefault(name, {})[key] = {k: r.get(k) for k in STAT_KEYS}
    return out


def _stat_row(rows: Sequence[dict], task: str, metric: str) -> dict | None:
    hits = [r for r in rows if r["task"] == task and r["metric"] == metric and r.get("ci_low") is not None]
    return {k: hits[-1].get(k) for k in STAT_KEYS} if hits else None


def _signal(stat: dict, key: str) -> bool | None:
    """Is the metric beyond chance by more than its interval? None where no chance is defined (e.g. a gap)."""
    if key.endswith("_gap"):  # a bias gap is >= 0 by construction: it shows bias only when its interval leaves 0
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


def _raw_shards(store: FeatureStore, dataset: str) -> list[str]:
    from ..registry import dataset_of

    return [s for s in store.committed_shards() if dataset_of(s) == dataset]


def load_feature_sets(store: FeatureStore, which: Sequence[str], source: str, version: str | None = None,
                      datasets: Mapping[str, str] | None = None) -> dict[str, list[VideoFeatures]]:
    """dataset -> videos for the tasks `which`, from raw latents or the anonymized tables of `version`.

    A dataset with no committed raw shards is left out (its tasks get skipped). For source='anonymized'
    every committed raw shard of the dataset must have a table of `version`: a partial table would
    silently score a subset, so it raises instead."""
    from ..publish import PublishError, _published_shards, load_video_features

    out = {}
    for ds in dict.fromkeys(task_datasets(which, datasets).values()):
        shards = _raw_shards(store, ds)
        if not shards:
            continue
        if source == "anonymized":
            missing = sorted(set(shards) - _published_shards(store, version))
            if missing:
                raise PublishError(f"AAM version {version} has no anonymized tables for shard(s) {missing} of "
                                   f"dataset {ds!r}: materialise anonymized_features for them first")
        out[ds] = load_video_features(store, source=source, version=version, shards=shards)
    return out


# ---------------------------------------------------------------- anonymizing in memory

def anonymize_videos(adapter, videos: Sequence[VideoFeatures]) -> list[VideoFeatures]:
    """f_A applied to each video's clips in memory: the same rows `anonymize_shard` would publish (same
    batching code), each video a new VideoFeatures with the same labels."""
    from ..publish import _run_adapter

    videos = list(videos)
    if not videos:
        return []
    adapter.eval()
    clips = np.ascontiguousarray(np.concatenate([v.feats for v in videos]), np.float32)
    vids = np.concatenate([[i] * len(v.feats) for i, v in enumerate(videos)]).astype(str)
    clip_index = np.concatenate([np.arange(len(v.feats)) for v in videos])
    feats = _run_adapter(adapter, adapter.cfg, clips, vids, clip_index)
    bounds = np.cumsum([0] + [len(v.feats) for v in videos])
    return [dataclasses.replace(v, feats=np.ascontiguousarray(feats[a:b]), meta=dict(v.meta))
            for v, a, b in zip(videos, bounds[:-1], bounds[1:])]


# ---------------------------------------------------------------- the privacy budget measurement

def newest_version(store: FeatureStore) -> str | None:
    """The AAM version being published: the newest recorded (by created_at), else the current one."""
    from ..ledger import current_version
    from ..ledger import newest_version as _newest

    return _newest(store) or current_version(store)


def _shard_state(store: FeatureStore, shards: Sequence[str]) -> list:
    return [(s, (store.committed(s) or {}).get("manifest_hash")) for s in shards]


def _key(obj) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()[:16]


def privacy_budget_measure(store: FeatureStore, version: str, dataset: str = "privacy",
                           probe_kwargs: dict | None = None, use_cache: bool = True,
                           clip_dataset: str | None = "ar") -> dict:
    """Privacy attack on the raw vs the `version`-anonymized features, on the close-ups of `dataset` and on the
    action clips of `clip_dataset` (train actors -> test actors), when that dataset carries attr_* labels.

    The anonymized features are the published tables when every shard of a dataset has one, else the
    version's adapter (<root>/aam/<version>) applied in memory (identical rows, see anonymize_videos), so
    the gate can run before the shards are published. The measurement is cached per (version, raw shard
    manifests, probe settings) in <root>/reports/privacy_budget/<version>.json.
    Returns the WEAKER of the two measurements at the top level {raw_cmap, anonymized_cmap, chance_cmap,
    leakage_removed (None if raw is at chance), source, attributes, dataset}, plus {version, weaker,
    "closeups": {...}, "clips": {...} or {"skipped": why}}."""
    shards = _raw_shards(store, dataset)
    if not shards:
        raise StoreError(f"privacy dataset {dataset!r} has no committed latents in {store.root}: "
                         f"the leakage of version {version} cannot be measured")
    clip_shards = _raw_shards(store, clip_dataset) if clip_dataset else []
    key = _key({"version": version, "shards": _shard_state(store, shards), "probe": probe_kwargs or {},
                "clip_shards": _shard_state(store, clip_shards), "fingerprint": store.encoder_fingerprint()})
    cache = f"reports/privacy_budget/{_safe(version)}.json"
    if use_cache and store.fs.isfile(cache):
        hit = store.fs.read_json(cache)
        if hit.get("key") == key:
            return {**hit["measure"], "cached": True}
    closeups = _leakage_on(store, version, dataset, shards, probe_kwargs)
    if not clip_dataset:
        clips = {"skipped": "no action-clip dataset configured"}
    elif not clip_shards:
        clips = {"skipped": f"dataset {clip_dataset!r} has no committed latents"}
    else:
        try:
            clips = _leakage_on(store, version, clip_dataset, clip_shards, probe_kwargs)
        except _Unmeasurable as e:  # e.g. a user's action set without attr_* labels: say so, gate on close-ups
            clips = {"skipped": str(e)}
    measured = [("closeups", closeups)] + ([("clips", clips)] if "skipped" not in clips else [])
    # the top level reports the weaker set; a set whose raw features are at chance has no share to compare
    scored = [nm for nm in measured if nm[1]["leakage_removed"] is not None]
    weaker_name, weaker = min(scored, key=lambda nm: nm[1]["leakage_removed"]) if scored else measured[0]
    measure = {**weaker, "version": version, "weaker": weaker_name, "closeups": closeups, "clips": clips}
    store.fs.write_json(cache, {"key": key, "measure": measure, "created_at": _now().isoformat()})
    return {**measure, "cached": False}


class _Unmeasurable(StoreError):
    pass


def _leakage_on(store: FeatureStore, version: str, dataset: str, shards: list[str], probe_kwargs: dict | None) -> dict:
    from ..aam.io import load_adapter
    from ..publish import PublishError, _published_shards, load_video_features

    raw = load_video_features(store, source="raw", shards=shards)
    if set(shards) <= _published_shards(store, version):
        anon, source = load_video_features(store, source="anonymized", version=version, shards=shards), "published"
    else:
        adapter_dir = store.loc("aam", version)
        try:
            adapter, _, meta = load_adapter(adapter_dir, storage_options=getattr(store.fs, "storage_options", None))
        except FileNotFoundError as e:
            raise PublishError(f"version {version}: no published {dataset} tables and no adapter at {adapter_dir}") from e
        if meta["encoder_fingerprint"] != store.encoder_fingerprint():
            raise PublishError(f"adapter {adapter_dir} belongs to encoder {meta['encoder_fingerprint']!r}, the store "
                               f"to {store.encoder_fingerprint()!r}")
        anon, source = anonymize_videos(adapter, raw), "in-memory"
    kw = {"privacy": probe_kwargs or {}}
    r = evaluate_feature_set({dataset: raw}, RAW, None, which=("privacy",), datasets={"privacy": dataset}, probe_kwargs=kw)
    if "privacy" in r.skipped:
        raise _Unmeasurable(f"cannot measure leakage on {dataset!r}: {r.skipped['privacy']}")
    attrs = r.details["privacy"]["attributes"]
    a = evaluate_feature_set({dataset: anon}, "splavu", version, which=("privacy",), datasets={"privacy": dataset},
                             probe_kwargs=kw, attributes=attrs)
    raw_c, anon_c = metric_value(r, "privacy", "cmap"), metric_value(a, "privacy", "cmap")
    chance = metric_value(r, "privacy", "chance_cmap")
    return {"dataset": dataset, "source": source, "attributes": attrs,
            "raw_cmap": raw_c, "anonymized_cmap": anon_c, "chance_cmap": chance,
            "raw_branch": r.details["privacy"]["branch"], "anonymized_branch": a.details["privacy"]["branch"],
            "leakage_removed": leakage_removed_or_none(raw_c, anon_c, chance)}


def _is_oracle(store: FeatureStore, version: str) -> bool:
    try:
        return bool(store.fs.read_json(f"aam/{version}/adapter.json")["config"].get("oracle"))
    except FileNotFoundError:
        return False




def passes_privacy_budget(store: FeatureStore, version: str, threshold: float | None = None) -> tuple[bool, str]:
    """The gate a version must pass before it becomes current; fails closed when leakage cannot be measured."""
    if threshold is None:
        threshold = float(os.environ.get(PRIVACY_BUDGET_ENV, DEFAULT_PRIVACY_BUDGET))
    if _is_oracle(store, version):
        return False, f"version {version} is the oracle diagnostic (trained with private-attribute labels): never current"
    try:
        from ..roles import task_datasets  # the dataset registered with role privacy

        ds = task_datasets(store)
        return budget_verdict(privacy_budget_measure(store, version, ds["privacy"], clip_dataset=ds["clip_privacy"]),
                              threshold)
    except Exception as e:
        return False, f"leakage of version {version} could not be measured ({e}); not promoted"
