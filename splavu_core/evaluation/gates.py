"""The two promotion gates, measured on VALIDATION splits the report never scores.

    privacy   the share of above-chance leakage removed, (raw − anon) / (raw − chance) of the cMAP of the
              strongest attacker of the fixed-capacity suite (evaluation/attackers.py), on the privacy close-ups AND
              on the action clips the product publishes, AND the same share of re-identification linkage (rank-1
              across actions); the LOWER end of each 95% interval must meet the budget ($SPLAVU_PRIVACY_BUDGET,
              default 0.5)
    utility   every task the AAM was trained with (its "seen" tasks: AR / TAD / AD) keeps a share of the raw
              features' above-chance utility, (anon − chance) / (raw − chance), read by the strongest reader of
              the task's suite on raw (evaluation/readers.py) paired with itself; it fails when that share is below
              the threshold ($SPLAVU_UTILITY_GATE, default 0.95) with the interval's upper end below 1 (a loss
              beyond the noise), or when the anonymized features are not above chance beyond their interval

Both are scored by splavu_core.evaluation.scoring with split="val" (the dataset's 'val' videos, or a
deterministic validation split carved from its train videos), 5 probe seeds, paired raw vs anonymized. The
measurement is cached per (version, raw shard manifests, seeds, probe settings) in
<root>/reports/gates/<version>.json, and each verdict is recorded in the version ledger (ledger.record_verdict),
where publish, the catalog, `splavu neighbors` and the CLI read it. The Dagster asset checks `privacy_budget`
and `utility_budget` and the promotion in `anonymized_features` all call `evaluate_gates`, so the UI and the
ledger cannot disagree.
"""
from __future__ import annotations

import hashlib
import json
from datetime import datetime, timezone

from splavu_core.evaluation.attackers import SUITE_NAMES
from splavu_core.store import ledger
from splavu_core.store.feature_store import FeatureStore, StoreError

GATE_SEEDS = 5
PRIVACY_TASKS = ("privacy", "clip_privacy", "reid")
PRIVACY_PARTS = (("privacy", "closeups"), ("clip_privacy", "clips"), ("reid", "linking"))
UTILITY_TASKS = ("ar", "tad", "ad")


def _key(obj) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()[:16]


def _find(obj, name):
    if isinstance(obj, dict):
        if name in obj:
            return obj[name]
        for v in obj.values():
            hit = _find(v, name)
            if hit is not None:
                return hit
    return None


def seen_tasks(store: FeatureStore, version: str) -> list[str]:
    """The utility tasks `version` was co-trained with (its adapter.json's train_config.tasks); every utility task
    when that is not recorded."""
    try:
        meta = store.files.read_json(f"aam/{version}/adapter.json")
    except FileNotFoundError:
        return list(UTILITY_TASKS)
    tc = _find(meta, "train_config")
    tasks = tc.get("tasks") if isinstance(tc, dict) else None
    return [t for t in UTILITY_TASKS if t in tasks] if tasks is not None else list(UTILITY_TASKS)


def _is_oracle(store: FeatureStore, version: str) -> bool:
    try:
        return bool(store.files.read_json(f"aam/{version}/adapter.json")["config"].get("oracle"))
    except FileNotFoundError:
        return False


def anonymized_for(store: FeatureStore, version: str, dataset: str, raw_videos):
    """The version's features of `dataset`: its published tables when complete, else its adapter in memory
    (identical rows, see suite.anonymize_videos). Returns (videos, source)."""
    from splavu_core.aam.io import load_adapter
    from splavu_core.evaluation.suite import anonymize_videos, raw_shards
    from splavu_core.publish.anonymized_tables import load_video_features, published_shards

    shards = raw_shards(store, dataset)
    if shards and set(shards) <= published_shards(store, version):
        return load_video_features(store, source="anonymized", version=version, shards=shards), "published"
    adapter_dir = store.loc("aam", version)
    try:
        adapter, _, meta = load_adapter(adapter_dir, storage_options=getattr(store.files, "storage_options", None))
    except FileNotFoundError as e:
        raise ledger.PublishError(f"version {version}: no published {dataset} tables and no adapter at "
                                  f"{adapter_dir}") from e
    if meta["encoder_fingerprint"] != store.encoder_fingerprint():
        raise ledger.PublishError(f"adapter {adapter_dir} belongs to encoder {meta['encoder_fingerprint']!r}, "
                                  f"the store to {store.encoder_fingerprint()!r}")
    return anonymize_videos(adapter, raw_videos), "in-memory"


def measure_gates(store: FeatureStore, version: str, base_seed: int = 0, n_seeds: int = GATE_SEEDS,
                  probe_kwargs: dict | None = None, use_cache: bool = True, datasets: dict | None = None,
                  utility: bool = True) -> dict:
    """Score raw vs `version` on the validation splits of the privacy sets and the seen tasks.

    Returns {"version", "split": "val", "seeds", "privacy": {"closeups": m, "clips": m | {"skipped"}},
    "utility": {task: m | {"skipped"}}, "rows": metric rows, "source": {dataset: published | in-memory}} where a
    privacy m = {raw_cmap, anonymized_cmap, chance_cmap, leakage_removed, leakage_removed_ci_low/high, ...} and a
    utility m = {raw, anon, chance, retention, retention_ci_low/high, no_signal, anon_at_chance}."""
    from splavu_core.evaluation.scoring import score_sets
    from splavu_core.evaluation.suite import load_feature_sets, raw_shards, shard_hashes
    from splavu_core.ingest.datasets import task_datasets

    ds = task_datasets(store, {k: v for k, v in (datasets or {}).items() if v and v != "none"})
    if (datasets or {}).get("clip_privacy") == "none":
        ds["clip_privacy"] = None
    seen = seen_tasks(store, version) if utility else []  # utility=False: the utility gate is off, not measured
    which = [t for t in (*PRIVACY_TASKS, *seen) if ds.get(t) and raw_shards(store, ds[t])]
    seeds = list(range(base_seed, base_seed + n_seeds))
    shard_state = {t: shard_hashes(store, raw_shards(store, ds[t])) for t in which}
    # protocol: bumped whenever what a measurement holds changes, so a cached one is never read as the new kind
    # (6: intervals resample people where they repeat; the utility parts carry their video counts)
    key = _key({"version": version, "shards": shard_state, "seeds": seeds, "probe": probe_kwargs or {},
                "datasets": {t: ds[t] for t in which}, "fingerprint": store.encoder_fingerprint(), "protocol": 6})
    cache = f"reports/gates/{version}.json"
    if use_cache and store.files.isfile(cache):
        hit = store.files.read_json(cache)
        if hit.get("key") == key:
            return {**hit["measure"], "cached": True}
    if "privacy" not in which:
        raise StoreError(f"no privacy dataset with committed latents in {store.root}: the leakage of version "
                         f"{version} cannot be measured")
    raw = load_feature_sets(store, which, "raw", datasets=ds)
    anon, source = {}, {}
    for d, videos in raw.items():
        anon[d], source[d] = anonymized_for(store, version, d, videos)
    kw = dict(probe_kwargs or {})  # the gate is judged by the suite alone (the width-following attacker never judges)
    kw["privacy"] = {"attackers": SUITE_NAMES, **(kw.get("privacy") or {})}
    res = score_sets({"raw": raw, "splavu": anon}, which, ds, split="val", seeds=seeds, probe_kwargs=kw,
                     versions={"splavu": version}, store=store)
    rows = list(res)

    def stat(fs_, task, metric):
        hits = [r for r in rows if r["feature_set"] == fs_ and r["task"] == task and r["metric"] == metric]
        return hits[-1] if hits else None

    privacy = {}
    for task, name in PRIVACY_PARTS:
        metric, removed = ("rank1", "linkage_removed") if task == "reid" else ("cmap", "leakage_removed")
        r, a, lr = stat("raw", task, metric), stat("splavu", task, metric), stat("splavu", task, removed)
        if r is None or a is None:
            privacy[name] = {"skipped": res.skipped.get(task, f"{task} not measured")}
            continue
        signal = r["ci_low"] > r["chance"]
        sc = res.scored[task]
        # the keys say cmap for every part (ledger.budget_verdict reads them); for linking they hold rank-1
        privacy[name] = {"dataset": ds[task], "metric": metric, "raw_cmap": r["value"],
                         "raw_cmap_ci": [r["ci_low"], r["ci_high"]],
                         "anonymized_cmap": a["value"], "anonymized_cmap_ci": [a["ci_low"], a["ci_high"]],
                         "chance_cmap": r["chance"], "strongest_raw": sc["raw"].details.get("strongest"),
                         "strongest_anonymized": sc["splavu"].details.get("strongest"),
                         "leakage_removed": lr["value"] if signal and lr else None,
                         "leakage_removed_ci_low": lr["ci_low"] if signal and lr else None,
                         "leakage_removed_ci_high": lr["ci_high"] if signal and lr else None,
                         **validation_counts(raw[ds[task]], sc["raw"].test_ids)}
    utility = utility_measures(res, seen, ds)
    scored = {task: by_set["raw"].test_ids for task, by_set in res.scored.items() if "raw" in by_set}
    measure = {"version": version, "split": "val", "seeds": seeds, "privacy": privacy, "utility": utility,
               "seen_tasks": seen, "source": source, "rows": rows, "scored_videos": scored}
    store.files.write_json(cache, json.loads(json.dumps({"key": key, "measure": measure,
                                                      "created_at": datetime.now(timezone.utc).isoformat()},
                                                     default=str)))
    return {**measure, "cached": False}


def utility_measures(res, seen, datasets: dict, name: str = "splavu") -> dict:
    """task -> the utility gate's measure of feature set `name` against raw, from scoring.score_sets' result `res`:
    {dataset, metric, raw, anon, chance, retention (+ interval), reader (raw's strongest, the judge), no_signal,
    anon_at_chance}, or {"skipped": why}."""
    def stat(fs_, task, metric):
        hits = [r for r in res if r["feature_set"] == fs_ and r["task"] == task and r["metric"] == metric]
        return hits[-1] if hits else None

    utility = {}
    for task in seen:
        m = {"ar": "top1", "tad": "mAP", "ad": "auc"}[task]
        r, a, ret = stat("raw", task, m), stat(name, task, m), stat(name, task, f"retention_{m}")
        if r is None or a is None or ret is None:
            utility[task] = {"skipped": res.skipped.get(task, f"{task} not measured on validation")}
            continue
        utility[task] = {"dataset": datasets[task], "metric": m, "raw": r["value"], "raw_ci": [r["ci_low"], r["ci_high"]],
                         "anon": a["value"], "anon_ci": [a["ci_low"], a["ci_high"]], "chance": r["chance"],
                         "retention": ret["value"], "retention_ci_low": ret["ci_low"],
                         "retention_ci_high": ret["ci_high"], "no_signal": not r["ci_low"] > r["chance"],
                         "reader": res.scored[task]["raw"].details.get("strongest"),
                         "anon_at_chance": not a["ci_low"] > r["chance"],
                         "n_videos": len(res.scored[task]["raw"].test_ids or ())}
    return utility


def validation_counts(videos, scored_ids) -> dict:
    """{n_videos, n_subjects} of the validation videos a privacy part scored (n_subjects None without subject_id):
    what the gate's verdict says when the interval is too wide to decide (ledger.power_advice)."""
    ids = set(scored_ids or ())
    subjects = [v.meta.get("subject_id") for v in videos if v.video_id in ids]
    known = {str(x) for x in subjects if x is not None}
    return {"n_videos": len(ids), "n_subjects": len(known) if known else None}


def privacy_measure_view(measure: dict) -> dict:
    """The privacy part in the shape ledger.budget_verdict reads (the weaker set at the top level)."""
    p = measure["privacy"]
    parts = [(n, p[n]) for _, n in PRIVACY_PARTS if "skipped" not in p.get(n, {"skipped": 1})]
    scored = [nm for nm in parts if nm[1]["leakage_removed"] is not None]
    weaker_name, weaker = (min(scored, key=lambda nm: nm[1]["leakage_removed_ci_low"]) if scored else parts[0])
    return {**weaker, "weaker": weaker_name, "closeups": p["closeups"], "clips": p.get("clips", {"skipped": "-"}),
            "linking": p.get("linking", {"skipped": "-"})}


def evaluate_gates(store: FeatureStore, version: str, privacy_threshold: float | None = None,
                   utility_fraction: float | None = None, record: bool = True, **kw) -> dict:
    """Both verdicts on `version`: {"privacy": (passed, why), "utility": (passed, why), "measure": ...}.
    Fails closed (both False) when the version cannot be measured; recorded in the ledger unless record=False."""
    pt, uf = ledger.privacy_threshold(privacy_threshold), ledger.utility_fraction(utility_fraction)
    if _is_oracle(store, version):
        why = f"version {version} is the oracle diagnostic (trained with private-attribute labels): never current"
        out = {"privacy": (False, why), "utility": (False, why), "measure": None}
    else:
        try:
            m = measure_gates(store, version, utility=uf > 0, **kw)
            out = {"privacy": ledger.budget_verdict(privacy_measure_view(m), pt),
                   "utility": ledger.utility_verdict(m["utility"], uf), "measure": m}
        except Exception as e:  # cannot measure -> cannot vouch for the version: fail closed
            why = f"version {version} could not be measured on validation ({type(e).__name__}: {e})"
            out = {"privacy": (False, why), "utility": (False, why), "measure": None, "error": str(e)}
    if record:
        ledger.record_verdict(store, version, "privacy", *out["privacy"], threshold=pt, split="val")
        ledger.record_verdict(store, version, "utility", *out["utility"], threshold=uf, split="val")
    return out


def passes_gates(store: FeatureStore, version: str) -> tuple[bool, str]:
    """(both gates pass, why) for promotion."""
    out = evaluate_gates(store, version)
    (p_ok, p_why), (u_ok, u_why) = out["privacy"], out["utility"]
    if p_ok and u_ok:
        return True, f"privacy: {p_why}; utility: {u_why}"
    failed = [f"privacy budget: {p_why}"] * (not p_ok) + [f"utility: {u_why}"] * (not u_ok)
    return False, "; ".join(failed)
