"""anonymized_features: f_A(cached clip latents) of one shard, published as Parquet per AAM version.

Reads cached latents and a saved adapter only; the frozen encoder is never loaded. The publishing
itself (guards against raw latents, atomic writes, skip of complete tables) is
splavu_core.publish.anonymized_tables.anonymize_shard; this module chooses the AAM version, decides when a version
becomes current, and applies retention.

Which version: the config's `aam_version` (the CLI and the schedule pin it), or for an unpinned run (the
automation below, the UI's Materialize) the version being rolled out, else the current one, else the newest
(`unpinned_version`): so after a rollback new shards get the version analysts read.

When it runs by itself (REANONYMIZE, evaluated by the `reanonymize_automation` sensor, stopped by default): every
shard when aam_model records a new version; a shard when its latents land or change, unless the latest run's
blocking gates failed (the version being rolled out is refused: new shards wait until a gate passes or a new
version comes). The gates ride along in every such run.

When a version becomes current: as soon as every registered shard has a complete table for it,
provided it is newer than the current version and was never made current automatically before.
A version becomes current only when both gates pass (splavu_core.evaluation.gates: privacy budget and utility of
every seen task, on validation splits); `splavu promote` / `splavu rollback` switch by hand.
So a manual rollback (publish.set_current to an older version) stands: publishing the newer
version for a new shard later does not silently undo it. Use set_current to switch explicitly.
"""

from datetime import datetime, timezone

import dagster as dg
from pydantic import Field

from assets.partitions import shards
from assets.resources import StoreResource
from splavu_core.evaluation.gates import passes_gates
from splavu_core.forget import retire_served_until_refit
from splavu_core.ingest.datasets import registered
from splavu_core.publish.anonymized_tables import (
    anonymize_shard,
    apply_retention,
    published_rows,
    published_shards,
    retention_victims,
)
from splavu_core.serve.catalog import build_catalog
from splavu_core.serve.neighbors import prune_indexes
from splavu_core.settings import settings
from splavu_core.store import costs
from splavu_core.store.feature_store import FeatureStore
from splavu_core.store.ledger import (
    PublishError,
    clear_refusal,
    current_version,
    log_auto_promotion,
    newest_version,
    promoted_versions,
    read_versions,
    record_refusal,
    set_current,
    versions_path,
)

# ---------------------------------------------------------------- store state (shared with the sensors)

def registered_shards(store: FeatureStore) -> list[str]:
    """Every shard of every dataset registered in the store."""
    return sorted({s for reg in registered(store).values() for s in reg["shards"]})


def resolve_version(store: FeatureStore, requested: str = "") -> str:
    """The AAM version to publish: `requested`, or the newest recorded one. Raises PublishError."""
    rows = read_versions(store).to_pylist()
    known = [r["version"] for r in rows]
    if not requested:
        if not rows:
            raise PublishError(f"no AAM version is recorded in {versions_path(store)}: materialise aam_model first "
                               f"(anonymized tables are only ever published through a trained adapter)")
        return newest_version(store)
    if requested not in known:
        meta_key = f"aam/{requested}/adapter.json"
        if store.files.isfile(meta_key):  # an adapter copied in by hand: name the real problem if it is another encoder's
            have, want = store.files.read_json(meta_key).get("encoder_fingerprint"), store.encoder_fingerprint()
            if have != want:
                raise PublishError(f"adapter {adapter_dir(store, requested)} (version {requested}) was trained on latents of "
                                   f"encoder {have!r}, but the store {store.root} holds latents of encoder {want!r}; "
                                   f"refusing to mix them")
        raise PublishError(f"AAM version {requested!r} is not recorded in {versions_path(store)} "
                           f"(known: {known or 'none'}); materialise aam_model first")
    return requested


def adapter_dir(store: FeatureStore, version: str):
    return store.loc("aam", version)


def table_complete(store: FeatureStore, version: str, shard: str) -> bool:
    """True when anonymized/<version>/<shard>.parquet reads and holds one row per committed clip."""
    commit = store.committed(shard)
    # an absent file or an unreadable footer counts as absent: the asset rewrites it
    return commit is not None and published_rows(store, version, shard) == commit["clips"]


def shards_lacking(store: FeatureStore, version: str, candidates: list[str] | None = None) -> list[str]:
    """Shards among `candidates` (default: all registered) with committed latents but no complete table."""
    pool = registered_shards(store) if candidates is None else candidates
    return [s for s in pool if store.committed(s) is not None and not table_complete(store, version, s)]


def target_versions(store: FeatureStore) -> list[str]:
    """Versions every shard should have a table for: the current one, plus the newest while it is being
    rolled out (newer than the current one and not made current before)."""
    cur, new = current_version(store), newest_version(store)
    out = [v for v in (cur,) if v]
    if new and new != cur and new not in promoted_versions(store) and _created(store, new) >= _created(store, cur):
        out.append(new)
    return out


def unpinned_version(store: FeatureStore) -> str:
    """What a run without `aam_version` publishes: the version being rolled out, else the current one, else the
    newest (PublishError when none is recorded)."""
    versions = target_versions(store)
    return versions[-1] if versions else resolve_version(store)


def _created(store: FeatureStore, version: str | None):
    if version is None:
        return datetime.min.replace(tzinfo=timezone.utc)
    rows = [r for r in read_versions(store).to_pylist() if r["version"] == version]
    return rows[0]["created_at"] if rows else datetime.min.replace(tzinfo=timezone.utc)



def maybe_promote(store: FeatureStore, version: str) -> tuple[bool, str]:
    """Make `version` current if every registered shard now has a complete table for it (see module doc).
    Returns (is_current_now, why)."""
    todo = registered_shards(store)
    present = published_shards(store, version)
    missing = [s for s in todo if s not in present]  # cheap first: no footer read while files are missing
    missing = missing or [s for s in todo if not table_complete(store, version, s)]
    if missing:
        return current_version(store) == version, f"{len(todo) - len(missing)}/{len(todo)} registered shards published"
    with store.lock("aam_promotions"):
        cur = current_version(store)
        if cur == version:
            return True, "already current"
        done = promoted_versions(store)
        if version in done:
            return False, (f"complete, but it was made current once before ({done[version]}) and {cur} was chosen "
                           f"since: use publish.set_current to switch back")
        if _created(store, version) < _created(store, cur):
            return False, f"complete, but older than the current version {cur}: use publish.set_current to roll back"
        # both gates (privacy budget AND utility of every seen task, on validation splits) guard promotion;
        # the asset checks privacy_budget / utility_budget report the same recorded verdicts in the UI
        ok, why = passes_gates(store, version)
        if not ok:
            record_refusal(store, version, why)  # analysts are told why their table is empty (catalog.empty_reason)
            return False, f"complete, but not made current: {why}"
        set_current(store, version, promotion="gate")
        clear_refusal(store, version)
        log_auto_promotion(store, version, cur, why)
    # a version fitted without the videos of an erasure serves now: those kept by policy serve_until_refit go
    retired = retire_served_until_refit(store, version)
    tail = f"; retired {', '.join(retired)} (kept by policy serve_until_refit until now)" if retired else ""
    return True, f"all {len(todo)} registered shards published: now current (was {cur}){tail}"


# ---------------------------------------------------------------- the asset

class AnonymizeConfig(dg.Config):
    aam_version: str = Field(default="", description="AAM version to publish (default: the one being rolled out, "
                                                     "else the current one, else the newest recorded)")
    retention: int = Field(default_factory=lambda: settings().aam_retention,
                           description="after publishing, keep the tables of the newest N AAM versions (plus the "
                                       "current one); 0 keeps all (default $SPLAVU_AAM_RETENTION)")


_AC = dg.AutomationCondition
NEW_VERSION = _AC.any_deps_updated().allow(dg.AssetSelection.assets("aam_model"))
NEW_LATENTS = _AC.newly_missing() | _AC.any_deps_updated().allow(dg.AssetSelection.assets("clip_latents"))
GATES_FAILED = _AC.any_checks_match(_AC.check_failed(), blocking_only=True)
# eager(), except that a shard's new latents wait while a blocking gate fails (a new version never waits)
REANONYMIZE = ((NEW_VERSION.since_last_handled() | (NEW_LATENTS.since_last_handled() & ~GATES_FAILED))
               & ~_AC.any_deps_missing() & ~_AC.any_deps_in_progress() & ~_AC.in_progress()).with_label("reanonymize")


@dg.asset(partitions_def=shards, deps=["aam_model", "clip_latents"], group_name="publish", kinds={"parquet"},
          automation_condition=REANONYMIZE,
          description="One shard's clips through the AAM: Parquet per shard and AAM version, from cached latents only "
                      "(the encoder is never loaded). Skips shards already published with that version.")
def anonymized_features(context: dg.AssetExecutionContext, config: AnonymizeConfig,
                        store: StoreResource) -> dg.MaterializeResult:
    return dg.MaterializeResult(metadata=publish_shard(store.store(), context.partition_key, config,
                                                       log=context.log.info))


def publish_shard(feature_store: FeatureStore, shard: str, config: AnonymizeConfig, log=print) -> dict:
    """What anonymized_features does for one shard: publish it with the configured version, promote the version when
    this completes it (both gates), apply retention. Returns the asset's metadata; the erasure's refit calls it too."""
    if config.retention < 0:
        raise PublishError(f"retention must be >= 0 (0 keeps every version), got {config.retention}")
    version = resolve_version(feature_store, config.aam_version) if config.aam_version else unpinned_version(feature_store)
    res = anonymize_shard(feature_store, shard, adapter_dir(feature_store, version))
    if not res["skipped"]:
        costs.record(feature_store, "splavu", "anonymize", f"{version}/{shard}", res["seconds"], clips=res["rows"])
    current, why = maybe_promote(feature_store, version)
    done = "already published, skipped" if res["skipped"] else f"published {res['rows']} rows"
    log(f"{shard}: AAM {version}: {done}; current: {current} ({why})")
    md = {"rows": res["rows"], "dim": res["dim"], "aam_version": version, "skipped": res["skipped"],
          "path": dg.MetadataValue.path(res["path"]), "seconds": round(res["seconds"], 3),
          "clips_per_s": dg.MetadataValue.float(round(res["rows"] / res["seconds"], 1)
                                                if not res["skipped"] and res["seconds"] > 0 else 0.0),
          "is_current": current, "current_version": current_version(feature_store) or "", "promotion": why}
    if "max_abs_change" in res:
        md["max_abs_change"] = float(res["max_abs_change"])
    if config.retention:
        if victims := retention_victims(feature_store, config.retention):
            build_catalog(feature_store, leaving=victims)  # un-named before deleted: analysts never meet a vanished file
        kept = apply_retention(feature_store, config.retention)
        kept["indexes_pruned"] = prune_indexes(feature_store)  # a neighbour index goes with its version's tables
        md["retention"] = dg.MetadataValue.json(kept)
        if kept["deleted"]:
            log(f"retention (newest {config.retention}): deleted tables of {kept['deleted']}")
    return md
