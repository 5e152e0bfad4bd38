"""The publish rule's operating point on this store, without fitting a version (job `choose_operating_point`, `splavu curve`).

    operating_point            every candidate of the rule's family fitted from the cached latents and scored on the
                               store's SELECTION split; the rule's pick and why -> <root>/reports/operating_point.{json,png}
                               (splavu_core/evaluation/operating_point.py; aam_model runs the same rule before each fit)
    current_is_the_rules_pick  WARN check: the current version is the candidate the rule picks now (a refit after new
                               videos or an erasure may pick another)
"""
import dagster as dg

from assets.aam import AAMTrainingConfig, operating_point_metadata
from assets.resources import StoreResource
from splavu_core.aam.io import stored_extra
from splavu_core.aam.training_data import load_training_data
from splavu_core.evaluation.operating_point import choose
from splavu_core.ingest.datasets import training_plan
from splavu_core.store.ledger import current_version

GROUP = "operating_point"


@dg.asset(deps=[dg.AssetKey("clip_latents"), dg.AssetKey("static_latents")], group_name=GROUP,
          kinds={"pytorch", "json"},
          description="The publish rule on this store: every candidate of its family fitted from the cached latents and "
                      "scored on the selection split, the one it picks and why. aam_model runs the same rule.")
def operating_point(context: dg.AssetExecutionContext, config: AAMTrainingConfig, store: StoreResource):
    feature_store = store.store()
    plan = training_plan(feature_store, config.tasks, config.train_datasets(), config.selection)
    data = load_training_data(feature_store, plan.datasets["ar"], plan.datasets["tad"], plan.datasets["ad"])
    cfg = config.train_config().replace(tasks=plan.tasks, selection=plan.selection, operating_point="rule")
    _, record = choose(feature_store, data, cfg, log=context.log.info)
    return dg.MaterializeResult(metadata={
        **operating_point_metadata(record), "seconds": record.get("seconds", 0.0),
        "path": dg.MetadataValue.path(str(feature_store.loc("reports", "operating_point.json")))})


@dg.asset_check(asset=operating_point, blocking=False,
                description="Warns when the current version is not the candidate the publish rule picks on this store "
                            "now (the store changed since it was fitted: retrain, and the rule picks again).")
def current_is_the_rules_pick(context: dg.AssetCheckExecutionContext, store: StoreResource) -> dg.AssetCheckResult:
    feature_store = store.store()
    record = feature_store.files.read_json("reports/operating_point.json")
    current = current_version(feature_store)
    fitted = (stored_extra(feature_store, current).get("operating_point") or {}) if current else {}
    md = {"rules_pick": record.get("chosen") or "", "current_version": current or "",
          "current_candidate": fitted.get("chosen") or ""}
    if not current:
        return dg.AssetCheckResult(passed=False, severity=dg.AssetCheckSeverity.WARN, metadata=md,
                                   description=f"no version is current; the rule picks {record.get('chosen')}: "
                                               f"`splavu train` fits it, `splavu publish` gates it")
    if fitted.get("chosen") != record.get("chosen"):
        return dg.AssetCheckResult(passed=False, severity=dg.AssetCheckSeverity.WARN, metadata=md,
                                   description=f"the current version {current} is candidate "
                                               f"{fitted.get('chosen') or '(fitted as given)'}; on this store now the "
                                               f"rule picks {record.get('chosen')}: retrain (`splavu train`)")
    return dg.AssetCheckResult(passed=True, metadata=md, description=f"the current version {current} is the rule's "
                               f"pick, {record.get('chosen')}")


operating_point_job = dg.define_asset_job(
    "choose_operating_point", selection=dg.AssetSelection.assets(operating_point),
    description="Score the publish rule's candidates on the selection split and say which it picks (nothing is "
                "fitted or published; aam_model runs the same rule).")

ASSETS = [operating_point]
CHECKS = [current_is_the_rules_pick]
