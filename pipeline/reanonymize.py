"""Re-anonymization: jobs, the automation sensor and a schedule that (re)publish anonymized tables from cached latents.

Dagster's partition rules shape this: anonymized_features is partitioned by shard (one run per
shard: the unit of parallelism and of retries), feature_catalog is not partitioned. Putting both
in one partitioned job would rebuild the catalog in every shard's run, and concurrent shard runs
would race to replace it. So there are two jobs:

    reanonymize        anonymized_features, partitioned by shard: one run per shard
    refresh_catalog    feature_catalog, unpartitioned: one run after a batch of shard runs

Triggers, both STOPPED by default (they write to the store):

    reanonymize_automation    declarative automation: the assets' own conditions (assets/anonymized.py REANONYMIZE,
                              assets/catalog.py REFRESH). A new aam_model version -> every shard; a shard's new
                              latents -> that shard, unless the last run's blocking gates failed; the catalog once
                              no shard is in progress and the gates passed. Runs are unpinned: the version being
                              rolled out, else the current one.
    reanonymize_schedule      cron ($SPLAVU_REANONYMIZE_CRON, default 03:00 daily): whatever the store still lacks
                              for the current and the rolling-out version, each pinned in run config. Kept as a
                              sensor-free catch-all because conditions see Dagster's event log, not the store (a
                              table deleted or never written, the current version while the newer one is refused).

Ad hoc from the UI, selecting anonymized_features + feature_catalog and "Materialize all" launches
an asset backfill that runs every shard and then the catalog once; pipeline/runner.py `run_reanonymize`
does the same in-process (no daemon), for the CLI, `make demo` and tests.
"""
from __future__ import annotations

import dagster as dg

from assets.anonymized import shards_lacking, target_versions
from assets.partitions import shards
from assets.resources import StoreResource
from splavu_core.settings import settings

reanonymize_job = dg.define_asset_job(
    "reanonymize", selection=dg.AssetSelection.assets("anonymized_features"),
    description="(Re)publish one shard's anonymized table from cached latents (the encoder never runs). "
                "Run config ops.anonymized_features.config.aam_version picks the AAM (default: the one being rolled "
                "out, else the current one).")

refresh_catalog_job = dg.define_asset_job(
    "refresh_catalog", selection=dg.AssetSelection.assets("feature_catalog"),
    description="Rebuild <store>/catalog.duckdb (views only; idempotent).")


def retention_from_env() -> int:
    return settings().aam_retention


def anonymize_run_config(version: str, retention: int | None = None) -> dict:
    retention = retention_from_env() if retention is None else retention
    return {"ops": {"anonymized_features": {"config": {"aam_version": version, "retention": retention}}}}


def _request(version: str, shard: str, trigger: str, key_suffix: str = "") -> dg.RunRequest:
    return dg.RunRequest(partition_key=shard, run_key=f"{version}:{shard}{key_suffix}",
                         run_config=anonymize_run_config(version),
                         tags={"splavu/trigger": trigger, "splavu/aam_version": version})


# ---------------------------------------------------------------- cron

def build_reanonymize_schedule(cron: str | None = None,
                               default_status: dg.DefaultScheduleStatus = dg.DefaultScheduleStatus.STOPPED):
    """The catch-all schedule; cron from the argument, else $SPLAVU_REANONYMIZE_CRON, else 03:00 daily."""
    cron = cron or settings().reanonymize_cron

    @dg.schedule(cron_schedule=cron, job=reanonymize_job, name="reanonymize_schedule", default_status=default_status,
                 execution_timezone=settings().timezone,
                 description="Publishes every extracted shard still lacking a table for the current AAM (or the one "
                             "being rolled out). Off by default: turn it on in the UI or with "
                             "`dagster schedule start reanonymize_schedule`.")
    def reanonymize_schedule(context: dg.ScheduleEvaluationContext, store: StoreResource):
        feature_store = store.store()
        versions = target_versions(feature_store)
        if not versions:
            return dg.SkipReason("no AAM version recorded yet: materialise aam_model first")
        known = set(context.instance.get_dynamic_partitions(shards.name))
        pairs = [(v, s) for v in versions for s in shards_lacking(feature_store, v) if s in known]
        if not pairs:
            return dg.SkipReason(f"every extracted shard has a complete table for {versions}")
        tick = context.scheduled_execution_time.strftime("%Y%m%dT%H%M") if context.scheduled_execution_time else ""
        return [_request(v, s, "cron", key_suffix=f":{tick}") for v, s in pairs]

    return reanonymize_schedule


reanonymize_schedule = build_reanonymize_schedule()


# ---------------------------------------------------------------- declarative automation

reanonymize_automation = dg.AutomationConditionSensorDefinition(
    "reanonymize_automation", target=dg.AssetSelection.assets("anonymized_features", "feature_catalog"),
    default_status=dg.DefaultSensorStatus.STOPPED, minimum_interval_seconds=30,
    description="Evaluates anonymized_features' and feature_catalog's automation conditions: a new AAM version "
                "re-anonymizes every shard, new latents their shard (waiting while a blocking gate fails), then the "
                "catalog is rebuilt once the gates pass. Writes to the store, so it starts stopped.")
