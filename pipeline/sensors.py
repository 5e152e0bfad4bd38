"""Inbox sensor: a new folder with videos + a manifest becomes a dataset, its shards partitions."""
from __future__ import annotations

import re
from pathlib import Path

import dagster as dg

from assets.partitions import shards
from assets.resources import StoreResource
from pipeline.jobs import extract_job
from splavu_core.ingest.datasets import register_dataset, registered
from splavu_core.ingest.manifest import ManifestError
from splavu_core.store.feature_store import StoreError


def find_manifest(folder: Path) -> Path | None:
    for name in ("manifest.csv", "manifest.parquet"):
        if (folder / name).is_file():
            return folder / name
    return None


def dataset_name(folder: Path) -> str:
    return "inbox_" + re.sub(r"[^a-z0-9_]+", "_", folder.name.lower()).strip("_")


@dg.sensor(job=extract_job, minimum_interval_seconds=30, default_status=dg.DefaultSensorStatus.STOPPED,
           description="Registers each new folder under the inbox (videos + manifest.csv|parquet) as a dataset "
                       "and requests extraction of its shards. Writes to the store, so it starts stopped.")
def inbox_sensor(context: dg.SensorEvaluationContext, store: StoreResource):
    feature_store = store.store()
    inbox = Path(store.inbox_dir())
    if not inbox.is_dir():
        return dg.SkipReason(f"inbox {inbox} does not exist")
    known = registered(feature_store)
    new_keys, skipped = [], []
    for folder in sorted(p for p in inbox.iterdir() if p.is_dir()):
        manifest = find_manifest(folder)
        name = dataset_name(folder)
        if manifest is None or name in known:
            continue
        try:
            roles = folder / "roles.txt"  # e.g. "ar,privacy"; without it no task reads an inbox dataset
            new_keys += register_dataset(feature_store, name, manifest, roles=roles.read_text().strip() if roles.is_file() else None)
        except (ManifestError, StoreError) as e:
            skipped.append(f"{folder}: {e}")
    for s in skipped:
        context.log.warning(f"inbox folder not registered: {s}")
    existing = set(context.instance.get_dynamic_partitions(shards.name))
    keys = [k for k in new_keys if k not in existing]
    if not keys:
        return dg.SkipReason("no new datasets in the inbox" + (f" ({len(skipped)} invalid)" if skipped else ""))
    return dg.SensorResult(run_requests=[dg.RunRequest(partition_key=k, run_key=f"extract-{k}") for k in keys],
                           dynamic_partitions_requests=[shards.build_add_request(keys)])
