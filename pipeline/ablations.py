"""Ablations (paper Tab. 2, 4, 5, 9): one AAM per variant, trained from the same cached latents, scored with
the privacy-utility report schema and its intervals (n_seeds probe seeds + a bootstrap over the test videos,
every change paired with raw on the same seeds and resamples).

    ablation_variant   static partitions, one per variant: trains its AAM (splavu_core.aam.train.train_aam), anonymizes
                       the raw latents of every evaluation dataset IN MEMORY (nothing is published), runs the
                       evaluation suite and writes <root>/reports/ablations/variants/<variant>.json
    ablation_report    collects every variant row into <root>/reports/ablations.json (+ .md, .png)
    job `ablations`    both; pipeline/runner.py `run_ablations()` runs them in-process (`splavu ablations`)

Variants (each a delta on the base AAM config, assets.aam.AAMTrainingConfig's defaults unless configured):
the keep family (default: keep k = 11 + recentring on clusters of clips; no_recentre = keep k = 11 alone, the default before
issue 29; recentre_classes = recentring on the trained classes, the default of issue 29; keep14_draw4(_top3) = k = 14
with one centroid drawn per clip at temperature 4 (among the 3 most likely), anonymizer v6's option;
keep_k8/24/32, keep_no_motion, keep_unshrunk, keep_dynamic, keep_learned, keep_after_projection) beside
previous_default and the paper's objective; tasks seen in training, every single task and pair (tasks_ar ..
tasks_all); and, on the previous default's trained family: losses (loss_all, loss_no_lt = no utility task,
loss_no_lb = no privacy loss and no appearance projection, loss_no_llc = w_lc 0), the w_lc sweep (wlc_0 .. wlc_1000)
and the privacy objectives (paper, critic, critic_static_action, projection_only, and oracle: a supervised attribute
adversary, the one variant given private labels, a diagnostic only).
Variants whose training config is identical (loss_all = tasks_all = wlc_<base w_lc>, loss_no_llc = wlc_0)
train once: the result is cached per config in <root>/reports/ablations/by_config/.
"""

import time

import dagster as dg

from assets.aam import AAMTrainingConfig
from assets.evaluation import ProbeSettings
from assets.resources import StoreResource
from splavu_core.aam.io import adapter_version
from splavu_core.aam.config import PREVIOUS_DEFAULT
from splavu_core.aam.train import train_aam
from splavu_core.aam.training_data import load_oracle_labels, load_training_data
from splavu_core.evaluation.report import ablation_markdown, png_markdown, write_ablation_report
from splavu_core.evaluation.scoring import score_sets
from splavu_core.evaluation.suite import (
    RAW,
    TASKS,
    add_derived,
    anonymize_videos,
    build_report,
    config_key,
    load_feature_sets,
    report_row,
    safe_name,
    shard_hashes,
)
from splavu_core.ingest.datasets import dataset_of, training_plan
from splavu_core.store.feature_store import FeatureStore

NO_PROJECTION = {"projection_rank": 0}


def _previous(**delta) -> dict:
    """A delta on the previous default (config.PREVIOUS_DEFAULT): the trained family's ablations (losses, w_lc, privacy
    objectives) are deltas on it, the keep family's on the new default."""
    return {**PREVIOUS_DEFAULT, **delta}


TASK_SETS = {"ar": ("ar",), "tad": ("tad",), "ad": ("ad",), "ar_tad": ("ar", "tad"), "ar_ad": ("ar", "ad"),
             "tad_ad": ("tad", "ad"), "all": ("ar", "tad", "ad")}
VARIANTS: dict[str, dict] = {
    "default": {},
    # the keep family (issue 22): width, the motion directions, a learned block on top, the appearance projection
    # before it;
    # recentring (issue 29) off: the keep default before it
    "no_recentre": {"recentre": False},
    # recentring on the trained classes (issue 29's default): private, but unseen tasks lose their video-level signal
    "recentre_classes": {"recentre_on": "classes", "recentre_quantile": 0.8},
    # anonymizer v6's option: one centroid drawn per clip (randomised response), at the width it was measured
    "keep14_draw4": {"keep": 14, "recentre_draw": 4.0},
    "keep14_draw4_top3": {"keep": 14, "recentre_draw": 4.0, "recentre_top": 3},
    **{f"keep_k{k}": {"keep": k} for k in (8, 24, 32)},
    "keep_no_motion": {"keep_w_motion": 0.0},
    "keep_unshrunk": {"keep_ridge": 1e-3},  # the first keep default: no shrinkage of the discriminant
    "keep_dynamic": {"keep_w_dynamic": 1.0},  # + what motion adds to a video (moving minus its static clips)
    "keep_learned": {"layers": 2, "recentre": False, "privacy": "critic"},
    "keep_after_projection": {"projection_fraction": 0.5},
    "previous_default": _previous(),
    # tasks seen in training (paper Tab. 2 / 4), on the default
    **{f"tasks_{name}": {"tasks": tasks} for name, tasks in TASK_SETS.items()},
    # the trained family: losses (paper Tab. 5); no privacy mechanism at all = neither the loss nor the projection
    "loss_all": _previous(), "loss_no_lt": _previous(tasks=()),
    "loss_no_lb": _previous(w_b=0.0, **NO_PROJECTION), "loss_no_llc": _previous(w_lc=0.0),
    # privacy objectives (issue 12): the paper's, learned critics, the appearance projection alone, and the labelled
    # frontier
    "paper": {"privacy": "ntxent", "pairs": "static_static", "epochs": 60,
              "keep": 0, "projection_rank": 0, "mixer": "attention", "layers": 3, "recentre": False},
    "critic": _previous(privacy="critic", pairs="static_static", **NO_PROJECTION),
    "critic_static_action": _previous(privacy="critic", pairs="static_action", **NO_PROJECTION),
    "projection_only": _previous(w_b=0.0),
    "oracle": _previous(oracle=True),
    **{f"wlc_{w}": _previous(w_lc=float(w)) for w in (0, 1, 10, 100, 1000)},
}
GROUPS: dict[str, list[str]] = {
    "The keep family (default: keep k = 11, closed form) beside the previous default and the paper's objective": [
        "default", "no_recentre", "recentre_classes", "keep14_draw4", "keep14_draw4_top3", "keep_k8", "keep_k24",
        "keep_k32", "keep_no_motion", "keep_unshrunk", "keep_dynamic", "keep_learned",
        "keep_after_projection",
        "previous_default", "paper"],
    "Tasks seen in training, default adapter (paper Tab. 2 / 4)": [f"tasks_{n}" for n in TASK_SETS],
    "Privacy objective of the trained family (oracle = labelled diagnostic, never publishable)": [
        "loss_all", "paper", "critic", "critic_static_action", "projection_only", "oracle"],
    "Losses of the trained family (paper Tab. 5)": ["loss_all", "loss_no_lt", "loss_no_lb", "loss_no_llc"],
    "ω_LC sweep of the trained family (paper Tab. 9)": [f"wlc_{w}" for w in (0, 1, 10, 100, 1000)],
}
ablation_variants = dg.StaticPartitionsDefinition(list(VARIANTS))


class AblationConfig(AAMTrainingConfig, ProbeSettings):
    """The base AAM config (every variant is a delta on it) + head pretraining + probe settings."""

    pretrain_head_epochs: int = 30
    seed: int = 0       # probes use seeds seed .. seed + n_seeds - 1
    n_seeds: int = 5    # probe seeds per metric (the report's intervals need >= 5)

    def seeds(self) -> list[int]:
        return list(range(self.seed, self.seed + self.n_seeds))

    def variant_train_config(self, variant: str, tasks=("ar", "tad", "ad"), selection: str = "val_ar"):
        """tasks / selection: the base's when the config leaves them open (roles.training_plan's choice)."""
        if variant not in VARIANTS:
            raise ValueError(f"unknown ablation variant {variant!r}; choose from {list(VARIANTS)}")
        base = self.train_config().replace(pretrain_head_epochs=self.pretrain_head_epochs,
                                           tasks=tuple(self.tasks if self.tasks is not None else tasks),
                                           selection=self.selection or selection)
        return base.replace(**VARIANTS[variant])


# ---------------------------------------------------------------- library side (no dagster context needed)

ABLATIONS = "reports/ablations"  # key of the ablation records in the store


def _read_record(store: FeatureStore, key: str) -> dict | None:
    try:
        return store.files.read_json(key)
    except FileNotFoundError:
        return None


def _jsonable_rows(rows) -> list[dict]:
    return [{**r, "created_at": r["created_at"].isoformat()} for r in rows]


def _eval_shards(store: FeatureStore, datasets: dict[str, str]) -> list:

    wanted = set(datasets.values())
    return shard_hashes(store, [s for s in store.committed_shards() if dataset_of(s) in wanted])


_RAW_SCORED: dict[str, dict] = {}  # raw_key -> task -> raw's (Scored, why): the variants of one process pair with it


def _score(store: FeatureStore, config: AblationConfig, sets: dict, raw_key: str, versions=None, log=None):
    return score_sets(sets, TASKS, config.datasets(store), split="test", seeds=config.seeds(),
                      probe_kwargs=config.probe_kwargs(), versions=versions, log=log,
                      reference_cache=_RAW_SCORED.setdefault(raw_key, {}), store=store)


def raw_baseline(store: FeatureStore, config: AblationConfig, raw=None, log=None) -> tuple[list[dict], str]:
    """The raw latents' metric rows under these probe settings and seeds, cached; returns (rows, key)."""
    datasets, kw = config.datasets(store), config.probe_kwargs()
    key = config_key({"probe": kw, "seeds": config.seeds(), "scoring": "intervals", "datasets": datasets,
                "shards": _eval_shards(store, datasets), "fingerprint": store.encoder_fingerprint()})
    path = f"{ABLATIONS}/raw/{key}.json"
    if (hit := _read_record(store, path)) is not None:
        return hit["metric_rows"], key
    raw = raw if raw is not None else load_feature_sets(store, TASKS, "raw", datasets=datasets)
    rows = _score(store, config, {RAW: raw}, key, log=log)
    store.files.write_json(path, {"key": key, "metric_rows": _jsonable_rows(rows), "skipped": rows.skipped})
    return _jsonable_rows(rows), key


def run_variant(store: FeatureStore, variant: str, config: AblationConfig, log=None) -> dict:
    """Train the variant's AAM, anonymize the evaluation sets in memory, score it paired with raw; write and
    return its record."""

    plan = training_plan(store, config.tasks, config.train_datasets(), config.selection)
    cfg = config.variant_train_config(variant, plan.tasks, plan.selection)
    train_datasets = [plan.available.get(t) for t in ("ar", "tad", "ad")]
    datasets = config.datasets(store)
    raw = load_feature_sets(store, TASKS, "raw", datasets=datasets)
    raw_rows, raw_key = raw_baseline(store, config, raw=raw, log=log)
    train_cfg = cfg.flat()  # the stored layout
    # the key hashes the fields under their names before any rename: cached records of earlier runs keep their keys
    key = config_key({"train": cfg.flat(names_before=True), "train_datasets": train_datasets, "raw_key": raw_key})
    by_config = f"{ABLATIONS}/by_config/{key}.json"
    if (hit := _read_record(store, by_config)) is not None:
        rec = {**hit, "name": variant, "reused": True}
    else:
        t0 = time.perf_counter()
        data = load_training_data(store, *train_datasets)
        if cfg.loop.oracle:  # the labelled diagnostic: the one place training is given private-attribute labels
            data = load_oracle_labels(store, data)
        adapter, acfg, summary = train_aam(data, cfg, log=log)
        version = adapter_version(adapter, acfg, store.encoder_fingerprint())
        anon = {ds: anonymize_videos(adapter, videos) for ds, videos in raw.items()}
        rows = _score(store, config, {RAW: raw, variant: anon}, raw_key, versions={variant: version}, log=log)
        rows_v = [r for r in rows if r["feature_set"] == variant]
        rec = {"name": variant, "key": key, "raw_key": raw_key, "aam_version": version, "train_config": train_cfg,
               "adapter_config": acfg.to_dict(), "selected_epoch": summary["selected_epoch"],
               "final_losses": summary["final"], "train_seconds": summary["seconds"],
               "pair_matching": summary.get("diagnostics"), "seen_tasks": list(cfg.tasks),
               "seconds": round(time.perf_counter() - t0, 2), "metric_rows": _jsonable_rows(rows_v),
               "skipped": rows.skipped, "reused": False}
        store.files.write_json(by_config, rec)
    rec["row"] = {**add_derived(report_row(RAW, raw_rows), report_row(variant, rec["metric_rows"])),
                  "seen_tasks": list(cfg.tasks)}
    store.files.write_json(f"{ABLATIONS}/variants/{safe_name(variant)}.json", rec)
    return rec


def collect_report(store: FeatureStore, config: AblationConfig, log=None) -> tuple[dict, dict]:
    """The ablation report from every variant record matching the current raw baseline; (report, status)."""
    raw_rows, raw_key = raw_baseline(store, config, log=log)
    variants, seen, stale, missing = {}, {}, [], []
    for name in VARIANTS:
        rec = _read_record(store, f"{ABLATIONS}/variants/{safe_name(name)}.json")
        if rec is None:
            missing.append(name)
            continue
        if rec.get("raw_key") != raw_key:  # other latents, probe settings or seeds: not comparable
            stale.append(name)
            continue
        variants[name] = rec["metric_rows"]
        seen[name] = rec.get("seen_tasks") or (rec.get("train_config") or {}).get("tasks")
    report = build_report(store.encoder_fingerprint(), "", raw_rows, variants)
    for row in report["rows"][1:]:  # the tasks each variant was co-trained with: the tables mark seen / unseen
        if seen.get(row["name"]) is not None:
            row["seen_tasks"] = list(seen[row["name"]])
    report["probe_seeds"] = config.seeds()
    return report, {"missing": missing, "stale": stale, "raw_key": raw_key}


# ---------------------------------------------------------------- dagster

@dg.asset(partitions_def=ablation_variants, group_name="ablations",
          deps=[dg.AssetDep(k, partition_mapping=dg.AllPartitionMapping()) for k in ("clip_latents", "static_latents")],
          kinds={"pytorch", "json"},
          description="One ablation variant: its own AAM from the cached latents, evaluated in memory (not published).")
def ablation_variant(context: dg.AssetExecutionContext, config: AblationConfig, store: StoreResource):
    feature_store = store.store()
    rec = run_variant(feature_store, context.partition_key, config, log=context.log.info)
    md = {"variant": rec["name"], "aam_version": rec["aam_version"], "reused": rec["reused"],
          "train_config": dg.MetadataValue.json(rec["train_config"]), "row": dg.MetadataValue.json(rec["row"]),
          "skipped": dg.MetadataValue.json(rec["skipped"])}
    for k, v in rec["row"].items():
        if isinstance(v, float):
            md[k] = v
    return dg.MaterializeResult(metadata=md)


@dg.asset(deps=[ablation_variant], group_name="ablations", kinds={"json", "markdown"},
          description="Every ablation variant's row in <store>/reports/ablations.json (+ .md, .png).")
def ablation_report(context: dg.AssetExecutionContext, config: AblationConfig, store: StoreResource):

    feature_store = store.store()
    report, status = collect_report(feature_store, config, log=context.log.info)
    paths = write_ablation_report(feature_store, report, GROUPS)
    png = paths["png"].read_bytes()
    if status["stale"]:
        context.log.warning(f"left out variants scored on other latents or probe settings: {status['stale']}")
    return dg.MaterializeResult(metadata={
        "path": str(paths["json"]), "variants": len(report["rows"]) - 1,
        "missing": dg.MetadataValue.json(status["missing"]), "stale": dg.MetadataValue.json(status["stale"]),
        "table": dg.MetadataValue.md(ablation_markdown(report, GROUPS)), "report": dg.MetadataValue.json(report),
        "tradeoff": dg.MetadataValue.md(png_markdown(png, "ablations"))})


ablations_job = dg.define_asset_job(
    "ablations", selection=dg.AssetSelection.assets(ablation_variant, ablation_report), partitions_def=ablation_variants,
    description="Train and score one ablation variant per partition, then rebuild the ablation report.")

ASSETS = [ablation_variant, ablation_report]
