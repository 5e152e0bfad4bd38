"""The analysts' connection to the catalog: read-only, locked down to the catalog views' own Parquet files.

query(), neighbors() (DuckDB's cosine scan; `splavu neighbors` uses splavu_core.serve.neighbors) and `splavu sql` all
open the catalog here: only SELECT / EXPLAIN statements, external access off except for exactly the Parquet files
the catalog's views name (their globs and what they match now), configuration locked. So nothing is written
anywhere, and raw latent chunks, private labels (labels/), refused versions' tables and any other file stay
unreadable, on local and object-store roots alike (DuckDB applies the same path check to a registered fsspec
filesystem). Plain `duckdb` on the catalog file has none of these limits: that is the data engineer's tool.
"""
from __future__ import annotations

import os
import re

import duckdb
import numpy as np
import pyarrow as pa

from splavu_core.serve.catalog import CatalogError, catalog_path, sql_literal
from splavu_core.store.feature_store import FeatureStore
from splavu_core.store.ledger import current_version

READ_ONLY_STATEMENTS = ("SELECT", "EXPLAIN")


class ReadOnlyError(CatalogError):
    pass


def _view_sources(con, store: FeatureStore) -> list[str]:
    """Every path or glob the catalog's views read, plus the files each glob matches now: all an analyst may open."""
    root = store.files.duck_url("")
    sql = " ".join(r[0] for r in con.sql("SELECT sql FROM duckdb_views() WHERE NOT internal AND sql IS NOT NULL")
                   .fetchall())
    found = {lit.replace("''", "'") for lit in re.findall(r"'((?:[^']|'')*)'", sql)}
    mine = sorted(u for u in found if u.startswith(root.rstrip("/") + "/"))
    keys = [u[len(root.rstrip("/")) + 1:] for u in mine]
    matched = [k for key in keys if "*" in key for k in store.files.match(key)]
    if store.local:  # duck_url resolves links: check the names the views reach first
        real = os.path.realpath(store.root)
        linked = [k for k in [*keys, *matched] if "*" not in k and os.path.realpath(store.files.loc(k)) != os.path.join(real, k)]
        if linked:  # DuckDB matches a view's glob by name, so a link cannot just be left out: refuse the connection
            raise ReadOnlyError(f"the catalog is read-only for analysts over the store's own files, and "
                                f"{store.files.loc(linked[0])} is a symbolic link (it could point at private labels): refused")
    return mine + [store.files.duck_url(k) for k in matched]


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
            _lock_down(con, store)
    except ReadOnlyError:
        con.close()
        raise
    except duckdb.Error as e:
        con.close()
        raise CatalogError(f"cannot open {p} (read_only={read_only}): {e}") from e
    return con


def query(store: FeatureStore, sql: str, read_only: bool = True, params: list | None = None) -> pa.Table:
    """Run `sql` on the catalog; the result as an Arrow table (empty for statements without one)."""
    con = _connect(store, read_only)
    try:
        if read_only:
            _check_read_only(con, sql)
        rel = con.sql(sql, params=params) if params else con.sql(sql)
        return rel.to_arrow_table() if rel is not None else pa.table({})
    except duckdb.PermissionException as e:
        raise ReadOnlyError(f"the catalog is read-only for analysts: its views' files only, nothing written ({e})") from e
    except duckdb.Error as e:  # e.g. a view over a file that was deleted or corrupted since the build
        if read_only and "configuration has been locked" in str(e):
            raise ReadOnlyError(f"the catalog is read-only for analysts: settings are locked ({e})") from e
        raise CatalogError(f"query failed on {catalog_path(store)}: {e}") from e
    finally:
        con.close()


def neighbors(store: FeatureStore, video_id: str, k: int = 10, reduce: str = "mean",
              dataset: str | None = None) -> pa.Table:
    """The k clips of the current anonymized table most cosine-similar to `video_id`'s mean (or
    first) clip, excluding that video's own clips: video_id, clip_index, split, similarity, dataset."""
    assert reduce in ("mean", "first"), f"reduce must be 'mean' or 'first', got {reduce!r}"
    assert k >= 1, f"k must be >= 1, got {k}"
    con = _connect(store)
    try:
        return _neighbors(con, store, video_id, k, reduce, dataset)
    except duckdb.Error as e:
        raise CatalogError(f"neighbors({video_id!r}) failed on {catalog_path(store)}: {e}") from e
    finally:
        con.close()


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
