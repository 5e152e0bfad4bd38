"""What a `splavu` command needs of the store, checked before it starts anything: a missing store, catalog, version or
latents is one `splavu: error:` line saying what to do (StoreError, CatalogError), not a failed Dagster run. Each check
names the store as the user gave it (`root`), so the command to paste back is theirs."""
from __future__ import annotations

import shlex

from splavu_core.ingest.datasets import registration, training_plan
from splavu_core.serve.catalog import CatalogError, catalog_path
from splavu_core.store.feature_store import FeatureStore, StoreError
from splavu_core.store.ledger import current_version, read_versions


def require_store(root: str) -> None:
    if not FeatureStore(root).files.isdir(""):
        raise StoreError(f"no store at {root}: register a dataset first (splavu ingest NAME MANIFEST), "
                         f"or point --store / $SPLAVU_STORE at an existing store")


def require_catalog(root: str) -> FeatureStore:
    store = FeatureStore(root)
    if not catalog_path(store).is_file():
        raise CatalogError(f"no catalog at {catalog_path(store)}: run feature_catalog first "
                           f"(`splavu --store {shlex.quote(str(root))} publish` publishes and builds it, or "
                           f"`SPLAVU_STORE={shlex.quote(str(root))} dagster asset materialize -m pipeline.definitions "
                           f"--select feature_catalog`)")
    return store


def version_to_score(store: FeatureStore, root: str, requested: str | None) -> str:
    """--version, else the current version; a clear error naming the newest recorded one when there is none."""
    version = requested or current_version(store)
    if not version:
        known = read_versions(store)["version"].to_pylist()
        if not known:
            raise StoreError(f"no AAM version in {root}: run `splavu train` and `splavu publish` first")
        raise StoreError(f"no AAM version is current in {root} (every recorded one was refused or is not published "
                         f"everywhere): score one explicitly with --version {known[-1]}")
    return version


def training_plan_line(store: FeatureStore, cfg: dict) -> str:
    """What training will use (aam_model's run config `cfg`: tasks, <task>_dataset, selection), checked before a run
    starts, so a missing task is one line, not a failed run: the one-line plan, or RoleError / StoreError saying
    what to do."""
    plan = training_plan(store, cfg.get("tasks"), {t: cfg.get(f"{t}_dataset", "") for t in ("ar", "tad", "ad")},
                         cfg.get("selection", ""))
    shards = {s for d in plan.datasets.values() if d for s in registration(store, d)["shards"]}
    missing = sorted(s for s in shards if store.committed(s) is None)
    if missing:
        raise StoreError(f"no latents yet for shard(s) {missing}: run `splavu extract` first")
    return plan.summary()
