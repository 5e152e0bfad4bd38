"""The keep family's operating point: which width k this store's validation videos allow.

    keep_family_curve          every width of the keep family fitted from the cached latents and scored on the
                               validation splits (5 probe seeds + bootstrap) -> <root>/reports/keep_family.{json,png};
                               the current version is marked; aam_model attaches the curve to its next materialisation
    keep_width_matches_curve   WARN check: the current version publishes the width the curve picks (the largest k
                               that passes both gates' rules); otherwise it says which k to train

The choice stays advice, not an automatic step of training: it reads private-attribute labels (the attackers), and
the adapter must never depend on them (the label-flip test). A data engineer sets `{"keep": k}` and retrains.
"""
import dagster as dg
from pydantic import Field

from assets.resources import StoreResource
from splavu_core.aam.io import stored_config
from splavu_core.evaluation.keep_curve import DEFAULT_KS, curve_markdown, keep_curve, why_no_width
from splavu_core.evaluation.report import png_markdown
from splavu_core.store.feature_store import FeatureStore
from splavu_core.store.ledger import current_version

GROUP = "operating_point"


class KeepCurveConfig(dg.Config):
    ks: list[int] = Field(default=list(DEFAULT_KS), description="widths k of the keep family to fit and score "
                                                                "(each below the latents' dimension)")
    n_seeds: int = Field(default=5, description="probe seeds per metric (the intervals need >= 5)")
    mark_current: bool = Field(default=True, description="score the current AAM version beside the family")
    reuse_gates: bool = Field(default=False, description="take raw's scores, and those of the member that publishes "
                              "the current version's vectors, from the gates' measurement of that version made in the "
                              "same process (`splavu demo`), instead of scoring them again; scores all when there is "
                              "none")


def published_k(store: FeatureStore, version: str | None) -> int | None:
    """The width a version publishes: its keep stage's k; None for a version without one (or none at all)."""
    config = stored_config(store, version)
    return (config.keep or None) if config is not None else None


@dg.asset(deps=[dg.AssetKey("clip_latents"), dg.AssetKey("static_latents"), dg.AssetKey("anonymized_features")],
          group_name=GROUP, kinds={"pytorch", "json"},
          description="The keep family's privacy-utility curve on validation videos and the width k both gates' "
                      "rules pick (the largest that passes); the current version marked.")
def keep_family_curve(context: dg.AssetExecutionContext, config: KeepCurveConfig, store: StoreResource):
    feature_store = store.store()
    current = current_version(feature_store)
    out, png = keep_curve(feature_store, config.ks, range(config.n_seeds),
                          versions=[current] if config.mark_current and current else [], log=context.log.info,
                          reuse_gates_of=current if config.reuse_gates else None)
    return dg.MaterializeResult(metadata={
        "chosen_k": out["chosen_k"] or 0, "current_version": current or "", "current_k": published_k(feature_store, current) or 0,
        "budget": out["budget"], "floor": out["floor"], "seconds": out["seconds"],
        "table": dg.MetadataValue.md(curve_markdown(out)),
        "curve": dg.MetadataValue.md(png_markdown(png, "keep family")),
        "path": dg.MetadataValue.path(str(feature_store.loc("reports", "keep_family.json")))})


@dg.asset_check(asset=keep_family_curve, blocking=False,
                description="Warns when the current version publishes another width than the one this store's "
                            "validation curve picks, or when no width passes the privacy budget there.")
def keep_width_matches_curve(context: dg.AssetCheckExecutionContext, store: StoreResource) -> dg.AssetCheckResult:
    feature_store = store.store()
    out = feature_store.files.read_json("reports/keep_family.json")
    current = current_version(feature_store)
    chosen, k = out.get("chosen_k"), published_k(feature_store, current)
    md = {"chosen_k": chosen or 0, "current_k": k or 0, "current_version": current or ""}
    if not chosen:
        why = why_no_width(out)
    elif k is None:
        why = (f"the curve picks k = {chosen}; " + (f"the current version {current} has no keep stage" if current
                                                   else "no version is current") + f": train with {{\"keep\": {chosen}}}")
    elif k != chosen:
        why = (f"the current version {current} publishes k = {k}; this store's validation curve picks k = {chosen}: "
               f"retrain with {{\"keep\": {chosen}}} (splavu train --config)")
    else:
        return dg.AssetCheckResult(passed=True, description=f"the current version publishes k = {k}, the curve's "
                                   f"choice", metadata=md)
    return dg.AssetCheckResult(passed=False, severity=dg.AssetCheckSeverity.WARN, description=why, metadata=md)


keep_curve_job = dg.define_asset_job(
    "keep_curve", selection=dg.AssetSelection.assets(keep_family_curve),
    description="Fit and score the keep family on validation videos; the check says which width k to train.")

ASSETS = [keep_family_curve]
CHECKS = [keep_width_matches_curve]
