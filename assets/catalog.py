"""feature_catalog: <store>/catalog.duckdb, the analysts' views over every Parquet table of the store.

A thin layer over splavu_core.serve.catalog.build_catalog (idempotent; atomic replace, so analysts keep
reading the old file during a rebuild). Before building, the Dagster run history is copied into
<store>/runs/<run_id>.parquet (one small file per run) so the catalog's `runs` view shows it:
runs that finished are written once with their final status; runs still going (this one
included) are written with their status at build time and rewritten by the next build.
"""

from datetime import datetime, timezone

import dagster as dg
import pyarrow as pa

from assets.resources import StoreResource
from splavu_core.serve.catalog import RUNS_SCHEMA, build_catalog
from splavu_core.serve.neighbors import refresh_indexes
from splavu_core.store.feature_store import FeatureStore

TERMINAL = {"SUCCESS", "FAILURE", "CANCELED"}
MAX_RUNS = 1000  # newest runs copied per build (older ones were copied by earlier builds)


def _ts(epoch: float | None):
    return datetime.fromtimestamp(epoch, timezone.utc) if epoch else None


def record_runs(store: FeatureStore, instance: dg.DagsterInstance, limit: int = MAX_RUNS) -> int:
    """Write <root>/runs/<run_id>.parquet for the instance's newest `limit` runs; returns files written."""
    written = 0
    for rec in instance.get_run_records(limit=limit):
        run = rec.dagster_run
        key = f"runs/{run.run_id}.parquet"
        if store.files.isfile(key):
            try:
                if store.files.read_parquet(key, columns=["status"])["status"][0].as_py() in TERMINAL:
                    continue  # final already
            except Exception:
                pass  # unreadable: rewrite it
        row = {"run_id": run.run_id, "job": run.job_name, "status": run.status.value,
               "started_at": _ts(rec.start_time), "finished_at": _ts(rec.end_time)}
        store.files.write_parquet(key, pa.Table.from_pylist([row], schema=RUNS_SCHEMA))
        written += 1
    return written


# After a batch of shards: new tables, none in progress, and the tables' blocking gates passed
_AC = dg.AutomationCondition
REFRESH = (_AC.any_deps_updated().since_last_handled() & ~_AC.any_deps_in_progress() & ~_AC.in_progress()
           & _AC.all_deps_blocking_checks_passed()).with_label("refresh_catalog")


@dg.asset(deps=["anonymized_features"], group_name="publish", kinds={"duckdb"}, automation_condition=REFRESH,
          description="catalog.duckdb + each version's neighbour index (splavu_core.serve.neighbors): views videos, clips, quarantine, anonymized_features (current AAM, FLOAT[D]), "
                      "anonymized_features_all, aam_versions, metrics, runs, storage. Open it read-only with duckdb.")
def feature_catalog(context: dg.AssetExecutionContext, store: StoreResource) -> dg.MaterializeResult:
    return dg.MaterializeResult(metadata=refresh_catalog(store.store(), context.instance, log=context.log.info))


def refresh_catalog(feature_store: FeatureStore, instance: dg.DagsterInstance, log=print) -> dict:
    """What feature_catalog does: the run history copied in, the catalog rebuilt, the neighbour indexes refreshed.
    Returns the asset's metadata; the erasure's refit calls it too."""
    n_runs = record_runs(feature_store, instance)
    res = build_catalog(feature_store)
    nn = refresh_indexes(feature_store)  # `splavu neighbors` reads these, not the Parquet tables
    log(f"neighbour indexes written for {nn['written'] or 'no'} version(s), pruned {nn['pruned'] or 'none'}")
    log(f"catalog {res['path']}: AAM version {res['version']}, {sum(res['rows'].values())} rows in "
        f"{len(res['rows'])} views ({res['seconds']:.2f} s)")
    return {
        "path": dg.MetadataValue.path(res["path"]), "views": dg.MetadataValue.json(sorted(res["rows"])),
        "rows": dg.MetadataValue.json(res["rows"]), "files": dg.MetadataValue.json(res["files"]),
        "aam_version": res["version"] or "", "dim": res["dim"] or 0, "runs_recorded": n_runs,
        "seconds": round(res["seconds"], 3), "neighbor_indexes": dg.MetadataValue.json(nn)}
