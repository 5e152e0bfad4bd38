"""Re-anonymization: jobs, sensors and a schedule that (re)publish anonymized tables from cached latents.

Dagster's partition rules shape this: anonymized_features is partitioned by shard (one run per
shard: the unit of parallelism and of retries), feature_catalog is not partitioned. Putting both
in one partitioned job would rebuild the catalog in every shard's run, and concurrent shard runs
would race to replace it. So there are two jobs, chained by a sensor:

    reanonymize        anonymized_features, partitioned by shard: one run per shard
    refresh_catalog    feature_catalog, unpartitioned: one run after a batch of shard runs

Triggers (each RunRequest pins the AAM version in run config; run keys are version:shard, and the
asset itself skips a shard already published with that version):

    reanonymize_on_new_aam    sensor on aam_model materialisations: every registered shard lacking a
                              table for the new version
    anonymize_new_shards      sensor on clip_latents materialisations (e.g. a shard from the inbox
                              sensor): the shard, with the current AAM (and the one being rolled out)
    reanonymize_schedule      cron ($SPLAVU_REANONYMIZE_CRON, default 03:00 daily), STOPPED by default:
                              whatever is still missing for the current / rolling-out version
    refresh_catalog_sensor    new anonymized_features materialisations and no reanonymize run queued
                              or in progress: rebuild the catalog once

Ad hoc from the UI, selecting anonymized_features + feature_catalog and "Materialize all" launches
an asset backfill that runs every shard and then the catalog once; pipeline/runner.py `run_reanonymize`
does the same in-process (no daemon), for the CLI, `make demo` and tests.
"""
from __future__ import annotations


import dagster as dg

from assets.anonymized import newest_version, registered_shards, resolve_version, shards_lacking, target_versions
from assets.partitions import shards
from assets.resources import StoreResource
from splavu_core.publish import PublishError
from splavu_core.settings import settings

IN_FLIGHT = [dg.DagsterRunStatus.QUEUED, dg.DagsterRunStatus.NOT_STARTED, dg.DagsterRunStatus.STARTING,
             dg.DagsterRunStatus.STARTED]

reanonymize_job = dg.define_asset_job(
    "reanonymize", selection=dg.AssetSelection.assets("anonymized_features"),
    description="(Re)publish one shard's anonymized table from cached latents (the encoder never runs). "
                "Run config ops.anonymized_features.config.aam_version picks the AAM (default: newest).")

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


def _add_partitions(context, keys: list[str]) -> list:
    have = set(context.instance.get_dynamic_partitions(shards.name))
    new = sorted(set(keys) - have)
    return [shards.build_add_request(new)] if new else []


# ---------------------------------------------------------------- (a) a new AAM version

@dg.asset_sensor(asset_key=dg.AssetKey("aam_model"), job=reanonymize_job, name="reanonymize_on_new_aam",
                 minimum_interval_seconds=30, default_status=dg.DefaultSensorStatus.STOPPED,
                 description="A new aam_model materialisation re-anonymizes every registered shard with it. Writes "
                             "to the store, so it starts stopped: turn it on in the UI (Automation).")
def reanonymize_on_new_aam(context: dg.SensorEvaluationContext, asset_event: dg.EventLogEntry, store: StoreResource):
    feature_store = store.store()
    mat = asset_event.asset_materialization
    version = mat.metadata["version"].value if mat and "version" in mat.metadata else newest_version(feature_store)
    if version is None:
        return dg.SkipReason("aam_model was materialised but no AAM version is recorded in the store")
    try:
        version = resolve_version(feature_store, version)
    except PublishError as e:  # e.g. an aam_model materialisation of another store
        return dg.SkipReason(str(e))
    everything = registered_shards(feature_store)
    todo = shards_lacking(feature_store, version, everything)
    no_latents = [s for s in everything if feature_store.committed(s) is None]
    if no_latents:
        context.log.info(f"{len(no_latents)} registered shard(s) have no latents yet; anonymize_new_shards "
                         f"takes them once extracted: {no_latents}")
    if not todo:
        return dg.SkipReason(f"AAM {version}: all {len(everything) - len(no_latents)} extracted shards already "
                             f"have complete tables")
    return dg.SensorResult(run_requests=[_request(version, s, "new_aam") for s in todo],
                           dynamic_partitions_requests=_add_partitions(context, todo))


# ---------------------------------------------------------------- (c) new shards (e.g. from the inbox)

@dg.sensor(job=reanonymize_job, name="anonymize_new_shards", minimum_interval_seconds=30,
           default_status=dg.DefaultSensorStatus.STOPPED,
           description="A new clip_latents materialisation (new or re-extracted shard) is anonymized with the "
                       "current AAM (and the one being rolled out), unless its table already exists. Starts stopped.")
def anonymize_new_shards(context: dg.SensorEvaluationContext, store: StoreResource):
    res = context.instance.fetch_materializations(dg.AssetKey("clip_latents"), limit=1000, cursor=context.cursor,
                                                  ascending=True)
    if not res.records:
        return dg.SkipReason("no new clip_latents materialisations")
    feature_store = store.store()
    versions = target_versions(feature_store)
    if not versions:  # reanonymize_on_new_aam covers these shards once the first AAM is trained
        return dg.SensorResult(skip_reason=dg.SkipReason("no AAM version recorded yet"), cursor=res.cursor)
    latest: dict[str, int] = {}
    for rec in res.records:
        if rec.partition_key:
            latest[rec.partition_key] = rec.storage_id
    pairs = [(v, s) for v in versions for s in shards_lacking(feature_store, v, sorted(latest))]
    if not pairs:
        return dg.SensorResult(skip_reason=dg.SkipReason(
            f"{len(latest)} shard(s) with new latents already published with {versions}"), cursor=res.cursor)
    reqs = [_request(v, s, "new_shard", key_suffix=f":{latest[s]}") for v, s in pairs]  # a re-extraction re-requests
    return dg.SensorResult(run_requests=reqs, cursor=res.cursor,
                           dynamic_partitions_requests=_add_partitions(context, [s for _, s in pairs]))


# ---------------------------------------------------------------- (b) cron

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


# ---------------------------------------------------------------- the catalog after a batch

@dg.sensor(job=refresh_catalog_job, name="refresh_catalog_sensor", minimum_interval_seconds=60,
           default_status=dg.DefaultSensorStatus.STOPPED,
           description="Rebuilds the catalog once anonymized_features has new materialisations and no "
                       "reanonymize run is queued or in progress (one rebuild per batch of shard runs). Starts stopped.")
def refresh_catalog_sensor(context: dg.SensorEvaluationContext):
    latest = context.instance.fetch_materializations(dg.AssetKey("anonymized_features"), limit=1).records
    if not latest:
        return dg.SkipReason("anonymized_features was never materialised")
    newest = latest[0].storage_id
    if context.cursor and int(context.cursor) >= newest:
        return dg.SkipReason("catalog is up to date with anonymized_features")
    busy = context.instance.get_runs_count(dg.RunsFilter(job_name=reanonymize_job.name, statuses=IN_FLIGHT))
    if busy:
        return dg.SkipReason(f"waiting for {busy} reanonymize run(s) to finish")
    request = dg.RunRequest(run_key=f"catalog:{newest}", tags={"splavu/trigger": "reanonymize"})
    return dg.SensorResult(run_requests=[request], cursor=str(newest))
