"""The analysts' DuckDB catalog: <root>/catalog.duckdb, views over the store's Parquet tables.

    videos                    manifests/*.parquet (+ dataset, shard); these files hold no attr_*, subject_id or group
                              column: private labels live in labels/<shard>.parquet, which no view reads (store.py)
    clips                     latents/*/clips.parquet: the clip INDEX of raw shards (+ dataset, shard)
    quarantine                latents/*/quarantine.parquet (+ dataset)
    anonymized_features       anonymized/<current>/*.parquet, feature as FLOAT[D] (+ dataset, shard)
    anonymized_features_all   anonymized/<v>/*.parquet of every version that passed the privacy gate
                              (current or once promoted); a refused version's table is never in the catalog
    aam_versions              aam_versions.parquet
    metrics                   metrics/*.parquet
    runs                      runs/*.parquet
    storage                   storage.parquet: one row per file of the store, computed at build time
    erasures                  erasure/log/*.parquet: the receipts of `splavu forget` (counts and hashes, no ids)

The catalog holds views only: no data is copied into it, and no view reads raw latent arrays
(Zarr) - only the index and metadata tables next to them. Views use glob patterns, so new shards
appear without a rebuild; a rebuild is needed when the current AAM version changes, when a table
goes from zero files to some (its view is an empty typed SELECT until then), or after retention /
purges empty a glob (DuckDB errors on a glob that matches nothing).

Analysts' connections (analyst.py: query(), neighbors(), `splavu sql`) are read-only: only SELECT / EXPLAIN
statements, external access off except for exactly the Parquet files the catalog's views name (their
globs and what they match now), configuration locked. So nothing is written anywhere, and raw latent
chunks, refused versions' tables and any other file stay unreadable, on local and object-store roots
alike (DuckDB applies the same path check to a registered fsspec filesystem).

Rebuilds write a new file and os.replace it over catalog.duckdb: an analyst holding a read-only
connection keeps reading the old file, and a crash mid-build leaves the old catalog in place.

The views name the store's files by absolute path (plain `duckdb` on the file reads them from anywhere). A store
copied, moved or restored from a backup into another folder keeps a catalog naming the old folder's files: the
analysts' connection (analyst.py) sees that the catalog was built for another root and recreates its views in
memory over the store's own files (nothing is written; the next rebuild writes the new paths).
Files are deleted only once no view names them (before deleting a version's tables, its writer rebuilds the catalog
without them: `build_catalog(leaving=...)`), so a reader on the new catalog never meets a vanished file; a reader
still on the old one is retried once on the new one (analyst.py).

Object-store roots (s3://..., see storefs.py): DuckDB cannot open a database file on an object store,
so catalog.duckdb lives in a local cache folder, `$SPLAVU_CATALOG_DIR/<store>/catalog.duckdb`
(default `~/.cache/splavu/catalogs/`), built the same way; storage.parquet stays in the store. Its views
read the store's Parquet through the store's own fsspec filesystem, registered on each connection
(`con.register_filesystem`: no httpfs extension needed), so open it with `splavu sql` / query() /
neighbors(), or register the same filesystem yourself. `clips` and `quarantine` list the committed
attempt of each shard explicitly (a glob would also match uncommitted attempts), so on an object store
new shards appear there after a rebuild (feature_catalog's automation rebuilds after each batch).
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import time
import uuid
from pathlib import Path

import duckdb
import pyarrow as pa

from splavu_core.publish.anonymized_tables import anonymized_key, anonymized_schema, published_shards
from splavu_core.settings import settings
from splavu_core.store.feature_store import (
    CLIP_INDEX_SCHEMA,
    PRIVATE_COLUMNS,
    PRIVATE_PREFIX,
    QUARANTINE_SCHEMA,
    FeatureStore,
    StoreError,
)
from splavu_core.store.forget_records import LOG_DIR, LOG_SCHEMA
from splavu_core.store.ledger import (
    VERSIONS_KEY,
    VERSIONS_SCHEMA,
    approved_versions,
    current_version,
    read_versions,
    refused_versions,
)

CATALOG_FILE = "catalog.duckdb"
STALE_TEMP_S = 3600  # temp catalogs older than this were left by a crashed build

VIDEOS_SCHEMA = pa.schema([("video_id", pa.string()), ("path", pa.string()), ("split", pa.string()),
                           ("action", pa.string()), ("segments", pa.string()), ("anomaly", pa.int64()),
                           ("anomaly_intervals", pa.string())])  # no private column (store.is_private_column)
METRICS_SCHEMA = pa.schema([("feature_set", pa.string()), ("aam_version", pa.string()), ("task", pa.string()),
                            ("metric", pa.string()), ("value", pa.float64()), ("split", pa.string()),
                            ("created_at", pa.timestamp("us", tz="UTC")),
                            # issue 19: spread over probe seeds, 95% interval, chance (null where undefined)
                            ("sd", pa.float64()), ("ci_low", pa.float64()), ("ci_high", pa.float64()),
                            ("chance", pa.float64()), ("n_seeds", pa.int64())])
RUNS_SCHEMA = pa.schema([("run_id", pa.string()), ("job", pa.string()), ("status", pa.string()),
                         ("started_at", pa.timestamp("us", tz="UTC")), ("finished_at", pa.timestamp("us", tz="UTC"))])
STORAGE_SCHEMA = pa.schema([("kind", pa.string()), ("shard", pa.string()), ("aam_version", pa.string()),
                            ("path", pa.string()), ("bytes", pa.int64())])

SHARD_FROM_FILE = r"regexp_extract(filename, '([^/]+)\.parquet$', 1)"
SHARD_FROM_DIR = r"regexp_extract(filename, '/([^/]+)/(attempts/[^/]+/)?[^/]+\.parquet$', 1)"  # latents/<shard>/[attempts/<id>/]x


class CatalogError(StoreError):
    pass


def catalog_dir(store: FeatureStore) -> Path:
    """The store root itself, or for an object store a local cache folder named after its URL."""
    if store.local:
        return store.root
    base = settings().catalog_dir or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "splavu", "catalogs")
    url = store.files.url
    name = re.sub(r"[^A-Za-z0-9_.-]+", "_", url)[:80] + "-" + hashlib.sha256(url.encode()).hexdigest()[:8]
    return Path(base) / name


def catalog_path(store: FeatureStore) -> Path:
    return catalog_dir(store) / CATALOG_FILE


# ---------------------------------------------------------------- SQL helpers

def sql_literal(s: str) -> str:
    return "'" + str(s).replace("'", "''") + "'"


def _duck_type(t: pa.DataType) -> str:
    if pa.types.is_string(t) or pa.types.is_large_string(t):
        return "VARCHAR"
    if pa.types.is_fixed_size_list(t):
        return f"{_duck_type(t.value_type)}[{t.list_size}]"
    if pa.types.is_list(t):
        return f"{_duck_type(t.value_type)}[]"
    if pa.types.is_timestamp(t):
        return "TIMESTAMPTZ" if t.tz else "TIMESTAMP"
    simple = {pa.int32(): "INTEGER", pa.int64(): "BIGINT", pa.float32(): "FLOAT", pa.float64(): "DOUBLE",
              pa.bool_(): "BOOLEAN"}
    return simple[t]


def _empty_select(schema: pa.Schema, extra: tuple[str, ...] = ()) -> str:
    """A SELECT with the schema's columns (+ VARCHAR extras) and no rows: queries on it still work."""
    cols = [f"NULL::VARCHAR AS {c}" for c in extra] + \
           [f'NULL::{_duck_type(f.type)} AS "{f.name}"' for f in schema]
    return f"SELECT {', '.join(cols)} WHERE false"


def _first_line(e: Exception) -> str:
    return str(e).strip().splitlines()[0]


def _dataset_sql(shard_expr: str) -> str:
    return f"regexp_extract({shard_expr}, '^(.*)-[0-9]+$', 1)"


def _parquet_view(con, name: str, store: FeatureStore, pattern: str | list[str] | None, select: str, empty: str) -> int:
    """CREATE VIEW name over read_parquet(pattern) if any file matches now, else over `empty`.
    `pattern` is a key glob of the store, or an explicit list of keys. `select` is formatted with
    {src} = the read_parquet(...) call. Returns the files matched."""
    if isinstance(pattern, list):
        files = pattern
        arg = "[" + ", ".join(sql_literal(store.files.duck_url(k)) for k in files) + "]"
    else:
        files = store.files.match(pattern) if pattern else []  # like DuckDB's glob, but `*` skips hidden names (temp files)
        arg = sql_literal(store.files.duck_url(pattern)) if pattern else "''"
        pattern = store.loc(pattern) if pattern else None
    src = f"read_parquet({arg}, union_by_name=true, filename=true)"
    try:
        con.sql(f"CREATE OR REPLACE VIEW {name} AS {select.format(src=src) if files else empty}")
        con.sql(f"SELECT count(*) FROM {name}").fetchall()  # reads every footer: a broken file fails the build here
    except duckdb.Error as e:
        raise CatalogError(f"catalog view {name!r} over {pattern} does not read ({_first_line(e)}); the old catalog is left "
                           f"intact. Fix or re-publish the file named above and rebuild.") from e
    return len(files)


# ---------------------------------------------------------------- storage table

def _classify(rel: Path) -> tuple[str, str | None, str | None]:
    """(kind, shard, aam_version) of a path relative to the store root."""
    parts = rel.parts
    top = parts[0] if len(parts) > 1 else ""
    if top == "latents":
        if parts[1].startswith("."):
            return "staging", None, None
        return ("raw_latents" if "latents.zarr" in parts[2:] else "raw_index"), parts[1], None
    if top == "_locks":
        return "store_meta", None, None
    if top == "anonymized" and len(parts) == 3:
        return "anonymized", Path(parts[2]).stem, parts[1]
    if top == "aam":
        return "aam", None, parts[1]
    if top == "manifests":
        return "manifests", Path(parts[1]).stem, None
    if top == "labels":  # private attr_* / subject_id / group: listed here by path and size, never readable through a view
        return "private_labels", Path(parts[1]).stem, None
    if top == "neighbors" and len(parts) > 2:  # splavu_core.serve.neighbors: a version's anonymized features, normalised
        return "neighbor_index", None, parts[1]
    if top in ("metrics", "runs", "datasets", "erasure"):
        return top, None, None
    if top == ".trash":
        return "trash", None, None
    if rel.name.startswith((CATALOG_FILE, ".catalog.")) or rel.name == "storage.parquet":
        return "catalog", None, None
    if rel.name == "aam_versions.parquet":
        return "aam", None, None
    if len(parts) == 1:
        return "store_meta", None, None  # store.json, lock files
    return "other", None, None


def storage_table(store: FeatureStore) -> pa.Table:
    rows = []
    for key, size in store.files.walk(""):
        kind, shard, version = _classify(Path(key))
        rows.append({"kind": kind, "shard": shard, "aam_version": version, "path": key, "bytes": size})
    rows.sort(key=lambda r: r["path"])
    return pa.Table.from_pylist(rows, schema=STORAGE_SCHEMA)


# ---------------------------------------------------------------- build

def _feature_dim(store: FeatureStore, version: str | None) -> int | None:
    """D for FLOAT[D]: from a published file's schema, else the version's config, else a raw shard."""
    dirs = [anonymized_key(version)] if version else []
    dirs += [anonymized_key(v) for v in store.files.listdir("anonymized")]
    for d in dirs:
        for f in sorted(store.files.glob(d, ".parquet")):
            try:
                t = store.files.parquet_schema(f).field("feature").type
            except Exception:
                continue
            if pa.types.is_fixed_size_list(t):
                return t.list_size
    vt = read_versions(store)
    for cfg in vt.filter(vt["version"] == version)["config"].to_pylist() if version else []:
        c = json.loads(cfg)
        if "dim" in c:
            return int(c.get("keep") or c["dim"])  # a keep adapter publishes k wide
    for shard in store.committed_shards():
        return int(store.committed(shard)["dim"])
    return None


def _anonymized_views(con, store: FeatureStore, version: str | None, dim: int | None, leaving=()) -> dict:
    feat = f"feature::FLOAT[{dim}]" if dim else "feature"
    shard = SHARD_FROM_FILE
    select = (f"SELECT {_dataset_sql(shard)} AS dataset, {shard} AS shard, * EXCLUDE (filename) "
              f"REPLACE ({feat} AS feature) FROM {{src}}")
    schema = anonymized_schema(dim) if dim else anonymized_schema(1).set(
        7, pa.field("feature", pa.list_(pa.float32())))
    empty = _empty_select(schema, ("dataset", "shard"))
    current = f"{anonymized_key(version)}/*.parquet" if version else None  # None: no current version yet
    n_cur = _parquet_view(con, "anonymized_features", store, current, select, empty)
    approved = [k for v in approved_versions(store) if v not in leaving
                for k in store.files.match(f"{anonymized_key(v)}/*.parquet")]
    n_all = _parquet_view(con, "anonymized_features_all", store, approved, select, empty)
    return {"anonymized_features": n_cur, "anonymized_features_all": n_all}


def _shard_files(store: FeatureStore, name: str) -> str | list[str]:
    """latents/*/<name> locally (the rename commit: every shard folder is complete); on an object store the
    committed attempt of each shard, explicitly (a glob would also match attempts no marker names)."""
    if store.local:
        return f"latents/*/{name}"
    return [key for s in store.committed_shards() if (key := store.shard_file(s, name))]


def _create_views(con, store: FeatureStore, version: str | None, dim: int | None, leaving=()) -> dict:
    files = {}
    s = SHARD_FROM_FILE
    # attr_*, subject_id and group are private (evaluation only, store.is_private_column): never in an analyst's view
    files["videos"] = _parquet_view(
        con, "videos", store, "manifests/*.parquet",
        f"SELECT {_dataset_sql(s)} AS dataset, {s} AS shard, "
        f"COLUMNS(lambda c: c <> 'filename' AND NOT starts_with(c, '{PRIVATE_PREFIX}') AND "
        f"c NOT IN ({', '.join(repr(c) for c in PRIVATE_COLUMNS)})) FROM {{src}}",
        _empty_select(VIDEOS_SCHEMA, ("dataset", "shard")))
    s = SHARD_FROM_DIR
    files["clips"] = _parquet_view(
        con, "clips", store, _shard_files(store, "clips.parquet"),
        f"SELECT {_dataset_sql(s)} AS dataset, {s} AS shard, * EXCLUDE (filename) FROM {{src}}",
        _empty_select(CLIP_INDEX_SCHEMA, ("dataset", "shard")))
    files["quarantine"] = _parquet_view(
        con, "quarantine", store, _shard_files(store, "quarantine.parquet"),
        f"SELECT {_dataset_sql(s)} AS dataset, * EXCLUDE (filename) FROM {{src}}",
        _empty_select(QUARANTINE_SCHEMA, ("dataset",)))
    files.update(_anonymized_views(con, store, version, dim, leaving))
    for name, sub, schema in (("metrics", "metrics", METRICS_SCHEMA), ("runs", "runs", RUNS_SCHEMA)):
        files[name] = _parquet_view(con, name, store, f"{sub}/*.parquet",
                                    "SELECT * EXCLUDE (filename) FROM {src}", _empty_select(schema))
    files["aam_versions"] = _parquet_view(con, "aam_versions", store, VERSIONS_KEY,
                                          "SELECT * EXCLUDE (filename) FROM {src}", _empty_select(VERSIONS_SCHEMA))
    files["erasures"] = _parquet_view(con, "erasures", store, f"{LOG_DIR}/*.parquet",
                                      "SELECT * EXCLUDE (filename) FROM {src}", _empty_select(LOG_SCHEMA))
    files["storage"] = _parquet_view(con, "storage", store, "storage.parquet",
                                     "SELECT * EXCLUDE (filename) FROM {src}", _empty_select(STORAGE_SCHEMA))
    return files


def _check_not_locked(target: Path) -> None:
    """Refuse while another process holds the catalog open for writing (DuckDB takes an exclusive
    lock then): replacing the file under it would silently drop whatever it writes."""
    if not target.is_file():
        return
    try:
        duckdb.connect(str(target), read_only=True).close()
    except (duckdb.IOException, duckdb.ConnectionException) as e:
        raise CatalogError(f"{target} is held open for writing by another connection; close it and rebuild. "
                           f"The old catalog is left intact. ({e})") from e


def _remove_stale_temps(root: Path) -> None:
    for p in root.glob(".catalog.*.duckdb*"):
        try:
            if time.time() - p.stat().st_mtime > STALE_TEMP_S:
                p.unlink()
        except FileNotFoundError:
            pass


def build_catalog(store: FeatureStore, leaving=()) -> dict:
    """(Re)build <root>/catalog.duckdb; idempotent. Returns {path, version, dim, files, rows, seconds}
    (files and rows per view). A view that does not read (e.g. a corrupted Parquet file) raises
    CatalogError naming it and leaves the old catalog in place. leaving: versions whose tables are about to be
    deleted (retention, an erasure): no view names them (the current version's is never left out)."""
    t0 = time.perf_counter()
    if not store.files.isdir(""):
        raise CatalogError(f"no store at {store.root.resolve() if store.local else store.root}")
    root = catalog_dir(store).resolve()
    root.mkdir(parents=True, exist_ok=True)
    target = root / CATALOG_FILE
    _check_not_locked(target)
    _remove_stale_temps(root)
    store.migrate_private_labels()  # a store written before labels/ existed: its manifests still hold attr_*
    store.files.write_parquet("storage.parquet", storage_table(store))
    version = current_version(store)
    dim = _feature_dim(store, version)

    tmp = root / f".catalog.{os.getpid()}.{uuid.uuid4().hex[:8]}.duckdb"
    try:
        con = duckdb.connect(str(tmp))
        try:
            store.files.register_duckdb(con)
            files = _create_views(con, store, version, dim, set(leaving) - {version})
            rows = {view: con.sql(f"SELECT count(*) FROM {view}").fetchall()[0][0] for view in files}
            con.sql("CHECKPOINT")
        finally:
            con.close()
        _check_not_locked(target)  # again: someone may have opened it while we built
        Path(f"{target}.wal").unlink(missing_ok=True)  # a stale WAL of the old file must not replay onto the new one
        os.replace(tmp, target)
    finally:
        for p in (tmp, Path(f"{tmp}.wal")):
            p.unlink(missing_ok=True)
    return {"path": str(target), "version": version, "dim": dim, "files": files, "rows": rows,
            "seconds": time.perf_counter() - t0}


# ---------------------------------------------------------------- what fills anonymized_features

def empty_reason(store: FeatureStore) -> str | None:
    """Why anonymized_features has no rows and what would fill it; None when a version is current."""
    if current_version(store):
        return None
    versions = read_versions(store).to_pylist()
    if not versions:
        return "no AAM version has been trained yet: `splavu train`, then `splavu publish`."
    newest = max(versions, key=lambda r: (r["created_at"], r["version"]))["version"]
    refused = refused_versions(store).get(newest)
    if refused:
        return (f"AAM version {newest} was refused by the privacy budget ({refused['why']}), so no version is current. "
                f"Train one that removes more leakage (`splavu train`), then `splavu publish`; the data engineer can "
                f"inspect the refused table in {store.loc(anonymized_key(newest))} (outside the analyst catalog).")
    done, total = len(published_shards(store, newest)), len(store.committed_shards())
    return (f"no AAM version is current yet: version {newest} is published on {done} of {total} shards and becomes "
            f"current once all are published and it passes the privacy budget: `splavu publish`.")
