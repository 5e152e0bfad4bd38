"""The analysts' connection to the catalog: read-only, locked down to the catalog views' own Parquet files.

query(), neighbors() (DuckDB's cosine scan; `splavu neighbors` uses splavu_core.serve.neighbors) and `splavu sql` all
open the catalog here: only SELECT / EXPLAIN statements, external access off except for exactly the Parquet files
the catalog's views name (their globs and what they match now), configuration locked. So nothing is written
anywhere, and raw latent chunks, private labels (labels/), refused versions' tables and any other file stay
unreadable, on local and object-store roots alike (DuckDB applies the same path check to a registered fsspec
filesystem). Plain `duckdb` on the catalog file has none of these limits: that is the data engineer's tool.

Whose fault an error is, and what it says:
- the analyst's: a statement other than SELECT / EXPLAIN, a file no view names (ReadOnlyError: "read-only for
  analysts"), a bad query (CatalogError with DuckDB's message);
- the store's: a file a view names vanished, or a new one appeared under a view's glob, while the query ran (a
  version published, promoted or retired, retention, an erasure): retried once on a fresh connection (the new
  catalog), then StoreChangedError, one line saying so; a catalog whose views name files outside the store
  (StaleCatalogError: rebuild it).

A store moves: copied, moved or restored from a backup into another folder, its catalog still names the old
folder's files (the views hold absolute paths, so that plain `duckdb` reads them from anywhere). The connection sees
the folder the catalog was built in (the `storage` view's file) differ from the store's and recreates the views in
its own in-memory database over the store's files (_repoint): analysts read the store they asked for, nothing is
written, and the next rebuild writes the new paths.
"""
from __future__ import annotations

import os
import re
import time
from collections import Counter
from pathlib import PurePosixPath

import duckdb
import numpy as np
import pyarrow as pa

from splavu_core.serve.catalog import CatalogError, catalog_path, sql_literal
from splavu_core.store.feature_store import FeatureStore
from splavu_core.store.forget_records import JOURNAL_DIR
from splavu_core.store.ledger import current_version

READ_ONLY_STATEMENTS = ("SELECT", "EXPLAIN")


class ReadOnlyError(CatalogError):
    """The analyst's statement is not allowed (not a SELECT, or a file no view names)."""


class StoreChangedError(CatalogError):
    """Files under the views changed while the query ran, and again on the retry: the store's doing, not the query's."""


class StaleCatalogError(CatalogError):
    """The catalog names another folder's files (built before the store was moved or copied): rebuild it."""


RETRY_PAUSE_S = 0.1  # before the one retry: a writer that un-named files has rebuilt the catalog by then
RETRIED = Counter()  # retries this process made, by what changed ("vanished", "appeared"): benchmarks/concurrency.py
_QUOTED = r"'(?:[^']|'')*'"
# read_parquet's first argument: one path, or a list of them (DuckDB stores [...] as list_value(...))
_READ_PARQUET = re.compile(rf"read_parquet\(\s*(list_value\((?:{_QUOTED}|[\s,])*\)|\[(?:{_QUOTED}|[\s,])*\]|{_QUOTED})")
_LITERAL = re.compile(r"'((?:[^']|'')*)'")


def _view_files(con) -> list[str]:
    """The paths, URLs and globs the catalog's views pass to read_parquet, as written."""
    sql = " ".join(r[0] for r in con.sql("SELECT sql FROM duckdb_views() WHERE NOT internal AND sql IS NOT NULL")
                   .fetchall())
    return sorted({lit.replace("''", "'") for arg in _READ_PARQUET.findall(sql) for lit in _LITERAL.findall(arg)} - {""})


def _root(store: FeatureStore) -> str:
    """The store root as the views name it: the local folder with links resolved, or the object store's URL."""
    return os.path.realpath(store.root) if store.local else store.files.duck_url("").rstrip("/")


def _view_keys(con, store: FeatureStore) -> tuple[list[str], list[str]]:
    """(the views' paths as written, as keys of the store). Raises StaleCatalogError when a view names a file outside
    the store."""
    written, prefix = _view_files(con), _root(store) + "/"
    foreign = [w for w in written if not w.startswith(prefix)]
    if foreign:
        raise StaleCatalogError(
            f"the catalog {catalog_path(store)} names files outside the store {store.root} ({foreign[0]}): it was "
            f"built for a store in another place (nothing is wrong with the query). Rebuild it here: "
            f"`splavu --store {store.root} publish`, or materialise feature_catalog")
    return written, [w[len(prefix):] for w in written]


STORAGE_FILE = "/storage.parquet"  # every build writes it and its `storage` view reads it: where the catalog was built


def _built_in(con) -> str | None:
    """The store root the catalog was built for (from its `storage` view's file), None if it cannot tell."""
    found = [w[:-len(STORAGE_FILE)] for w in _view_files(con) if w.endswith(STORAGE_FILE)]
    return found[0] if len(found) == 1 else None


def _repoint(con, store: FeatureStore) -> None:
    """A local store moved or copied since its catalog was built: the catalog's views recreated in this connection's
    in-memory database with the store's own paths, and the catalog detached (module doc)."""
    old, root = _built_in(con), _root(store)
    if not store.local or old is None or old == root:
        return
    prefix = old + "/"

    def moved(m: re.Match) -> str:
        lit = m.group(1).replace("''", "'")
        return sql_literal(root + "/" + lit[len(prefix):]) if lit.startswith(prefix) else m.group(0)

    views = con.sql("SELECT sql FROM duckdb_views() WHERE database_name = 'catalog' AND NOT internal "
                    "AND sql IS NOT NULL").fetchall()
    con.sql("USE memory")
    for (sql,) in views:
        con.sql(_LITERAL.sub(moved, sql))
    con.sql("DETACH catalog")


def _view_sources(con, store: FeatureStore) -> list[str]:
    """Every path or glob the catalog's views read, plus the files each glob matches now: all an analyst may open."""
    written, keys = _view_keys(con, store)
    matched = [k for key in keys if "*" in key for k in store.files.match(key)]
    if store.local:  # duck_url resolves links: check the names the views reach first
        real = _root(store)
        linked = [k for k in [*keys, *matched] if "*" not in k and os.path.realpath(store.files.loc(k)) != os.path.join(real, k)]
        if linked:  # DuckDB matches a view's glob by name, so a link cannot just be left out: refuse the connection
            raise ReadOnlyError(f"the catalog is read-only for analysts over the store's own files, and "
                                f"{store.files.loc(linked[0])} is a symbolic link (it could point at private labels): refused")
    return sorted({*written, *(store.files.duck_url(k) for k in matched)})


def _lock_down(con, store: FeatureStore) -> None:
    """No file access but the views' own Parquet files, and no way to turn that back on. DuckDB adds its temp
    directory (default `<cwd>/.tmp`) to the allowed directories and follows symbolic links inside it, so there is
    none (queries do not spill to disk); and a view file reached through a symbolic link refuses the connection."""
    allowed = _view_sources(con, store)
    con.sql("SET temp_directory = ''")
    con.execute("SET allowed_paths = ?", [allowed])
    con.sql("SET enable_external_access = false")
    con.sql("SET lock_configuration = true")


def _check_read_only(con, sql: str) -> None:
    try:
        kinds = [st.type.name for st in con.extract_statements(sql)]
    except duckdb.Error:
        return  # a syntax error: let the query itself report it
    refused = [k for k in kinds if k not in READ_ONLY_STATEMENTS]
    if refused:
        raise ReadOnlyError(f"the catalog is read-only for analysts: only SELECT queries on its views run "
                            f"(refused: {', '.join(refused)})")


def _connect(store: FeatureStore, read_only: bool = True):
    """A connection on the catalog; read_only: the analysts' locked-down connection (module doc)."""
    p = catalog_path(store)
    if not p.is_file():
        raise CatalogError(f"no catalog at {p}: build it first (build_catalog / the `catalog` asset)")
    # ATTACH into a fresh in-memory database rather than duckdb.connect(p): connect() shares one
    # instance per path within a process, so while any old connection lives it would keep
    # answering from the replaced (stale) catalog file.
    con = duckdb.connect()
    try:
        store.files.register_duckdb(con)  # object stores: the views read through the store's fsspec filesystem
        con.sql(f"ATTACH {sql_literal(p)} AS catalog{' (READ_ONLY)' if read_only else ''}")
        con.sql("USE catalog")
        if read_only:
            _repoint(con, store)  # a store moved since its catalog was built: its own files
            _lock_down(con, store)
    except CatalogError:
        con.close()
        raise
    except duckdb.Error as e:
        con.close()
        if gone := _vanished(e):  # (re)creating a view over a file a writer just removed
            raise _Changed(gone) from e
        raise CatalogError(f"cannot open {p} (read_only={read_only}): {e}") from e
    return con


class _Changed(CatalogError):
    """The store changed while a connection opened (retried by _on_catalog)."""


def _quoted(e: Exception) -> str:
    m = re.search(r'"([^"]+)"', str(e))
    return m.group(1) if m else ""


def _vanished(e: duckdb.Error) -> str | None:
    """'<file> went away' when `e` says a file DuckDB was to read is not there (any more)."""
    if isinstance(e, duckdb.IOException) and any(s in str(e) for s in (
            "No files found that match the pattern", "No such file or directory", "Cannot open file",
            "Could not open file", "does not exist")):
        return f"{_quoted(e) or 'a file'} went away"
    return None


def _torn(e: duckdb.Error) -> str | None:
    """'a file changed while it was read' when `e` is DuckDB reading a Parquet file a writer was replacing (seen under
    load during an erasure: "Out of buffer")."""
    if any(s in str(e) for s in ("Out of buffer", "No magic bytes found at end of file")):
        return f"{_quoted(e) or 'a file'} changed while it was read"
    return None


def _store_changed(con, store: FeatureStore, e: duckdb.Error) -> str | None:
    """What changed under the views when `e` is the store's doing (a file a view names vanished, appeared under a
    view's glob after this connection listed the files it may open, or was replaced while it was read); None when it
    is the query's."""
    if gone := _vanished(e) or _torn(e):
        return gone
    if isinstance(e, duckdb.PermissionException) and (path := _quoted(e)):
        try:
            _, keys = _view_keys(con, store)
        except CatalogError:
            return None
        root = _root(store) + "/"
        if not path.startswith(root):
            return None
        key = path[len(root):]
        parts = PurePosixPath(key).parts
        if any(len(PurePosixPath(k).parts) == len(parts) and PurePosixPath(key).match(k) for k in keys):
            return f"{key} appeared under a view"
        # a file a view lists by name that is gone: DuckDB then reads the name as a folder (<file>/**/*.parquet)
        if gone := next((k for k in keys if "*" not in k and key.startswith(k + "/")), None):
            return f"{gone} went away"
    return None


def _changed_message(store: FeatureStore, what: str) -> str:
    busy = " (an erasure is in progress in this store)" if store.files.listdir(JOURNAL_DIR) else ""
    return (f"the store changed while this query ran, and again when it was retried: {what}{busy}. A version being "
            f"published, promoted or retired, retention or an erasure rewrites the files under the views; nothing is "
            f"wrong with the query: run it again in a moment")


def _on_catalog(store: FeatureStore, read_only: bool, work, what: str):
    """work(con) on a fresh connection; once more on another when the store changed under it (module doc)."""
    for attempt in (0, 1):
        try:
            con = _connect(store, read_only)
        except _Changed as e:
            if attempt == 0:
                RETRIED["vanished"] += 1
                time.sleep(RETRY_PAUSE_S)
                continue
            raise StoreChangedError(_changed_message(store, str(e))) from e
        try:
            return work(con)
        except duckdb.Error as e:
            changed = _store_changed(con, store, e)
            if changed and attempt == 0:
                RETRIED["appeared" if changed.endswith("appeared under a view") else "vanished"] += 1
                time.sleep(RETRY_PAUSE_S)
                continue
            if changed:
                raise StoreChangedError(_changed_message(store, changed)) from e
            if isinstance(e, duckdb.PermissionException):
                raise ReadOnlyError(f"the catalog is read-only for analysts: its views' files only, nothing written "
                                    f"({e})") from e
            if read_only and "configuration has been locked" in str(e):
                raise ReadOnlyError(f"the catalog is read-only for analysts: settings are locked ({e})") from e
            raise CatalogError(f"{what} failed on {catalog_path(store)}: {e}") from e
        finally:
            con.close()


def query(store: FeatureStore, sql: str, read_only: bool = True, params: list | None = None) -> pa.Table:
    """Run `sql` on the catalog; the result as an Arrow table (empty for statements without one)."""
    def work(con):
        if read_only:
            _check_read_only(con, sql)
        rel = con.sql(sql, params=params) if params else con.sql(sql)
        return rel.to_arrow_table() if rel is not None else pa.table({})

    return _on_catalog(store, read_only, work, "query")


def neighbors(store: FeatureStore, video_id: str, k: int = 10, reduce: str = "mean",
              dataset: str | None = None) -> pa.Table:
    """The k clips of the current anonymized table most cosine-similar to `video_id`'s mean (or
    first) clip, excluding that video's own clips: video_id, clip_index, split, similarity, dataset."""
    assert reduce in ("mean", "first"), f"reduce must be 'mean' or 'first', got {reduce!r}"
    assert k >= 1, f"k must be >= 1, got {k}"
    return _on_catalog(store, True, lambda con: _neighbors(con, store, video_id, k, reduce, dataset),
                       f"neighbors({video_id!r})")


def _neighbors(con, store: FeatureStore, video_id: str, k: int, reduce: str, dataset: str | None) -> pa.Table:
    own = con.sql("SELECT dataset, clip_index, feature FROM anonymized_features WHERE video_id = ? "
                  "AND (? IS NULL OR dataset = ?) ORDER BY dataset, clip_index",
                  params=[video_id, dataset, dataset]).to_arrow_table()
    if own.num_rows == 0:
        raise CatalogError(f"video {video_id!r}{f' of dataset {dataset!r}' if dataset else ''} is not in the "
                           f"current anonymized table (anonymized_features, AAM version {current_version(store)})")
    found = sorted(set(own["dataset"].to_pylist()))
    if len(found) > 1:
        raise CatalogError(f"video {video_id!r} is in several datasets {found}: pass dataset=")
    feats = np.asarray(own["feature"].to_pylist(), np.float32)  # (n_clips, D)
    q = feats.mean(0) if reduce == "mean" else feats[0]
    d = len(q)
    return con.sql(f"SELECT video_id, clip_index, split, array_cosine_similarity(feature, ?::FLOAT[{d}]) "
                   f"AS similarity, dataset FROM anonymized_features WHERE NOT (video_id = ? AND dataset = ?) "
                   f"ORDER BY similarity DESC, dataset, video_id, clip_index LIMIT {int(k)}",
                   params=[q.tolist(), video_id, found[0]]).to_arrow_table()
