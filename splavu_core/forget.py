"""Erasure: remove videos (or every video of a subject) from every layer of the store (`splavu forget`).

A request is opened (`open_request`: validated ids, a journal, tombstones first so that nothing brings the videos
back meanwhile) and then run to completion (`run_request`, the `forget` job's `forget_request` asset), layer by layer:

    versions    AAM versions fitted on the videos (they were training / validation videos of a training dataset),
                by the request's policy (POLICIES; $SPLAVU_ERASURE_POLICY by default): 'retire' retires them in the
                ledger and deletes their tables, adapter, gate cache and neighbour index; 'serve_until_refit' keeps
                them serving with the videos' rows removed like every other version's, until a version fitted
                without them becomes current (`retire_served_until_refit`, called at that promotion)
    shards      per shard holding them, under the shard's write locks (store.rewriting: extraction and publish of
                the shard wait): raw clip + static latents and the clip / static / quarantine index rewritten
                through the normal atomic commit, then each version's anonymized table, then manifest and labels
    caches      any other table or report of the store that names them (gate caches, metrics, reports)
    indexes     neighbour indexes rebuilt from the filtered tables (stale ones deleted)
    sweep       what a killed writer may have left (.trash, latents/.staging, unreferenced S3 attempts)
    catalog     rebuilt; then every file is read back (`verify`): no id, no former vector may be left

Every step is recorded in the journal (erasure/journal/<request>.json) before the next starts, and every step is
idempotent, so a request killed at any point is completed by running it again. The receipt goes to the append-only
erasure log (store/forget_records.py). The journal names the videos (the rerun needs them); it is deleted once the
check passes.

Then, when the current version was fitted on the videos, `refit`: the configuration it was asked for fitted again on
what is left (the publish rule picks its operating point again), published to every shard through both gates
(promoted only if it passes), every file read back again, the outcome appended to the receipt. `forget` runs both halves in order; the `forget` Dagster job (assets/forget.py) is a thin layer over it, and
`splavu forget` launches that job. The steps that fit and publish are passed in (the job passes the aam_model and
anonymized_features assets' own code), so this module stays below Dagster.

Vectors are compared by direction (cosine > 1 - VECTOR_TOL), so row-normalised copies (neighbour indexes) count too.
"""
from __future__ import annotations

import hashlib
import io
import os
import json
import re
import secrets
import shlex
import shutil
import signal
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from splavu_core.aam.config import record_fields
from splavu_core.evaluation import score_cache
from splavu_core.ingest.datasets import ROLES, registered, roles_of
from splavu_core.publish.anonymized_tables import anonymized_key, feature_matrix, published_shards
from splavu_core.serve.catalog import build_catalog, catalog_dir
from splavu_core.serve.neighbors import index_dir, index_is_fresh, write_index
from splavu_core.settings import settings
from splavu_core.store import forget_records as erasure
from splavu_core.store.feature_store import FeatureStore, ShardLatents, StoreError, labels_key
from splavu_core.store.fs import join
from splavu_core.store.ledger import (
    current_version,
    log_erasure_override,
    read_versions,
    refused_versions,
    retire_versions,
    retired_versions,
)

VECTOR_TOL = 1e-6
SHARD_LAYERS = ("latents", "anonymized", "manifests", "labels")  # rewritten per shard, not by the cache sweep
KEPT_OUT_OF_SWEEP = ("aam", "datasets", "erasure", "_locks", "neighbors")
TEXT_SUFFIXES = (".json", ".md", ".csv", ".txt", ".html", ".log")


# What each policy means for the person erased (the receipt and the docs say it in these words)
POLICIES = {
    "retire": "every AAM version fitted on the erased videos is retired now: no table that was computed with them "
              "serves again; analysts read no current table until a version fitted without them passes both gates",
    "serve_until_refit": "the current version keeps serving with the erased rows removed from every table; its "
                         "parameters were fitted with the erased clips among thousands of others (each recentring "
                         "centroid averages clips of at least recentre_min_people people), and it is retired as soon "
                         "as a version fitted without them becomes current",
}


class ForgetError(StoreError):
    """A bad erasure request (unknown id or subject, no reason); nothing was changed."""


class RefitError(StoreError):
    """The erasure is complete and checked, but the refit after it failed (recorded in the receipt)."""


# ---------------------------------------------------------------- what a request names

def _manifest_rows(store: FeatureStore) -> list[dict]:
    """Every stored manifest row: video_id, subject_id, split, path, shard, dataset root."""
    out = []
    for key in sorted(store.files.glob("manifests", ".parquet")):
        shard = key.rsplit("/", 1)[-1][:-len(".parquet")]
        t = store.read_shard_manifest(shard)  # with the private columns: subject_id is in labels/
        root = (t.schema.metadata or {}).get(b"dataset_root", b"").decode()
        cols = {c: t[c].to_pylist() if c in t.column_names else [None] * t.num_rows
                for c in ("video_id", "subject_id", "split", "path")}
        for i in range(t.num_rows):
            out.append({**{c: cols[c][i] for c in cols}, "shard": shard, "root": root})
    return out


def resolve(store: FeatureStore, videos=(), subjects=()) -> tuple[dict[str, dict], list[str]]:
    """({video_id: {shards, files, trains}}, [ids or subjects erased already]). Raises ForgetError naming the first
    unknown video id or subject (nothing changed)."""
    rows = _manifest_rows(store)
    by_video: dict[str, list[dict]] = {}
    for r in rows:
        by_video.setdefault(r["video_id"], []).append(r)
    gone = erasure.forgotten(store, list(videos))
    targets: dict[str, list[dict]] = {}
    already = []
    for v in videos:
        if v in by_video:
            targets[v] = by_video[v]
        elif v in gone:
            already.append(v)
        else:
            raise ForgetError(f"unknown video id {v!r}: no manifest of {store.root} lists it")
    for s in subjects:
        hit = [r for r in rows if r["subject_id"] is not None and str(r["subject_id"]) == s]
        if not hit:
            raise ForgetError(f"unknown subject {s!r}: no manifest row of {store.root} has subject_id {s!r}")
        for r in hit:
            targets.setdefault(r["video_id"], by_video[r["video_id"]])
    trains = _training_datasets(store)
    return {v: {"shards": sorted({r["shard"] for r in rs}),
                "files": sorted({str(Path(r["root"]) / r["path"]) if r["root"] else str(r["path"]) for r in rs
                                 if r["path"]}),
                "trains": any(r["shard"].rpartition("-")[0] in trains and r["split"] != "test" for r in rs)}
            for v, rs in targets.items()}, already


def own_files(store: FeatureStore, targets: dict[str, dict]) -> tuple[list[str], list[str]]:
    """What of `targets` (resolve's) is the user's and an erasure leaves alone: the video files, and the manifests
    that list them."""
    regs = registered(store)
    return (sorted({f for t in targets.values() for f in t["files"]}),
            sorted({regs[d]["manifest"] for t in targets.values() for s in t["shards"]
                    if (d := s.rpartition("-")[0]) in regs}))


def _training_datasets(store: FeatureStore) -> set[str]:
    """Datasets an AAM may be fitted on (a training role: ar, tad, ad)."""
    return {name for name, reg in registered(store).items() if any(ROLES[r].trains for r in roles_of(reg))}


def read_ids_file(path) -> list[str]:
    p = Path(path)
    if not p.is_file():
        raise ForgetError(f"--file {path}: no such file")
    ids = [line.strip() for line in p.read_text().splitlines() if line.strip() and not line.startswith("#")]
    if not ids:
        raise ForgetError(f"--file {path}: holds no video id (one per line)")
    return ids


# ---------------------------------------------------------------- the journal

def _journal_key(request_id: str) -> str:
    return join(erasure.JOURNAL_DIR, f"{request_id}.json")


def pending_requests(store: FeatureStore) -> list[str]:
    return [k.rsplit("/", 1)[-1][:-len(".json")] for k in sorted(store.files.glob(erasure.JOURNAL_DIR, ".json"))]


def _save(store: FeatureStore, journal: dict) -> None:
    store.files.write_json(_journal_key(journal["request_id"]), journal)


def _checkpoint(store: FeatureStore, journal: dict, label: str) -> None:
    """Persist the journal; under $SPLAVU_FORGET_CRASH_AFTER=N the N-th checkpoint kills this process (tests)."""
    _save(store, journal)
    _checkpoint.count = getattr(_checkpoint, "count", 0) + 1
    if settings().forget_crash_after == _checkpoint.count:
        os.kill(os.getpid(), signal.SIGKILL)


def policy_of(policy: str | None) -> str:
    """The erasure policy of a request: `policy`, else $SPLAVU_ERASURE_POLICY."""
    policy = policy or settings().erasure_policy
    if policy not in POLICIES:
        raise ForgetError(f"unknown erasure policy {policy!r}; choose one of {', '.join(POLICIES)}")
    return policy


def open_request(store: FeatureStore, targets: dict[str, dict], reason: str, subjects=(), policy: str | None = None,
                 scope: str = "") -> dict:
    """Journal the request and tombstone its videos (so that no extraction brings them back while it runs)."""
    policy = policy_of(policy)
    if not reason.strip():
        raise ForgetError("--reason TEXT is required (kept in the erasure log; do not name the person)")
    named = [x for x in (*targets, *subjects) if x and x in reason]
    if named:
        raise ForgetError(f"--reason names an id of the request ({named[0]!r}): the erasure log must not hold it")
    if not targets:
        raise ForgetError("nothing to erase: name a video (--video), a subject (--subject) or a file of ids (--file)")
    at = erasure.now()
    rid = f"{at.strftime('%Y%m%dT%H%M%SZ')}-{secrets.token_hex(4)}"
    fitted = []
    if any(t["trains"] for t in targets.values()):  # conservative: every version that existed could have read them
        fitted = [v for v in read_versions(store)["version"].to_pylist() if v not in retired_versions(store)]
    cur = current_version(store)
    journal = {"request_id": rid, "reason": reason.strip(), "scope": scope, "created_at": at.isoformat(),
               "videos": {v: t["shards"] for v, t in targets.items()}, "subjects": list(subjects),
               "fitted_versions": fitted, "policy": policy, "current_before": cur,
               "refit_config": _refit_config(store, cur) if cur in fitted else None,
               "done": {"shards": {}}, "receipt": []}
    _save(store, journal)
    erasure.add_tombstones(store, list(targets), rid)
    return journal


def _refit_config(store: FeatureStore, version: str) -> dict:
    """The training config `version` was asked for, as aam_model's run config: the same request on what is left (a
    version the publish rule picked: the request the rule picked it for, so the rule picks again)."""
    try:
        extra = store.files.read_json(f"aam/{version}/adapter.json").get("extra", {})
    except FileNotFoundError:
        return {}
    # flat, under the names now; the adapter's fields the record leaves out at AAMConfig's defaults, as it means them
    tc = record_fields(dict((extra.get("operating_point") or {}).get("request") or extra.get("train_config") or {}))
    tc.pop("oracle", None)
    return tc


# ---------------------------------------------------------------- running it

def request_for(store: FeatureStore, videos=(), subjects=(), reason: str = "", policy: str | None = None,
                scope: str = "") -> tuple[str | None, dict]:
    """The request that erasing `videos` / `subjects` (by id, as the `forget` job's config names them) completes: a
    request in progress that names all of them (the same erasure launched again after a killed run), else a new one
    (resolved, journaled, tombstoned: open_request). Returns (request id, or None when every video named was erased
    already; {"already": ids erased before, "files": the videos' own files, which are the user's to delete})."""
    if not (videos or subjects):
        raise ForgetError("name what to erase: video ids or subject ids")
    for rid in pending_requests(store):
        j = store.files.read_json(_journal_key(rid))
        if set(videos) <= set(j["videos"]) and set(subjects) <= set(j["subjects"]):
            return rid, {"already": [], "files": []}
    targets, already = resolve(store, list(videos), list(subjects))
    if not targets:
        return None, {"already": already, "files": []}
    journal = open_request(store, targets, reason, subjects=list(subjects), policy=policy,
                           scope=scope or ", ".join(x for x in ("video" if videos else "", "subject" if subjects else "")
                                                    if x))
    return journal["request_id"], {"already": already,
                                   "files": sorted({f for t in targets.values() for f in t["files"]})}


def run_request(store: FeatureStore, request_id: str, log=print, former: list[np.ndarray] | None = None) -> dict:
    """Complete the journaled request (idempotent); returns the summary (receipt rows, check, refit needed).
    former: the videos' vectors, when the caller read them already (former_vectors)."""
    try:
        journal = store.files.read_json(_journal_key(request_id))
    except FileNotFoundError:
        raise ForgetError(f"no erasure request {request_id!r} in progress in {store.root}") from None
    ids, needles, shards, _ = request_targets(store, request_id)
    erasure.add_tombstones(store, ids, request_id)  # again: a run killed right after journaling had not yet
    if former is None:
        former = former_vectors(store, ids, shards)
    done = journal["done"]
    receipt = journal["receipt"]

    if not done.get("versions"):
        receipt += _handle_fitted(store, journal)
        done["versions"] = True
        _checkpoint(store, journal, "versions")
    for shard in shards:
        if shard not in done["shards"]:
            erase_shard(store, shard, ids, receipt, lambda: _checkpoint(store, journal, f"shard {shard}"))
            done["shards"][shard] = True
            _checkpoint(store, journal, f"shard {shard} done")
    if not done.get("caches"):
        receipt += erase_caches(store, ids, needles)
        done["caches"] = True
        _checkpoint(store, journal, "caches")
    receipt += _erase_indexes(store)
    receipt += sweep(store)
    build_catalog(store)
    _checkpoint(store, journal, "catalog")

    check = verify(store, needles, former, skip=(_journal_key(request_id),))
    summary = {"request_id": request_id, "videos": len(ids), "receipt": receipt, "check": check,
               "refit_config": journal["refit_config"], "current_before": journal["current_before"],
               "fitted_versions": journal["fitted_versions"], "policy": _journal_policy(journal),
               "reason": journal["reason"]}
    if not check["clean"]:
        log(f"erasure request {request_id}: check FAILED: {check_line(check)}; the journal is kept: run again")
        return summary
    note = f"check: {check_line(check)}"
    erasure.append_log(store, request_id, "erase", journal["reason"],
                       [{k: r.get(k) for k in erasure.LOG_SCHEMA.names if k in r} for r in receipt] +
                       [{"layer": "request", "item": journal["scope"], "rows_removed": len(ids), "note": note}])
    store.files.delete(_journal_key(request_id))
    build_catalog(store)  # again: the `erasures` view shows this receipt as soon as the request returns
    return summary


def _journal_policy(journal: dict) -> str:
    """The request's policy (a journal written before policies had `keep_fitted`)."""
    if "policy" in journal:
        return journal["policy"]
    return "serve_until_refit" if journal.get("keep_fitted") else "retire"


def _handle_fitted(store: FeatureStore, journal: dict) -> list[dict]:
    fitted, rid, policy = journal["fitted_versions"], journal["request_id"], _journal_policy(journal)
    rows = [{"layer": "policy", "item": policy, "note": POLICIES[policy]}]
    if not fitted:
        return rows
    if policy == "serve_until_refit":
        for v in fitted:
            log_erasure_override(store, v, f"{SERVED_UNTIL_REFIT}: fitted on videos erased by request {rid}")
        return rows + [{"layer": "aam_version", "item": v, "note": "fitted on erased videos; serves with their rows "
                        "removed until a version fitted without them becomes current"} for v in fitted]
    return rows + _retire_and_delete(store, fitted, f"fitted on videos erased by request {rid}: retired")


def _retire_and_delete(store: FeatureStore, versions: list[str], why: str) -> list[dict]:
    """Retire `versions` in the ledger and delete their tables, adapter, gate cache and neighbour index; the receipt's
    rows."""
    retire_versions(store, versions, why)
    # un-named before deleted: the catalog without them first (no version current now, or the one kept), so that
    # analysts querying meanwhile read an empty current table with its reason, not a view over vanished files
    build_catalog(store, leaving=versions)
    rows = []
    for v in versions:
        keys = [anonymized_key(v), f"aam/{v}", f"reports/gates/{v}.json"]
        files = sum(len(store.files.walk(k)) for k in keys)
        for k in keys:
            store.files.delete(k)
        shutil.rmtree(index_dir(store, v), ignore_errors=True)
        rows.append({"layer": "aam_version", "item": v, "files_removed": files,
                     "note": f"{why}: retired, tables, adapter, gate cache and neighbour index deleted"})
    return rows


SERVED_UNTIL_REFIT = "serving until refit"  # the ledger's note on a version kept by policy serve_until_refit


def served_until_refit(store: FeatureStore) -> dict[str, str]:
    """{version: the erasure request that kept it} for the versions fitted on erased videos that serve, by policy
    serve_until_refit, until another becomes current."""
    from splavu_core.store.ledger import ledger_log

    gone = retired_versions(store)
    return {e["version"]: e["reason"].rsplit(" ", 1)[-1] for e in ledger_log(store)
            if e["action"] == "erasure-override" and e.get("reason", "").startswith(SERVED_UNTIL_REFIT)
            and e["version"] not in gone}


def retire_served_until_refit(store: FeatureStore, now_current: str) -> list[str]:
    """When `now_current` became current: retire (and delete) every version kept by policy serve_until_refit, since
    one fitted without the erased videos serves now; each request's receipt in the erasure log gets the rows. Returns
    the versions retired."""
    kept = {v: rid for v, rid in served_until_refit(store).items() if v != now_current}
    for rid in sorted(set(kept.values())):
        versions = sorted(v for v, r in kept.items() if r == rid)
        rows = _retire_and_delete(store, versions, f"kept by policy serve_until_refit until a version fitted without "
                                                   f"the erased videos became current ({now_current})")
        erasure.append_log(store, rid, "retire", "policy serve_until_refit: a version fitted without them is current",
                           [{k: r.get(k) for k in erasure.LOG_SCHEMA.names if k in r} for r in rows])
    return sorted(kept)


def _content_hash(store: FeatureStore, shard: str, marker: dict) -> str:
    """SHA-256 over a committed shard's data files (names and bytes; not the marker)."""
    base = store.shard_data_key(shard, marker)
    h = hashlib.sha256()
    for key, _ in store.files.walk(base):
        rel = key[len(base):].lstrip("/")
        if rel == "_COMMIT.json" or rel.startswith("attempts/"):
            continue
        h.update(rel.encode() + b"\0" + hashlib.sha256(store.files.read_bytes(key)).digest())
    return h.hexdigest()


def _data_bytes(store: FeatureStore, shard: str, marker: dict) -> int:
    base = store.shard_data_key(shard, marker)
    return sum(s for k, s in store.files.walk(base) if not k[len(base):].lstrip("/").startswith("attempts/"))


def _keep_mask(column, ids: set) -> np.ndarray:
    return ~np.asarray(pc.is_in(column, value_set=pa.array(sorted(ids), pa.string())).to_numpy(zero_copy_only=False))


def _manifest_hash_after(store: FeatureStore, shard: str, marker: dict) -> str:
    """The hash a re-extraction of the shard computes now (tombstoned rows left out), so that it finds the shard
    up to date instead of extracting it again; the old one where the user's manifest cannot be read."""
    from splavu_core.extract.shards import manifest_hash
    from splavu_core.ingest.datasets import shard_rows

    try:
        return manifest_hash(shard_rows(store, shard)[1])
    except Exception:  # the user's manifest moved or is gone: a re-extraction then re-reads it anyway
        return marker["manifest_hash"]


def erase_shard(store: FeatureStore, shard: str, ids: set, rows: list, checkpoint=lambda: None) -> None:
    """Remove `ids` from one shard's latents, anonymized tables, manifest and labels; appends receipt rows to `rows`.
    The latents' row goes in before the commit (with the hash before) and is completed after it, so a run killed in
    between is completed on the rerun with the hash the commit left."""
    with store.rewriting(shard) as commit:
        marker = store.committed(shard)
        open_row = next((r for r in rows if r["layer"] == "raw_latents" and r["item"] == shard
                         and r.get("hash_after") is None), None)
        if marker:
            data = store.read_shard(shard)
            keep = _keep_mask(data.index["video_id"], ids)
            k = data.static.shape[1] if data.static.ndim == 3 and len(data.static) else 0
            static_vids = data.static_index["video_id"].to_pylist()[::k] if k else []
            keep_static = ~np.isin(np.asarray(static_vids, dtype=object), list(ids)) if static_vids else np.ones(0, bool)
            keep_q = _keep_mask(data.quarantine["video_id"], ids)
            removed = int((~keep).sum() + (~keep_static).sum() * k + (~keep_q).sum())
            if removed:
                if open_row is None:
                    open_row = {"layer": "raw_latents", "item": shard, "hash_before": _content_hash(store, shard, marker)}
                    rows.append(open_row)
                open_row["rows_removed"] = removed
                checkpoint()
                new = ShardLatents(clips=np.ascontiguousarray(data.clips[keep]), index=data.index.filter(pa.array(keep)),
                                   static=np.ascontiguousarray(data.static[keep_static]),
                                   static_index=data.static_index.filter(pa.array(np.repeat(keep_static, k))),
                                   quarantine=data.quarantine.filter(pa.array(keep_q)))
                marker = commit(new, store.shard_provenance(shard, marker), _manifest_hash_after(store, shard, marker))
            if open_row is not None:  # committed now or by the killed run
                open_row.update(bytes_written=_data_bytes(store, shard, marker),
                                hash_after=_content_hash(store, shard, marker))
                checkpoint()
        for v in store.files.listdir("anonymized"):
            key = anonymized_key(v, shard)
            if store.files.isfile(key):
                rows += _filter_table(store, key, ids, "anonymized", f"{v}/{shard}")
        for layer, key in (("manifests", join("manifests", f"{shard}.parquet")), ("labels", labels_key(shard))):
            if store.files.isfile(key):
                rows += _filter_table(store, key, ids, layer, shard)


def _filter_table(store: FeatureStore, key: str, ids: set, layer: str, item: str) -> list[dict]:
    t = store.files.read_parquet(key)
    keep = _keep_mask(t["video_id"], ids)
    if keep.all():
        return []
    before = hashlib.sha256(store.files.read_bytes(key)).hexdigest()
    store.files.write_parquet(key, t.filter(pa.array(keep)).replace_schema_metadata(t.schema.metadata))
    after = store.files.read_bytes(key)
    return [{"layer": layer, "item": item, "rows_removed": int((~keep).sum()), "bytes_written": len(after),
             "hash_before": before, "hash_after": hashlib.sha256(after).hexdigest()}]


class _Needles:
    """Finds any of some ids in bytes, as whole tokens (not inside a longer id): bytes.find per id, which runs at
    memory speed where one alternation regex over a gigabyte of latents took minutes."""

    def __init__(self, needles):
        self.needles = [str(n).encode() for n in needles if str(n)]

    def search(self, data: bytes) -> bool:
        for n in self.needles:
            at = data.find(n)
            while at >= 0:
                before = data[at - 1:at]
                after = data[at + len(n):at + len(n) + 1]
                if not _TOKEN.match(before) and not _TOKEN.match(after):
                    return True
                at = data.find(n, at + 1)
        return False


_TOKEN = re.compile(rb"[A-Za-z0-9_]")


def _string_hits(table: pa.Table, pat: _Needles) -> list[str]:
    """Names of the table's string columns (top level) holding a needle."""
    hits = []
    for f in table.schema:
        if pa.types.is_string(f.type) or pa.types.is_large_string(f.type):
            values = pc.unique(table[f.name]).to_pylist()
            if any(v is not None and pat.search(v.encode()) for v in values):
                hits.append(f.name)
    return hits


def erase_caches(store: FeatureStore, ids: set, needles) -> list[dict]:
    """Every other table or report that names the videos: rows dropped (a video_id table) or the file deleted (a
    cache or report, which its producer writes again: gate caches, `splavu evaluate`'s reports)."""
    pat, rows = _Needles(needles), []
    kept_scores = [key for key, _ in store.files.walk(score_cache.ROOT)]
    for key in kept_scores:  # outputs about the scored people, keyed by content: none names them, all go
        store.files.delete(key)
    if kept_scores:
        rows.append({"layer": score_cache.ROOT.split("/")[0], "item": score_cache.ROOT, "files_removed": len(kept_scores),
                     "note": "protocol outputs kept between runs (score cache): deleted"})
    for key, _ in store.files.walk(""):
        top = key.split("/", 1)[0]
        if top in SHARD_LAYERS or top in KEPT_OUT_OF_SWEEP or "/" not in key or top.startswith("."):
            continue
        if key.endswith(".parquet"):
            t = store.files.read_parquet(key)
            hits = _string_hits(t, pat)
            if hits == ["video_id"]:
                rows += _filter_table(store, key, ids, top, key)
            elif hits:
                store.files.delete(key)
                rows.append({"layer": top, "item": key, "files_removed": 1, "note": "named erased videos: deleted"})
        elif key.endswith(TEXT_SUFFIXES) and pat.search(store.files.read_bytes(key)):
            store.files.delete(key)
            rows.append({"layer": top, "item": key, "files_removed": 1, "note": "named erased videos: deleted"})
    return rows


def _erase_indexes(store: FeatureStore) -> list[dict]:
    """Each existing neighbour index follows its filtered tables: rebuilt whole (it is one matrix), or deleted when
    its version has no tables left or is refused (a refused version gets no index)."""
    rows, base = [], index_dir(store, "x").parent
    serving = {current_version(store)} | (set(read_versions(store)["version"].to_pylist()) - set(refused_versions(store)))
    for d in sorted(base.glob("*")) if base.is_dir() else []:
        if d.name.startswith(".") or index_is_fresh(store, d.name):
            continue
        if d.name in serving and published_shards(store, d.name):
            meta = write_index(store, d.name)
            rows.append({"layer": "neighbor_index", "item": d.name, "note": "rebuilt from the filtered tables",
                         "bytes_written": sum(p.stat().st_size for p in Path(meta["path"]).iterdir())})
        else:
            shutil.rmtree(d, ignore_errors=True)
            rows.append({"layer": "neighbor_index", "item": d.name, "files_removed": 1, "note": "deleted"})
    return rows


def sweep(store: FeatureStore) -> list[dict]:
    """What killed writers leave: local .trash and latents/.staging leftovers, object-store attempts no marker names
    (taken under each shard's lock, as its writers do)."""
    rows = []
    if store.local:
        trash = store.loc(".trash")
        if trash.is_dir():
            n = sum(1 for _ in trash.iterdir())
            shutil.rmtree(trash, ignore_errors=True)
            if n:
                rows.append({"layer": "sweep", "item": ".trash", "files_removed": n})
        staging = store.loc("latents", ".staging")
        for shard in sorted({p.name.split(".", 1)[0] for p in staging.iterdir()} if staging.is_dir() else []):
            with store.rewriting(shard):
                left = list(staging.glob(f"{shard}.*"))
                for p in left:
                    shutil.rmtree(p, ignore_errors=True)
            rows.append({"layer": "sweep", "item": f"latents/.staging/{shard}", "files_removed": len(left)})
        return rows
    for shard in store.committed_shards():
        if len(store.files.listdir(join("latents", shard, "attempts"))) < 2:
            continue  # nothing to sweep: no lease to take
        with store.rewriting(shard):
            marker = store.committed(shard)
            if marker and len(store.files.listdir(join("latents", shard, "attempts"))) > 1:
                freed = store._gc_attempts(shard, keep={marker.get("data")})
                rows.append({"layer": "sweep", "item": f"latents/{shard}/attempts", "bytes_written": 0,
                             "note": f"{freed} bytes of replaced attempts deleted"})
    return rows


# ---------------------------------------------------------------- what the videos were, and the check

def former_vectors(store: FeatureStore, ids: set, shards) -> list[np.ndarray]:
    """The videos' raw clip and static latents and their anonymized rows of every version, while still stored."""
    out = []
    for shard in shards:
        if store.committed(shard):
            data = store.read_shard(shard)
            out.append(data.clips[~_keep_mask(data.index["video_id"], ids)])
            k = data.static.shape[1] if data.static.ndim == 3 and len(data.static) else 0
            if k:
                vids = np.asarray(data.static_index["video_id"].to_pylist()[::k], dtype=object)
                out.append(data.static[np.isin(vids, list(ids))].reshape(-1, data.static.shape[2]))
        for v in store.files.listdir("anonymized"):
            key = anonymized_key(v, shard)
            if store.files.isfile(key):
                t = store.files.read_parquet(key)
                out.append(feature_matrix(t.filter(pa.array(~_keep_mask(t["video_id"], ids)))))
    return [np.asarray(a, np.float32) for a in out if len(a)]


def _unit(a: np.ndarray) -> np.ndarray:
    a = np.asarray(a, np.float32).reshape(len(a), -1)
    n = np.linalg.norm(a, axis=1, keepdims=True)
    return a / np.maximum(n, 1e-30)


def _vector_hits(stored: np.ndarray, former: dict[int, np.ndarray], block: int = 1 << 16) -> int:
    if stored.ndim < 2 or stored.shape[-1] not in former or not stored.size:
        return 0
    stored = stored.reshape(-1, stored.shape[-1])
    f = former[stored.shape[-1]]
    hits = 0
    for s in range(0, len(stored), block):
        u = _unit(np.nan_to_num(stored[s:s + block].astype(np.float32)))
        hits += int(((u @ f.T) > 1 - VECTOR_TOL).any(axis=1).sum())
    return hits


def _decoded_arrays(fs, key: str):
    """What a file holds, decoded: a Parquet table and its float list columns as matrices, or a .npy array."""
    if key.endswith(".parquet"):
        t = fs.read_parquet(key)
        for f in t.schema:
            if (pa.types.is_fixed_size_list(f.type) or pa.types.is_list(f.type)) and pa.types.is_floating(f.type.value_type):
                yield feature_matrix(t.select([f.name]).rename_columns(["feature"]))
        yield t
    elif key.endswith(".npy"):
        yield np.load(fs.loc(key), mmap_mode="r") if fs.local else np.load(io.BytesIO(fs.read_bytes(key)))


def verify(store: FeatureStore, needles, former: list[np.ndarray], skip=()) -> dict:
    """Read back every file of the store (and, for an object store, its local catalog folder): raw bytes searched for
    the ids, Parquet tables and Zarr arrays and .npy decoded (they are compressed or binary) and their strings and
    vectors compared with the ids and the former vectors."""
    import zarr

    from splavu_core.store.fs import open_root

    t0 = time.perf_counter()
    pat = _Needles(needles) if needles else None
    by_dim: dict[int, list] = {}
    for a in former:
        by_dim.setdefault(a.shape[1], []).append(_unit(a))
    former_u = {d: np.concatenate(v) for d, v in by_dim.items()}
    roots = [store.files] + ([] if store.local else [open_root(catalog_dir(store))])
    files = decoded = 0
    id_hits, vec_hits = [], []
    for fs in roots:
        for key, _ in fs.walk(""):
            if fs is store.files and key in skip:
                continue
            files += 1
            where = f"{fs.url}/{key}"
            if pat is not None and pat.search(fs.read_bytes(key)):
                id_hits.append(where)
            if key.endswith((".parquet", ".npy")):
                decoded += 1
                for obj in _decoded_arrays(fs, key):
                    if isinstance(obj, pa.Table):
                        if pat is not None and _string_hits(obj, pat):
                            id_hits.append(f"{where} (decoded)")
                    elif n := _vector_hits(np.asarray(obj), former_u):
                        vec_hits.append(f"{where}: {n} rows")
            if key.endswith("latents.zarr/zarr.json"):
                group = zarr.open_group(fs.zarr_store(key[:-len("/zarr.json")], read_only=True), mode="r")
                for name, arr in group.arrays():
                    decoded += 1
                    if n := _vector_hits(arr[:], former_u):
                        vec_hits.append(f"{where[:-len('/zarr.json')]}/{name}: {n} rows")
    return {"clean": not id_hits and not vec_hits, "files": files, "decoded": decoded, "ids": len(needles),
            "vectors": int(sum(len(a) for a in former)), "id_hits": id_hits, "vector_hits": vec_hits,
            "seconds": time.perf_counter() - t0}


def check_line(check: dict) -> str:
    head = (f"{check['files']} files read back ({check['decoded']} Parquet tables, Zarr arrays and .npy decoded): ")
    if check["clean"]:
        return head + (f"none holds any of the {check['ids']} erased id(s), none a vector within cosine "
                       f"{VECTOR_TOL:g} of their {check['vectors']} former raw or anonymized vectors")
    return head + f"ids found in {check['id_hits'][:5]}, vectors in {check['vector_hits'][:5]}"


def record_refit(store: FeatureStore, request_id: str, reason: str, version: str | None, current: bool, why: str,
                 check: dict) -> None:
    erasure.append_log(store, request_id, "refit", reason, [
        {"layer": "refit", "item": version or "", "note": f"{'current' if current else 'NOT current'}: {why}"},
        {"layer": "request", "item": "check after refit", "note": check_line(check)}])


def refit(store: FeatureStore, summary: dict, needles, former: list[np.ndarray], train, publish, log=print) -> dict:
    """The second half of an erasure, after run_request: when the current version was fitted on the erased videos,
    fit it again with its own training config on what is left (`train(config) -> version`), publish that version to
    every shard (`publish(version)`: promotion is the two gates' decision), read every file back again (the ids and
    the videos' former vectors) and append the outcome to the receipt.

    Returns {"needed": False} when no refit is called for, else {"needed", "version", "current", "why", "check",
    "published"} (published: what `publish` returned). Raises RefitError when fitting or publishing failed (the erasure
    itself is complete and checked; the receipt says so), ForgetError when the check after the refit finds anything."""
    rid, reason, config = summary["request_id"], summary["reason"], summary["refit_config"]
    if config is None:
        return {"needed": False}
    log("refitting the adapter without them (it was the current version and was fitted on them)")
    try:
        version = train(config)
        published = publish(version)
    except Exception as e:
        why = _one_line(e)
        record_refit(store, rid, reason, None, False, f"refit failed: {why}", verify(store, needles, former))
        state = ("the kept version serves, its erased rows removed" if summary["policy"] == "serve_until_refit"
                 else "no version is current")
        raise RefitError(f"the erasure is complete and checked, but the refit failed ({why}); {state}: refit by hand "
                         f"with `splavu train --config {shlex.quote(json.dumps(config))}` and `splavu publish` (or the "
                         f"train_aam and reanonymize jobs)") from e
    current = current_version(store) == version
    why = "passed both gates" if current else (refused_versions(store).get(version, {}).get("why") or "not promoted")
    check = verify(store, needles, former)
    record_refit(store, rid, reason, version, current, why, check)
    if not check["clean"]:
        raise ForgetError(f"erasure request {rid}: check after the refit failed: {check_line(check)}")
    return {"needed": True, "version": version, "current": current, "why": why, "check": check, "published": published}


def not_current_line(version: str, why: str, policy: str) -> str:
    """What analysts are served when the refit did not become current."""
    kept = policy == "serve_until_refit"
    return (f"AAM {version} is NOT current ({why}); by policy {policy} the version fitted on the erased videos is "
            f"{'kept, its erased rows removed,' if kept else 'retired'} so {'it' if kept else 'no version'} serves "
            f"analysts until one passes: no query returns the erased rows")


def forget(store: FeatureStore, request_id: str, train, publish, log=print):
    """A journaled request end to end, as a generator of its two halves: yields ("erased", run_request's summary)
    once the videos are erased, checked and the receipt written, then, if that check was clean, ("refit", refit's
    outcome). The `forget` job reports each half as it comes (the erasure stands even if the refit fails)."""
    ids, needles, shards, _ = request_targets(store, request_id)
    former = former_vectors(store, ids, shards)  # also for the check after the refit: the erasure removes them
    summary = run_request(store, request_id, log=log, former=former)
    yield "erased", summary
    if summary["check"]["clean"]:
        yield "refit", refit(store, summary, needles, former, train, publish, log=log)


def _one_line(e: BaseException) -> str:
    text = getattr(e, "description", None) or str(e) or type(e).__name__
    return "; ".join(part.strip() for part in str(text).splitlines() if part.strip())


def fitted_summary(summary: dict) -> str:
    fitted = summary["fitted_versions"]
    if not fitted:
        return "no AAM version was fitted on these videos (none was a training or validation video): no refit needed"
    how = "kept serving (policy serve_until_refit), their rows removed" if summary["policy"] == "serve_until_refit" else \
        "retired in the ledger and deleted (tables, adapter, gate cache, neighbour index)"
    return f"AAM version(s) fitted on these videos: {', '.join(fitted)}: {how}"



def layer_totals(receipt: list[dict]) -> dict[str, dict]:
    """{layer: {items, rows_removed, files_removed, bytes_written}} of a request's receipt rows."""
    out: dict[str, dict] = {}
    for r in receipt:
        t = out.setdefault(r["layer"], {"items": 0, "rows_removed": 0, "files_removed": 0, "bytes_written": 0})
        t["items"] += 1
        for k in ("rows_removed", "files_removed", "bytes_written"):
            t[k] += int(r.get(k) or 0)
    return out


def request_targets(store: FeatureStore, request_id: str) -> tuple[set, list, list, str]:
    """(video ids, ids and subjects to search for, shards, reason) of a journaled request."""
    j = store.files.read_json(_journal_key(request_id))
    ids = set(j["videos"])
    return ids, sorted(ids | set(j["subjects"])), sorted({s for ss in j["videos"].values() for s in ss}), j["reason"]


def erase_raced(store: FeatureStore, shard: str, log=print) -> dict | None:
    """After an extraction's commit: erase the videos tombstoned since it read its rows (an erasure it raced on an
    object store, where only the commit is locked). Returns the new marker, or None when there were none."""
    key = store.shard_file(shard, "clips.parquet")
    gone = erasure.forgotten(store, pc.unique(store.files.read_parquet(key, columns=["video_id"])["video_id"]).to_pylist())
    if not gone:
        return None
    erase_shard(store, shard, gone, [])
    log(f"{shard}: {len(gone)} video(s) erased while this extraction ran were removed again")
    return store.committed(shard)
