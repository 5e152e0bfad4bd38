"""Evaluation assets (raw latents vs the current anonymized table), the report, and the two gates.

    action_recognition_eval, temporal_detection_eval, anomaly_detection_eval, privacy_attack_eval,
    bias_eval, gait_eval      metric rows for feature sets 'raw', 'splavu' and every pixel baseline store
                              (<root>/baselines/pixel_*) -> <root>/metrics/*.parquet
    privacy_utility_report    <root>/reports/privacy_utility.{json,md,png}: one row per feature set and the
                              cost of each approach (splavu_core.store.costs), attached to the materialisation
    privacy_budget            BLOCKING check on anonymized_features: share of above-chance leakage removed
    utility_retention         WARN check on privacy_utility_report: the utility gate's rule (ledger.utility_fraction)
                              on the report's test split, for every task, seen or not

Upstream assets are referred to by key only (anonymized_features, clip_latents), so this module
imports none of their code. Every head is trained fresh on the features it scores.
"""


import dagster as dg
from pydantic import Field

from assets.resources import StoreResource
from splavu_core.aam.io import published_width
from splavu_core.evaluation import trivial, unseen
from splavu_core.evaluation.gates import evaluate_gates, privacy_measure_view, seen_tasks
from splavu_core.evaluation.report import png_markdown, read_report, report_markdown, write_privacy_utility_report
from splavu_core.evaluation.scoring import score_sets
from splavu_core.evaluation.suite import (
    DEFAULT_DATASETS,
    RAW,
    UTILITY_KEYS,
    build_report,
    load_feature_sets,
    read_metric_rows,
    write_metric_rows,
)
from splavu_core.extract.pixel_baselines import eval_shards, existing_baselines, stale_shards
from splavu_core.ingest.datasets import task_datasets
from splavu_core.settings import DEFAULT_PRIVACY_BUDGET, DEFAULT_UTILITY_GATE
from splavu_core.store import costs
from splavu_core.store.ledger import (
    current_version,
    newest_version,
    privacy_threshold,
    record_verdict,
    retention_kept,
    utility_fraction,
)

ANONYMIZED = dg.AssetKey("anonymized_features")
CLIP_LATENTS = dg.AssetKey("clip_latents")
SPLAVU = "splavu"
GROUP = "evaluation"


class ProbeSettings(dg.Config):
    """Which dataset serves each task and how long each fresh probe trains (protocols and defaults:
    docs/evaluation.md, "The paper's protocols, and where splavu's differ")."""

    # "" = the dataset registered with that role (splavu_core.ingest.datasets; the demo's names by default)
    ar_dataset: str = ""
    tad_dataset: str = ""
    ad_dataset: str = ""
    privacy_dataset: str = ""
    clip_privacy_dataset: str = ""  # action clips attacked (needs attr_* labels); "" = the AR dataset
    reid_dataset: str = ""          # videos linked across actions (needs subject_id); "" = the clip-privacy dataset
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
        """The attacker's epochs (the AR / AD / TAD probes are convex and fitted to convergence by L-BFGS, so
        ar_epochs / tad_epochs / ad_epochs no longer apply; kept so that old run configs still validate)."""
        return {"privacy": {"epochs": self.privacy_epochs}}


class EvalConfig(ProbeSettings):
    """Which features to score; datasets and probe lengths come from ProbeSettings."""

    aam_version: str = Field(default="", description="AAM version of the 'splavu' set (default: the current one)")
    seed: int = Field(default=0, description="base probe seed: probes use seeds seed .. seed+n_seeds-1")
    n_seeds: int = Field(default=5, description="probe seeds per metric (>= 5 for the report's intervals)")


def _version(store, requested: str) -> str:
    version = requested or current_version(store)
    if not version:
        raise dg.Failure(f"no current AAM version in {store.root}: publish anonymized_features first "
                         f"(or set aam_version in the config)")
    return version


def evaluate_tasks(context, store: StoreResource, config: EvalConfig, tasks: tuple[str, ...]) -> dg.MaterializeResult:
    """Score `tasks` on raw, on the anonymized features of the (current) version and on every pixel baseline, with
    n_seeds probe seeds (config.seed, +1, ...) and a bootstrap over the test videos; paired changes against raw.
    Writes the metric rows (value, sd, ci_low, ci_high, chance, n_seeds)."""
    feature_store = store.store()
    version = _version(feature_store, config.aam_version)
    datasets, kw = config.datasets(feature_store), config.probe_kwargs()
    seeds = list(range(config.seed, config.seed + config.n_seeds))
    sets = {RAW: load_feature_sets(feature_store, tasks, "raw", datasets=datasets),
            SPLAVU: load_feature_sets(feature_store, tasks, "anonymized", version=version, datasets=datasets)}
    width = _width(sets[SPLAVU])
    # a projection to the published width, label-free: what narrowness alone removes (privacy and AR; TAD's
    # bootstrap would double the evaluation's cost for a row nobody gates on)
    if width and width < (_width(sets[RAW]) or 0) and set(tasks) & set(trivial.SCORED_TASKS):
        fit_on = load_feature_sets(feature_store, trivial.TRAINING_TASKS, "raw", datasets=datasets)
        sets.update(trivial.baseline_sets(sets[RAW], trivial.training_clips(fit_on, datasets), width))
    # pixel baselines: same probes on their own stores
    for name, baseline_store in existing_baselines(feature_store).items():
        stale = stale_shards(feature_store, baseline_store, [datasets[t] for t in tasks])
        if stale:
            context.log.warning(f"{name}: not scored: shards {stale} are missing or were extracted from other "
                                f"manifests than the raw store's (materialise pixel_baseline_latents)")
            continue
        sets[name] = load_feature_sets(baseline_store, tasks, "raw", datasets=datasets)
    res = score_sets(sets, tasks, datasets, split="test", seeds=seeds, probe_kwargs=kw,
                     versions={SPLAVU: version}, log=context.log.info, store=feature_store)
    rows = list(res)
    paths = write_metric_rows(feature_store, rows) if rows else []
    md = {"aam_version": version, "rows": len(rows), "seeds": dg.MetadataValue.json(seeds),
          "paths": dg.MetadataValue.json([str(p) for p in paths]), "skipped": dg.MetadataValue.json(res.skipped)}
    for r in rows:  # flat floats: Dagster plots them across materialisations
        md[f"{r['feature_set']}/{r['task']}/{r['metric']}"] = dg.MetadataValue.float(float(r["value"]))
    others = [n for n in sets if n != RAW]
    table = ["| task | metric | chance | raw | " + " | ".join(others) + " |", "|---|---|---:|---:|" + "---:|" * len(others)]
    by = {(r["feature_set"], r["task"], r["metric"]): r for r in rows}
    fmt = lambda r: "—" if r is None else f"{r['value']:.4f} [{r['ci_low']:.4f}, {r['ci_high']:.4f}]"  # noqa: E731
    for r in rows:
        if r["feature_set"] != RAW:
            continue
        ch = "—" if r["chance"] is None else f"{r['chance']:.4f}"
        table.append(f"| {r['task']} | {r['metric']} | {ch} | {fmt(r)} | "
                     + " | ".join(fmt(by.get((o, r["task"], r["metric"]))) for o in others) + " |")
    md["table"] = dg.MetadataValue.md("\n".join(table))
    return dg.MaterializeResult(metadata=md)


def _width(feature_sets: dict) -> int | None:
    for videos in feature_sets.values():
        for v in videos:
            return v.dim
    return None


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


@dg.asset(**_EVAL, description="The attacker suite (fixed capacity: MLP 512, linear, gradient boosting, k-NN; the "
                               "previous width-following MLP for the record), each fresh: cMAP of each and of the "
                               "strongest, chance, share of above-chance leakage removed; on the privacy close-ups and "
                               "on the action clips the product publishes (train actors -> test actors); and "
                               "re-identification of test actors across actions (rank-1, mAP, linkage removed).")
def privacy_attack_eval(context: dg.AssetExecutionContext, config: EvalConfig, store: StoreResource):
    return evaluate_tasks(context, store, config, ("privacy", "clip_privacy", "reid"))


@dg.asset(**_EVAL, description="Bias (NTU-Bias-F/M style): per-group accuracy on a balanced test and the gap.")
def bias_eval(context: dg.AssetExecutionContext, config: EvalConfig, store: StoreResource):
    return evaluate_tasks(context, store, config, ("bias_f", "bias_m"))


@dg.asset(**_EVAL, description="Gait: top-1 retrieval of the same subject across walks (no training).")
def gait_eval(context: dg.AssetExecutionContext, config: EvalConfig, store: StoreResource):
    return evaluate_tasks(context, store, config, ("gait",))


@dg.asset(**_EVAL, description="Tasks nobody fitted for: each utility task (AR, TAD, AD) read by its reader suite "
                               "after refitting the version's configuration WITHOUT that task's labels (leave-one-task-"
                               "out), beside keep alone and the same-width PCA; and AR on action classes the fit never "
                               "saw (3 held-out folds). Closed-form fits in memory, test split -> reports/unseen.json.")
def unseen_tasks_eval(context: dg.AssetExecutionContext, config: EvalConfig, store: StoreResource):
    feature_store = store.store()
    version = _version(feature_store, config.aam_version)
    seeds = list(range(config.seed, config.seed + config.n_seeds))
    out = unseen.evaluate(feature_store, version, seeds=seeds, log=context.log.info)
    paths = write_metric_rows(feature_store, out["rows"]) if out["rows"] else []
    md = {"aam_version": version, "rows": len(out["rows"]), "path": dg.MetadataValue.path(str(out["path"])),
          "metrics_paths": dg.MetadataValue.json([str(p) for p in paths]),
          "unseen": dg.MetadataValue.json(out["summary"]), "table": dg.MetadataValue.md(unseen.markdown(out["summary"]))}
    for member, tasks in out["summary"]["loto"].items():
        for task, st in tasks.items():  # charted across versions (Plots tab)
            md[f"{member}/{task}/unseen_retention"] = dg.MetadataValue.float(float(st["value"]))
    return dg.MaterializeResult(metadata=md)


EVAL_ASSETS = [action_recognition_eval, temporal_detection_eval, anomaly_detection_eval, privacy_attack_eval,
               bias_eval, gait_eval, unseen_tasks_eval]


class ReportConfig(dg.Config):
    aam_version: str = Field(default="", description="AAM version reported (default: the current one)")
    seed: int = Field(default=0, description="the base probe seed the *_eval assets used (recorded in the report)")
    n_seeds: int = 5


@dg.asset(deps=EVAL_ASSETS, group_name=GROUP, kinds={"json", "markdown"},
          description="The paper's Table 1 on this store: raw vs splavu, relative change, leakage removed, "
                      "and the privacy-utility trade-off plot.")
def privacy_utility_report(context: dg.AssetExecutionContext, config: ReportConfig, store: StoreResource):
    feature_store = store.store()
    version = _version(feature_store, config.aam_version)
    raw_rows, anon_rows = read_metric_rows(feature_store, RAW, None), read_metric_rows(feature_store, SPLAVU, version)
    if not raw_rows or not anon_rows:
        raise dg.Failure(f"no metric rows for {'raw' if not raw_rows else 'splavu ' + version} in {feature_store.loc('metrics')}: "
                         f"materialise the *_eval assets first")
    baselines = existing_baselines(feature_store)
    variants = {SPLAVU: anon_rows}
    width = published_width(feature_store, version)
    for name in trivial.names(width) if width else []:
        rows = read_metric_rows(feature_store, name, None)
        if rows:
            variants[name] = rows
    for name in baselines:
        b = read_metric_rows(feature_store, name, None)
        if b:
            variants[name] = b
        else:
            context.log.warning(f"{name}: its store has latents but no metric rows: materialise the *_eval assets")
    report = build_report(feature_store.encoder_fingerprint(), version, raw_rows, variants)
    if feature_store.files.isfile(unseen.REPORT):
        u = feature_store.files.read_json(unseen.REPORT)
        if u.get("version") == version:
            report["unseen"] = u
    from splavu_core.store.ledger import current_version as _current

    report["aam_version_is_current"] = version == _current(feature_store)
    report["probe_seeds"] = list(range(config.seed, config.seed + config.n_seeds))
    shards = eval_shards(feature_store, task_datasets(feature_store).values())
    report["costs"] = costs.compare(feature_store, version, shards, {n: baselines[n] for n in variants if n in baselines})
    report.update(costs.provenance())  # the results page names the commit and machine the numbers came from
    paths = write_privacy_utility_report(feature_store, report)
    png = paths["png"].read_bytes()
    splavu = report["rows"][1]
    md = {"aam_version": version, "path": dg.MetadataValue.path(str(paths["json"])),
          "markdown_path": dg.MetadataValue.path(str(paths["md"])), "png_path": dg.MetadataValue.path(str(paths["png"])),
          "report": dg.MetadataValue.json(report),
          "table": dg.MetadataValue.md(report_markdown(report)), "tradeoff": dg.MetadataValue.md(png_markdown(png))}
    for k in ("privacy_cmap", "leakage_removed", "clip_leakage_removed", "reid_rank1", "linkage_removed",
              *UTILITY_KEYS):
        if splavu.get(k) is not None:
            md[f"splavu/{k}"] = dg.MetadataValue.float(float(splavu[k]))  # charted across versions (Plots tab)
    return dg.MaterializeResult(metadata=md)


# ---------------------------------------------------------------- gates

class GateConfig(dg.Config):
    """Shared by the two blocking gates; both read the same cached validation measurement (splavu_core.evaluation.gates)."""

    aam_version: str = Field(default="", description="version to gate (default: the one anonymized_features just "
                             "published, else the newest recorded)")
    dataset: str = Field(default="", description="privacy close-ups (default: the dataset registered with role privacy)")
    clip_dataset: str = Field(default="", description="action clips also attacked (default: the AR dataset; 'none' = "
                              "close-ups only); the gate takes the weaker removal")
    epochs: int = Field(default=0, description="privacy attacker epochs (0: the protocol's default, 100)")
    seed: int = Field(default=0, description="base probe seed (seeds seed .. seed+4)")

    def gate_kwargs(self) -> dict:
        kw = {"base_seed": self.seed, "datasets": {"privacy": self.dataset, "clip_privacy": self.clip_dataset}}
        if self.epochs:
            kw["probe_kwargs"] = {"privacy": {"epochs": self.epochs}}
        return kw


class PrivacyBudgetConfig(GateConfig):
    threshold: float | None = Field(default=None, description=f"share of above-chance leakage that must be removed, "
                                    f"on the lower end of its 95% interval (default $SPLAVU_PRIVACY_BUDGET or "
                                    f"{DEFAULT_PRIVACY_BUDGET})")

    def resolved_threshold(self) -> float:
        return privacy_threshold(self.threshold)


class UtilityBudgetConfig(GateConfig):
    fraction: float | None = Field(default=None, description=f"share of the raw features' above-chance utility every "
                                   f"seen task must keep (fails when the upper end of its 95% interval is below; "
                                   f"default $SPLAVU_UTILITY_GATE or {DEFAULT_UTILITY_GATE}; <= 0: off)")


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


def _gate(context, config: GateConfig, store: StoreResource, gate: str, **thresholds):
    """Evaluate both gates (cached measurement), record `gate`'s verdict in the ledger; (version, passed, why, out)."""
    feature_store = store.store()
    version = config.aam_version or published_version(context) or newest_version(feature_store)
    if not version:
        return None, False, f"no AAM version recorded in {feature_store.root}", None
    out = evaluate_gates(feature_store, version, record=False, **thresholds, **config.gate_kwargs())
    passed, why = out[gate]
    record_verdict(feature_store, version, gate, passed, why, split="val", **thresholds)
    context.log.info(f"{gate} gate on {version} (validation splits): {'passed' if passed else 'FAILED'}: {why}")
    return version, passed, why, out


@dg.asset_check(asset=ANONYMIZED, blocking=True,
                description="Blocks publication unless the version removes at least the budgeted share of above-chance "
                            "privacy leakage, (raw − anon) / (raw − chance), on the LOWER end of its 95% interval "
                            "(5 probe seeds + bootstrap), on the validation splits of the close-ups and of the action "
                            "clips, against the strongest attacker of the fixed-capacity suite (MLP 512, linear, "
                            "gradient boosting, k-NN), and the same share of re-identification linkage (rank-1 across "
                            "actions) removed.")
def privacy_budget(context: dg.AssetCheckExecutionContext, config: PrivacyBudgetConfig,
                   store: StoreResource) -> dg.AssetCheckResult:
    threshold = config.resolved_threshold()
    version, passed, why, out = _gate(context, config, store, "privacy", privacy_threshold=threshold)
    md = {"aam_version": version or "", "threshold": threshold, "split": "val"}
    m = (out or {}).get("measure")
    if m:
        view = privacy_measure_view(m)
        md.update({"raw_cmap": view["raw_cmap"], "anonymized_cmap": view["anonymized_cmap"],
                   "chance_cmap": view["chance_cmap"], "weaker": view["weaker"], "cached": m["cached"],
                   "features": ",".join(sorted(set(m["source"].values()))),
                   "leakage_removed": view["leakage_removed"] if view["leakage_removed"] is not None else float("nan"),
                   "leakage_removed_ci_low": (view["leakage_removed_ci_low"]
                                              if view["leakage_removed_ci_low"] is not None else float("nan")),
                   "seeds": dg.MetadataValue.json(m["seeds"])})
        for name, key in (("closeups", "closeup_leakage_removed"), ("clips", "clip_leakage_removed"),
                          ("linking", "linkage_removed")):
            part = m["privacy"].get(name, {})
            if "skipped" in part:
                md[f"{name}_skipped"] = part["skipped"]
            elif part.get("leakage_removed") is not None:
                md[key] = part["leakage_removed"]
                md[f"{key}_ci_low"] = part["leakage_removed_ci_low"]
                md[f"{name}_strongest_attacker"] = str(part.get("strongest_anonymized"))
    return dg.AssetCheckResult(passed=passed, severity=dg.AssetCheckSeverity.ERROR, description=why, metadata=md)


@dg.asset_check(asset=ANONYMIZED, blocking=True,
                description="Blocks publication unless every task the AAM was trained with (AR / TAD / AD) keeps the "
                            "configured share of the raw features' above-chance utility on its validation split, noise "
                            "taken into account (fails when the upper end of the 95% interval is below the threshold, "
                            "or when the anonymized features are at chance).")
def utility_budget(context: dg.AssetCheckExecutionContext, config: UtilityBudgetConfig,
                   store: StoreResource) -> dg.AssetCheckResult:
    fraction = utility_fraction(config.fraction)
    version, passed, why, out = _gate(context, config, store, "utility", utility_fraction=fraction)
    md = {"aam_version": version or "", "fraction": fraction, "split": "val"}
    m = (out or {}).get("measure")
    if m:
        md["seen_tasks"] = dg.MetadataValue.json(m["seen_tasks"])
        for task, u in m["utility"].items():
            if "skipped" in u:
                md[f"{task}_skipped"] = u["skipped"]
                continue
            md[f"{task}_raw"], md[f"{task}_anonymized"], md[f"{task}_chance"] = u["raw"], u["anon"], u["chance"]
            md[f"{task}_retention"] = u["retention"]
            md[f"{task}_retention_ci_low"] = u["retention_ci_low"]
            md[f"{task}_retention_ci_high"] = u["retention_ci_high"]
            md[f"{task}_reader"] = str(u.get("reader") or "")  # raw's strongest reader: the judge
    return dg.AssetCheckResult(passed=passed, severity=dg.AssetCheckSeverity.ERROR, description=why, metadata=md)


class UtilityRetentionConfig(dg.Config):
    fraction: float | None = Field(default=None, description=f"share of raw's above-chance utility each task must keep, "
                                   f"at the upper end of its interval (default: the utility gate's, $SPLAVU_UTILITY_GATE "
                                   f"or {DEFAULT_UTILITY_GATE})")


RETENTION_OF = {"ar_top1": "ar_retention", "tad_map": "tad_retention", "ad_auc": "ad_retention"}


def retention_verdict(report: dict, fraction: float, name: str = SPLAVU,
                      seen: list[str] | None = None) -> tuple[bool, dict, list[str]]:
    """(passed, retention per utility metric, failures) of the row `name` against the raw row, by the utility
    gate's rule: the share of raw's above-chance utility kept fails only when its interval's upper end is below
    `fraction` with its interval's upper end below 1 (ledger.retention_kept). A report scored without intervals falls
    back to the point share. seen: tasks marked in messages."""
    rows = {r["name"]: r for r in report["rows"]}
    if RAW not in rows or name not in rows:
        return False, {}, [f"report has no {RAW!r} and {name!r} rows"]
    raw, row = rows[RAW], rows[name]
    ret, fails = {}, []
    for key, rkey in RETENTION_OF.items():
        st = (row.get("derived_intervals") or {}).get(rkey)
        tag = "" if seen is None else (" (seen)" if key.split("_")[0] in seen else " (unseen)")
        if st is not None and st.get("value") is not None and st["value"] == st["value"]:
            ret[key] = st["value"]
            if not retention_kept(st["value"], st["ci_high"], fraction):
                fails.append(f"{key}{tag}: keeps {st['value']:.3f} [{st['ci_low']:.3f}, {st['ci_high']:.3f}] of raw's "
                             f"above-chance utility < {fraction:g}")
            continue
        chance = ((raw.get("intervals") or {}).get(key) or {}).get("chance") or 0.0
        r, a = raw.get(key), row.get(key)
        ret[key] = None if r is None or a is None or r <= chance else float((a - chance) / (r - chance))
        if ret[key] is not None and ret[key] < fraction:
            fails.append(f"{key}{tag}: keeps {ret[key]:.3f} of raw's above-chance utility < {fraction:g}")
    return not fails, ret, fails


@dg.asset_check(asset=privacy_utility_report, blocking=False,
                description="Warns when AR, TAD or AD of the anonymized features keeps less than the utility gate's "
                            "share of raw's above-chance utility on the report's test split (the upper end of the 95% "
                            "interval below it), for every task, seen in training or not.")
def utility_retention(context: dg.AssetCheckExecutionContext, config: UtilityRetentionConfig,
                      store: StoreResource) -> dg.AssetCheckResult:
    feature_store = store.store()
    fraction = utility_fraction(config.fraction)
    report = read_report(feature_store)
    seen = seen_tasks(feature_store, report["aam_version"]) if report.get("aam_version") else None
    passed, ret, fails = retention_verdict(report, fraction, seen=seen)
    md = {"fraction": fraction, "aam_version": report["aam_version"], "split": "test",
          "seen_tasks": dg.MetadataValue.json(seen),
          **{f"{k}_retention": (v if v is not None else float("nan")) for k, v in ret.items()}}
    return dg.AssetCheckResult(passed=passed, severity=dg.AssetCheckSeverity.WARN, metadata=md,
                               description="all utility metrics retained" if passed else "; ".join(fails))


ASSETS = [*EVAL_ASSETS, privacy_utility_report]
CHECKS = [privacy_budget, utility_budget, utility_retention]
GATE_CHECKS = [privacy_budget, utility_budget]
