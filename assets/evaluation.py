"""Evaluation assets (raw latents vs the current anonymized table), the report, and the two gates.

    action_recognition_eval, temporal_detection_eval, anomaly_detection_eval, privacy_attack_eval,
    bias_eval, gait_eval      metric rows for feature sets 'raw', 'splavu' and every pixel baseline store
                              (<root>/baselines/pixel_*) -> <root>/metrics/*.parquet
    privacy_utility_report    <root>/reports/privacy_utility.{json,md,png}: one row per feature set and the
                              cost of each approach (splavu_core.costs), attached to the materialisation
    privacy_budget            BLOCKING check on anonymized_features: share of above-chance leakage removed
    utility_retention         WARN check on privacy_utility_report: each utility metric >= fraction of raw

Upstream assets are referred to by key only (anonymized_features, clip_latents), so this module
imports none of their code. Every head is trained fresh on the features it scores.
"""

import base64
import os

import dagster as dg
from pydantic import Field

from pipeline.resources import StoreResource
from splavu_core.evaluation.report import read_report, report_markdown, write_privacy_utility_report
from splavu_core.evaluation.suite import (DEFAULT_DATASETS, RAW, UTILITY_KEYS, build_report, budget_verdict,
                                          derived_rows, evaluate_feature_set, load_feature_sets, metric_value,
                                          newest_version, privacy_budget_measure, read_metric_rows, write_metric_rows)
from splavu_core.evaluation.suite import DEFAULT_PRIVACY_BUDGET, PRIVACY_BUDGET_ENV
from splavu_core.evaluation.suite import utility_retention as retention_per_metric
from splavu_core import costs
from splavu_core.baselines import eval_shards, existing_baselines, stale_shards
from splavu_core.publish import current_version
from splavu_core.roles import task_datasets

ANONYMIZED = dg.AssetKey("anonymized_features")
CLIP_LATENTS = dg.AssetKey("clip_latents")
SPLAVU = "splavu"
GROUP = "evaluation"

UTILITY_RETENTION_ENV = "SPLAVU_UTILITY_RETENTION"
DEFAULT_UTILITY_RETENTION = 0.97


class ProbeSettings(dg.Config):
    """Which dataset serves each task and how long each fresh probe trains (defaults: DESIGN.md section 4)."""

    # "" = the dataset registered with that role (splavu_core.roles; the demo's names by default)
    ar_dataset: str = ""
    tad_dataset: str = ""
    ad_dataset: str = ""
    privacy_dataset: str = ""
    clip_privacy_dataset: str = ""  # action clips attacked (needs attr_* labels); "" = the AR dataset
    bias_f_dataset: str = ""
    bias_m_dataset: str = ""
    gait_dataset: str = ""
    ar_epochs: int = 60
    tad_epochs: int = 20
    ad_epochs: int = 50
    privacy_epochs: int = 100

    def datasets(self, store=None) -> dict[str, str]:
        given = {t: getattr(self, f"{t}_dataset") for t in DEFAULT_DATASETS}
        if store is None:
            return {t: d or DEFAULT_DATASETS[t] for t, d in given.items()}
        return task_datasets(store, given)

    def probe_kwargs(self, seed: int | None = None) -> dict[str, dict]:
        extra = {} if seed is None else {"seed": seed}
        epochs = {"ar": self.ar_epochs, "bias": self.ar_epochs, "tad": self.tad_epochs, "ad": self.ad_epochs,
                  "privacy": self.privacy_epochs}
        return {task: {"epochs": n, **extra} for task, n in epochs.items()}


class EvalConfig(ProbeSettings):
    """Which features to score; datasets and probe lengths come from ProbeSettings."""

    aam_version: str = Field(default="", description="AAM version of the 'splavu' set (default: the current one)")
    seed: int = 0


def _version(fs, requested: str) -> str:
    version = requested or current_version(fs)
    if not version:
        raise dg.Failure(f"no current AAM version in {fs.root}: publish anonymized_features first "
                         f"(or set aam_version in the config)")
    return version


def evaluate_tasks(context, store: StoreResource, config: EvalConfig, tasks: tuple[str, ...]) -> dg.MaterializeResult:
    """Score `tasks` on raw and on the anonymized features of the (current) version; write the metric rows."""
    fs = store.store()
    version = _version(fs, config.aam_version)
    datasets, kw = config.datasets(fs), config.probe_kwargs(config.seed)
    raw = load_feature_sets(fs, tasks, "raw", datasets=datasets)
    anon = load_feature_sets(fs, tasks, "anonymized", version=version, datasets=datasets)
    log = context.log.info
    raw_rows = evaluate_feature_set(raw, RAW, None, which=tasks, datasets=datasets, probe_kwargs=kw, log=log)
    attrs = raw_rows.details.get("privacy", {}).get("attributes")
    anon_rows = evaluate_feature_set(anon, SPLAVU, version, which=tasks, datasets=datasets, probe_kwargs=kw,
                                     attributes=attrs, log=log)
    extra = derived_rows(raw_rows, anon_rows)
    rows = list(raw_rows) + list(anon_rows) + extra
    baseline_rows = {}
    for name, bfs in existing_baselines(fs).items():  # pixel baselines: same probes on their own stores
        stale = stale_shards(fs, bfs, [datasets[t] for t in tasks])
        if stale:
            context.log.warning(f"{name}: not scored: shards {stale} are missing or were extracted from other "
                                f"manifests than the raw store's (materialise pixel_baseline_latents)")
            continue
        feats = load_feature_sets(bfs, tasks, "raw", datasets=datasets)
        b = evaluate_feature_set(feats, name, None, which=tasks, datasets=datasets, probe_kwargs=kw,
                                 attributes=attrs, log=log)
        baseline_rows[name] = b
        rows += list(b) + derived_rows(raw_rows, b)
    paths = write_metric_rows(fs, rows) if rows else []
    md = {"aam_version": version, "rows": len(rows), "paths": dg.MetadataValue.json([str(p) for p in paths]),
          "skipped": dg.MetadataValue.json({**raw_rows.skipped, **{f"{SPLAVU}:{k}": v for k, v in anon_rows.skipped.items()}})}
    for r in rows:  # flat floats: Dagster plots them across materialisations
        md[f"{r['feature_set']}/{r['task']}/{r['metric']}"] = dg.MetadataValue.float(float(r["value"]))
    others = {SPLAVU: anon_rows, **baseline_rows}
    table = ["| task | metric | raw | " + " | ".join(others) + " |", "|---|---|---:|" + "---:|" * len(others)]
    for r in raw_rows:
        vals = [metric_value(o, r["task"], r["metric"]) for o in others.values()]
        table.append(f"| {r['task']} | {r['metric']} | {r['value']:.4f} | "
                     + " | ".join("—" if a is None else f"{a:.4f}" for a in vals) + " |")
    for r in extra:
        table.append(f"| {r['task']} | {r['metric']} | | {r['value']:.4f} |")
    md["table"] = dg.MetadataValue.md("\n".join(table))
    return dg.MaterializeResult(metadata=md)


_EVAL = dict(deps=[ANONYMIZED, CLIP_LATENTS], group_name=GROUP, kinds={"pytorch", "parquet"})


@dg.asset(**_EVAL, description="AR: linear head on frozen features, top-1 (softmax over 5 clips); raw vs splavu.")
def action_recognition_eval(context: dg.AssetExecutionContext, config: EvalConfig, store: StoreResource):
    return evaluate_tasks(context, store, config, ("ar",))


@dg.asset(**_EVAL, description="TAD: detection head on per-video clip sequences, mAP over tIoU 0.3:0.1:0.7.")
def temporal_detection_eval(context: dg.AssetExecutionContext, config: EvalConfig, store: StoreResource):
    return evaluate_tasks(context, store, config, ("tad",))


@dg.asset(**_EVAL, description="AD: weakly supervised MIL head, frame-level ROC AUC.")
def anomaly_detection_eval(context: dg.AssetExecutionContext, config: EvalConfig, store: StoreResource):
    return evaluate_tasks(context, store, config, ("ad",))


@dg.asset(**_EVAL, description="Fresh MLP attackers (as given + standardised, the stronger reported): cMAP, F1, "
                               "chance, share of above-chance leakage removed; on the privacy close-ups and on the "
                               "action clips the product publishes (train actors -> test actors).")
def privacy_attack_eval(context: dg.AssetExecutionContext, config: EvalConfig, store: StoreResource):
    return evaluate_tasks(context, store, config, ("privacy", "clip_privacy"))


@dg.asset(**_EVAL, description="Bias (NTU-Bias-F/M style): per-group accuracy on a balanced test and the gap.")
def bias_eval(context: dg.AssetExecutionContext, config: EvalConfig, store: StoreResource):
    return evaluate_tasks(context, store, config, ("bias_f", "bias_m"))


@dg.asset(**_EVAL, description="Gait: top-1 retrieval of the same subject across walks (no training).")
def gait_eval(context: dg.AssetExecutionContext, config: EvalConfig, store: StoreResource):
    return evaluate_tasks(context, store, config, ("gait",))


EVAL_ASSETS = [action_recognition_eval, temporal_detection_eval, anomaly_detection_eval, privacy_attack_eval,
               bias_eval, gait_eval]


class ReportConfig(dg.Config):
    aam_version: str = Field(default="", description="AAM version reported (default: the current one)")


def png_markdown(png: bytes, alt: str = "trade-off") -> str:
    return f"![{alt}](data:image/png;base64,{base64.b64encode(png).decode()})"


@dg.asset(deps=EVAL_ASSETS, group_name=GROUP, kinds={"json", "markdown"},
          description="The paper's Table 1 on this store: raw vs splavu, relative change, leakage removed, "
                      "and the privacy-utility trade-off plot.")
def privacy_utility_report(context: dg.AssetExecutionContext, config: ReportConfig, store: StoreResource):
    fs = store.store()
    version = _version(fs, config.aam_version)
    raw_rows, anon_rows = read_metric_rows(fs, RAW, None), read_metric_rows(fs, SPLAVU, version)
    if not raw_rows or not anon_rows:
        raise dg.Failure(f"no metric rows for {'raw' if not raw_rows else 'splavu ' + version} in {fs.loc('metrics')}: "
                         f"materialise the *_eval assets first")
    baselines = existing_baselines(fs)
    variants = {SPLAVU: anon_rows}
    for name in baselines:
        b = read_metric_rows(fs, name, None)
        if b:
            variants[name] = b
        else:
            context.log.warning(f"{name}: its store has latents but no metric rows: materialise the *_eval assets")
    report = build_report(fs.encoder_fingerprint(), version, raw_rows, variants)
    report["costs"] = costs.compare(fs, version, eval_shards(fs, task_datasets(fs).values()),
                                    {n: baselines[n] for n in variants if n in baselines})
    paths = write_privacy_utility_report(fs, report)
    png = paths["png"].read_bytes()
    splavu = report["rows"][1]
    md = {"aam_version": version, "path": dg.MetadataValue.path(str(paths["json"])),
          "markdown_path": dg.MetadataValue.path(str(paths["md"])), "png_path": dg.MetadataValue.path(str(paths["png"])),
          "report": dg.MetadataValue.json(report),
          "table": dg.MetadataValue.md(report_markdown(report)), "tradeoff": dg.MetadataValue.md(png_markdown(png))}
    for k in ("privacy_cmap", "leakage_removed", *UTILITY_KEYS):
        if splavu.get(k) is not None:
            md[f"splavu/{k}"] = dg.MetadataValue.float(float(splavu[k]))  # charted across versions (Plots tab)
    return dg.MaterializeResult(metadata=md)


# ---------------------------------------------------------------- gates

class PrivacyBudgetConfig(dg.Config):
    threshold: float | None = Field(default=None, description=f"share of above-chance leakage that must be removed "
                                    f"(default ${PRIVACY_BUDGET_ENV} or {DEFAULT_PRIVACY_BUDGET})")
    aam_version: str = Field(default="", description="version to gate (default: the newest recorded, else current)")
    dataset: str = Field(default="", description="default: the dataset registered with role privacy")
    clip_dataset: str = Field(default="", description="action clips also attacked (train actors -> test actors) when "
                              "they carry attr_* labels; the gate takes the weaker removal. Default: the AR dataset; "
                              "'none' = close-ups only")
    epochs: int = 100

    def resolved_threshold(self) -> float:
        if self.threshold is not None:
            return float(self.threshold)
        return float(os.environ.get(PRIVACY_BUDGET_ENV, DEFAULT_PRIVACY_BUDGET))


def published_version(context) -> str | None:
    """The AAM version anonymized_features just materialised, from its metadata ('aam_version' or 'version')."""
    try:
        event = context.instance.get_latest_materialization_event(ANONYMIZED)
        md = event.asset_materialization.metadata if event and event.asset_materialization else {}
    except Exception:  # no instance history: fall back to the store's newest version
        return None
    for key in ("aam_version", "version"):
        if key in md and isinstance(md[key].value, str) and md[key].value:
            return md[key].value
    return None


@dg.asset_check(asset=ANONYMIZED, blocking=True,
                description="Blocks publication unless the anonymized features of the version being published remove "
                            "at least the budgeted share of above-chance privacy leakage, (raw − anon) / (raw − chance), "
                            "against the stronger of the raw and standardised attackers.")
def privacy_budget(context: dg.AssetCheckExecutionContext, config: PrivacyBudgetConfig,
                   store: StoreResource) -> dg.AssetCheckResult:
    fs = store.store()
    threshold = config.resolved_threshold()
    version = config.aam_version or published_version(context) or newest_version(fs)
    if not version:
        return dg.AssetCheckResult(passed=False, severity=dg.AssetCheckSeverity.ERROR,
                                   description=f"no AAM version recorded in {fs.root}", metadata={"threshold": threshold})
    try:
        roles = task_datasets(fs)
        clips = None if config.clip_dataset == "none" else config.clip_dataset or roles["clip_privacy"]
        m = privacy_budget_measure(fs, version, dataset=config.dataset or roles["privacy"],
                                   probe_kwargs={"epochs": config.epochs}, clip_dataset=clips)
    except Exception as e:  # cannot measure -> cannot vouch for the table: fail closed
        return dg.AssetCheckResult(passed=False, severity=dg.AssetCheckSeverity.ERROR,
                                   description=f"leakage of version {version} could not be measured: {e}",
                                   metadata={"aam_version": version, "threshold": threshold, "error": str(e)})
    passed, why = budget_verdict(m, threshold)
    context.log.info(f"privacy_budget {version}: {why}")
    md = {"aam_version": version, "threshold": threshold, "raw_cmap": m["raw_cmap"],
          "anonymized_cmap": m["anonymized_cmap"], "chance_cmap": m["chance_cmap"],
          "leakage_removed": m["leakage_removed"] if m["leakage_removed"] is not None else float("nan"),
          "features": m["source"], "cached": m["cached"], "attributes": dg.MetadataValue.json(m["attributes"]),
          "weaker": m["weaker"]}
    for name, key in (("closeups", "closeup_leakage_removed"), ("clips", "clip_leakage_removed")):
        part = m[name]
        if "skipped" in part:
            md[f"{name}_skipped"] = part["skipped"]
        elif part["leakage_removed"] is not None:
            md[key] = part["leakage_removed"]
    return dg.AssetCheckResult(passed=passed, severity=dg.AssetCheckSeverity.ERROR, description=why, metadata=md)


class UtilityRetentionConfig(dg.Config):
    fraction: float | None = Field(default=None, description=f"each utility metric of splavu must be >= fraction x raw "
                                   f"(default ${UTILITY_RETENTION_ENV} or {DEFAULT_UTILITY_RETENTION})")

    def resolved_fraction(self) -> float:
        if self.fraction is not None:
            return float(self.fraction)
        return float(os.environ.get(UTILITY_RETENTION_ENV, DEFAULT_UTILITY_RETENTION))


def retention_verdict(report: dict, fraction: float, name: str = SPLAVU) -> tuple[bool, dict, list[str]]:
    """(passed, retention per utility metric, failures) of the row `name` against the raw row."""
    rows = {r["name"]: r for r in report["rows"]}
    if RAW not in rows or name not in rows:
        return False, {}, [f"report has no {RAW!r} and {name!r} rows"]
    ret = retention_per_metric(rows[RAW], rows[name])
    fails = [f"{k}: {v:.3f} of raw < {fraction:g}" for k, v in ret.items() if v is not None and v < fraction]
    return not fails, ret, fails


@dg.asset_check(asset=privacy_utility_report, blocking=False,
                description="Warns when AR top-1, TAD mAP or AD AUC of the anonymized features falls below the "
                            "configured fraction of raw.")
def utility_retention(context: dg.AssetCheckExecutionContext, config: UtilityRetentionConfig,
                      store: StoreResource) -> dg.AssetCheckResult:
    fraction = config.resolved_fraction()
    report = read_report(store.store())
    passed, ret, fails = retention_verdict(report, fraction)
    md = {"fraction": fraction, "aam_version": report["aam_version"],
          **{f"{k}_retention": (v if v is not None else float("nan")) for k, v in ret.items()}}
    return dg.AssetCheckResult(passed=passed, severity=dg.AssetCheckSeverity.WARN, metadata=md,
                               description="all utility metrics retained" if passed else "; ".join(fails))


ASSETS = [*EVAL_ASSETS, privacy_utility_report]
CHECKS = [privacy_budget, utility_retention]
