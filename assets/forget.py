"""The forget workflow, one step with two assets: forget_request (the videos removed from every layer, checked, the
receipt) and forget_refit (when the current version was fitted on them: the same fit without them, published to
every shard through both gates, checked again, the receipt completed). splavu_core/forget.py does the work; this
module gives it the aam_model, anonymized_features and feature_catalog assets' own code to fit and publish with, and
reports what they did as those assets' materializations.

Launched two ways, with the same result: `splavu forget` opens the request itself (so the run config names only its
id) and launches the `forget` job; from the UI's Launchpad the config names the videos or subjects and a reason (the
run config, and so Dagster's run history in $DAGSTER_HOME, then holds those ids: delete the run to forget them too).
"""
import dagster as dg
from pydantic import Field

from assets.aam import AAMTrainingConfig, fit_adapter
from assets.anonymized import AnonymizeConfig, publish_shard, registered_shards
from assets.catalog import refresh_catalog
from assets.partitions import shards
from assets.resources import StoreResource
from splavu_core import forget as fg
from splavu_core.store.feature_store import StoreError
from splavu_core.store.ledger import current_version, read_verdicts


class ForgetConfig(dg.Config):
    request_id: str = Field(default="", description="an erasure request opened by `splavu forget` (its videos are "
                                                    "named in the store's journal, not here); or leave it empty and "
                                                    "name the videos or subjects below")
    videos: list[str] = Field(default=[], description="video ids to erase (kept in this run's config: Dagster's run "
                                                      "history then names them)")
    subjects: list[str] = Field(default=[], description="erase every video whose manifest row has one of these "
                                                        "subject_ids (kept in this run's config, as videos)")
    reason: str = Field(default="", description="why (required with videos / subjects; kept in the erasure log: do "
                                                "not name the person)")
    policy: str = Field(default="", description="what serves until the refit passes both gates: 'retire' (the "
                        "versions fitted on these videos, now) or 'serve_until_refit' (the current version, their rows "
                        "removed, retired once a version fitted without them is current); empty: "
                        "$SPLAVU_ERASURE_POLICY (default retire)")


FORGET_REQUEST = dg.AssetSpec(
    "forget_request", group_name="forget", kinds={"zarr", "parquet"},
    description="Removes the videos of one erasure request from every layer of the store (raw latents, anonymized "
                "tables, manifests, labels, caches, neighbour indexes, catalog), retires the AAM versions fitted on "
                "them, reads every file back to check, and appends the receipt to the erasure log. A killed run is "
                "completed by running it again.")
FORGET_REFIT = dg.AssetSpec(
    "forget_refit", deps=[FORGET_REQUEST], group_name="forget", kinds={"pytorch", "parquet"},
    description="When the current AAM version was fitted on the erased videos: the same fit on what is left "
                "(aam_model's code), published to every shard (anonymized_features': promoted only if both gates "
                "pass), the catalog rebuilt, every file read back again, the outcome appended to the receipt. "
                "Nothing to do otherwise.")


def _refit_steps(context, feature_store, events: list):
    """train(config) -> version and publish(version) for fg.refit, through the assets' own code; the materializations
    they amount to are appended to `events` (reported once the refit is done)."""

    def train(config: dict) -> str:
        md = fit_adapter(feature_store, AAMTrainingConfig(**config), log=context.log.info)
        events.append(dg.AssetMaterialization(asset_key="aam_model", metadata=md))
        return md["version"]

    def publish(version: str) -> dict:
        keys = [s for s in registered_shards(feature_store) if feature_store.committed(s)]
        known = set(context.instance.get_dynamic_partitions(shards.name))
        if missing := sorted(set(keys) - known):
            context.instance.add_dynamic_partitions(shards.name, missing)
        out = {}
        for key in keys:
            md = publish_shard(feature_store, key, AnonymizeConfig(aam_version=version), log=context.log.info)
            events.append(dg.AssetMaterialization(asset_key="anonymized_features", partition=key, metadata=md))
            out[key] = {k: md[k] for k in ("rows", "skipped", "promotion", "is_current", "current_version")}
        md = refresh_catalog(feature_store, context.instance, log=context.log.info)
        events.append(dg.AssetMaterialization(asset_key="feature_catalog", metadata=md))
        return out

    return train, publish


def _request_id(context, config: ForgetConfig, feature_store) -> str | None:
    if config.request_id:
        if config.videos or config.subjects:
            raise fg.ForgetError("configure either request_id (a request `splavu forget` opened) or videos / subjects")
        return config.request_id
    rid, found = fg.request_for(feature_store, config.videos, config.subjects, config.reason,
                                policy=config.policy or None)
    for v in found["already"]:
        context.log.info(f"video {v!r} was erased already (it has a tombstone)")
    if found["files"]:
        context.log.warning(f"the videos' own files are not touched; delete them yourself: {', '.join(found['files'])}")
    return rid


# the op is not named "forget": the `forget` job's graph has that name, and op / graph names share one namespace
A_VERSION_SERVES = dg.AssetCheckSpec(
    "a_version_serves", asset="forget_refit",
    description="Fails (ERROR) when the erasure left no version current: analysts read empty tables until a version "
                "passes both gates. Warns when the refit was refused and the version fitted on the erased videos "
                "serves, its erased rows removed (policy serve_until_refit).")


@dg.multi_asset(specs=[FORGET_REQUEST, FORGET_REFIT], check_specs=[A_VERSION_SERVES], name="forget_videos")
def forget_videos(context: dg.AssetExecutionContext, config: ForgetConfig, store: StoreResource):
    feature_store = store.store()
    try:
        rid = _request_id(context, config, feature_store)
        if rid is None:
            yield dg.MaterializeResult(asset_key="forget_request", metadata={"request_id": "", "videos": 0,
                                                                              "check": "nothing to erase"})
            yield dg.MaterializeResult(asset_key="forget_refit", metadata={"refit": "not needed"})
            yield serving_check(feature_store, {"needed": False})
            return
        events = []
        train, publish = _refit_steps(context, feature_store, events)
        for stage, out in fg.forget(feature_store, rid, train, publish, log=context.log.warning):
            if stage == "erased":
                if not out["check"]["clean"]:
                    raise dg.Failure(description=f"erasure request {rid}: {fg.check_line(out['check'])}")
                yield dg.MaterializeResult(asset_key="forget_request", metadata=erased_metadata(out))
            else:
                yield from events
                if out["needed"]:  # the gates the refit's publish ran, as anonymized_features' checks show them
                    for event in gate_evaluations(feature_store, out["version"]):
                        context.log_event(event)
                yield dg.MaterializeResult(asset_key="forget_refit", metadata=refit_metadata(feature_store, out, rid))
                yield serving_check(feature_store, out)
    except StoreError as e:  # one line for the CLI and the UI (fg.RefitError: the erasure itself stands)
        raise dg.Failure(description=str(e)) from e


def gate_evaluations(feature_store, version: str) -> list[dg.AssetCheckEvaluation]:
    """The refit's recorded gate verdicts as anonymized_features' privacy_budget / utility_budget evaluations, so the
    UI shows them where it shows every other publish's, not as "not evaluated"."""
    out = []
    for gate, check in (("privacy", "privacy_budget"), ("utility", "utility_budget")):
        v = read_verdicts(feature_store, version).get(gate)
        if v:
            out.append(dg.AssetCheckEvaluation(asset_key=dg.AssetKey("anonymized_features"), check_name=check,
                                               passed=bool(v["passed"]), severity=dg.AssetCheckSeverity.ERROR,
                                               description=v["why"], metadata={"aam_version": version,
                                                                               "split": "val"}))
    return out


def serving_check(feature_store, outcome: dict) -> dg.AssetCheckResult:
    """a_version_serves: what analysts are served now that the request is done."""
    current = current_version(feature_store)
    md = {"current_version": current or ""}
    if current is None:
        return dg.AssetCheckResult(check_name="a_version_serves", passed=False, metadata=md,
                                   severity=dg.AssetCheckSeverity.ERROR,
                                   description="no version is current: analysts read empty tables (each says why) "
                                               "until a version passes both gates; `splavu train` and `splavu publish` "
                                               "try again (docs/forget.md)")
    if outcome.get("needed") and not outcome.get("current"):
        return dg.AssetCheckResult(check_name="a_version_serves", passed=False, metadata=md,
                                   severity=dg.AssetCheckSeverity.WARN,
                                   description=f"the refit {outcome.get('version')} was refused ({outcome.get('why')}); "
                                               f"{current} serves, fitted on the erased videos with their rows removed "
                                               f"(policy serve_until_refit), until a version fitted without them "
                                               f"passes both gates")
    return dg.AssetCheckResult(check_name="a_version_serves", passed=True, metadata=md,
                               description=f"{current} is current" + (" (the refit: fitted without the erased videos)"
                                                                      if outcome.get("needed") else ""))


def erased_metadata(summary: dict) -> dict:
    return {"request_id": summary["request_id"], "videos": summary["videos"], "check": fg.check_line(summary["check"]),
            "fitted": fg.fitted_summary(summary),
            "layers": dg.MetadataValue.json(fg.layer_totals(summary["receipt"])),
            "summary": dg.MetadataValue.json({k: summary[k] for k in ("refit_config", "current_before",
                                                                       "fitted_versions", "policy")})}


def refit_metadata(feature_store, outcome: dict, request_id: str) -> dict:
    if not outcome["needed"]:
        return {"request_id": request_id, "refit": "not needed: the current version was not fitted on these videos"}
    version = outcome["version"]
    verdicts = read_verdicts(feature_store, version)
    return {"request_id": request_id, "refit": "done", "version": version, "current": outcome["current"],
            "why": outcome["why"], "check": fg.check_line(outcome["check"]),
            "gates": dg.MetadataValue.json({g: {"passed": v["passed"], "why": v["why"]} for g, v in verdicts.items()}),
            "shards": dg.MetadataValue.json(outcome["published"])}
