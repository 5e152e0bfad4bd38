"""The analysts' interface is read-only and never shows a version the privacy budget refused (issue 13, items 3-4).

Real DuckDB catalog over real Parquet and Zarr files of a hand-built store (no encoder needed)."""
import json

import pytest
from test_publish_catalog import make_adapter, publish, store  # noqa: F401  (store: a fixture)

from pipeline.cli import main
from splavu_core.publish import anonymized_tables as pub
from splavu_core.serve import analyst
from splavu_core.serve import catalog as cat
from splavu_core.store import ledger


def cli(capsys, *argv):
    rc = main(list(argv))
    out = capsys.readouterr()
    return rc, out.out, out.err


@pytest.fixture
def catalog(store):  # noqa: F811
    publish(store, make_adapter(store), ["ar-000", "ar-001", "tad-000"])
    cat.build_catalog(store)
    return store


def attacks(root):
    """Each statement that succeeded on the analyst connection before (issue 13, item 3), and what it would leave."""
    chunk = next(p for p in (root / "latents").rglob("latents.zarr/clips/c/*/*") if p.is_file())
    return {
        "copy anywhere": (f"COPY (SELECT * FROM videos) TO '{root.parent / 'out.csv'}'", root.parent / "out.csv"),
        "attach + create": (f"ATTACH '{root.parent / 'x.duckdb'}' AS x; CREATE TABLE x.t AS SELECT * FROM videos",
                            root.parent / "x.duckdb"),
        "read any file": ("SELECT * FROM read_csv('/etc/hostname')", None),
        "raw latent chunks": (f"SELECT * FROM read_blob('{root}/latents/*/latents.zarr/clips/c/*/*')", None),
        "raw latent chunk": (f"SELECT content FROM read_blob('{chunk}')", None),
        "inject a manifest row": (f"COPY (SELECT * FROM videos LIMIT 1) TO '{root}/manifests/x-999.parquet'",
                                  root / "manifests" / "x-999.parquet"),
        "overwrite a manifest": (f"COPY (SELECT * FROM videos LIMIT 1) TO '{root}/manifests/ar-000.parquet'", None),
        "unlock": ("SET enable_external_access = true", None),
    }


@pytest.mark.parametrize("name", [
    "copy anywhere", "attach + create", "read any file", "raw latent chunks", "raw latent chunk",
    "inject a manifest row", "overwrite a manifest", "unlock"])
def test_sql_refuses_everything_but_reading_the_views(catalog, capsys, name):
    root = catalog.root
    before = {p: p.stat().st_mtime_ns for p in root.rglob("*") if p.is_file()}
    sql, leftover = attacks(root)[name]
    rc, out, err = cli(capsys, "--store", str(root), "sql", sql)
    assert rc == 2 and "read-only" in err, (out, err)
    assert leftover is None or not leftover.exists()
    assert {p: p.stat().st_mtime_ns for p in root.rglob("*") if p.is_file()} == before  # nothing written
    with pytest.raises(cat.CatalogError, match="read-only"):  # the library entry point too
        analyst.query(catalog, sql)


def test_views_still_read_on_the_locked_connection(catalog, capsys):
    rc, out, _ = cli(capsys, "--store", str(catalog.root), "sql",
                     "SELECT (SELECT count(*) FROM clips) AS clips, (SELECT count(*) FROM videos) AS videos, "
                     "(SELECT count(*) FROM anonymized_features) AS anon, (SELECT count(*) FROM quarantine) AS q, "
                     "(SELECT count(*) FROM storage) > 0 AS storage", "--format", "json")
    assert rc == 0 and json.loads(out) == [{"clips": 30, "videos": 10, "anon": 30, "q": 0, "storage": True}]
    rc, out, _ = cli(capsys, "--store", str(catalog.root), "sql", "DESCRIBE anonymized_features")
    assert rc == 0 and "feature" in out


def test_a_refused_version_is_not_in_the_analyst_views(store, capsys):  # noqa: F811
    """v1 passed the gate (current); v2 is published everywhere but refused: analysts never see its rows, not even
    through a path to its files; the engineer still reads them with publish.read_anonymized."""
    v1 = publish(store, make_adapter(store, seed=1), ["ar-000", "ar-001", "tad-000"])
    v2 = publish(store, make_adapter(store, seed=2), ["ar-000", "ar-001", "tad-000"], make_current=False)
    ledger.record_refusal(store, v2, "leakage removed 0.037 < budget 0.5")
    cat.build_catalog(store)
    got = analyst.query(store, "SELECT DISTINCT aam_version FROM anonymized_features_all")["aam_version"].to_pylist()
    assert got == [v1]
    rc, _, err = cli(capsys, "--store", str(store.root), "sql",
                     f"SELECT count(*) FROM read_parquet('{store.root}/anonymized/{v2}/*.parquet')")
    assert rc == 2 and "read-only" in err
    assert pub.read_anonymized(store, v2).num_rows == 30  # the data engineer's path, outside the catalog


def test_sql_says_why_the_current_table_is_empty(store, capsys):  # noqa: F811
    v = publish(store, make_adapter(store), ["ar-000", "ar-001", "tad-000"], make_current=False)
    ledger.record_refusal(store, v, "leakage removed 0.037 < budget 0.5")
    cat.build_catalog(store)
    rc, out, err = cli(capsys, "--store", str(store.root), "sql", "SELECT count(*) AS n FROM anonymized_features")
    assert rc == 0 and "0" in out
    assert f"AAM version {v}" in err and "refused by the privacy budget" in err
    assert "leakage removed 0.037 < budget 0.5" in err and "splavu publish" in err
    rc, out, err = cli(capsys, "--store", str(store.root), "sql", "SELECT count(*) AS n FROM videos")
    assert rc == 0 and err == ""  # no notice for queries that do not read it


def test_object_store_connection_is_locked_down_too(tmp_path, monkeypatch):
    """memory:// through the same fsspec path as s3://: the registered filesystem carries the store's write
    credentials, so DuckDB's path check is what keeps analysts to the views' files."""
    import uuid

    from test_object_store import generation

    from splavu_core.store.feature_store import FeatureStore

    monkeypatch.setenv("SPLAVU_CATALOG_DIR", str(tmp_path / "catalogs"))
    store = FeatureStore(f"memory://ro-{uuid.uuid4().hex[:8]}/store")
    store.write_shard("ar-000", generation(1), {"encoder_fingerprint": "fp"}, "h")
    cat.build_catalog(store)
    assert analyst.query(store, "SELECT count(*) AS n FROM clips")["n"][0].as_py() == generation(1).index.num_rows
    chunks = [k for k, _ in store.files.walk("latents") if "/latents.zarr/clips/c/" in k]
    for sql in (f"SELECT content FROM read_blob('{store.files.duck_url(chunks[0])}')",
                f"COPY (SELECT 1 AS x) TO '{store.files.duck_url('manifests/x-999.parquet')}'"):
        with pytest.raises(cat.CatalogError, match="read-only"):
            analyst.query(store, sql)
    assert not store.files.exists("manifests/x-999.parquet")


def test_missing_catalog_fix_names_the_store(tmp_path, capsys):
    (tmp_path / "s").mkdir()  # a store folder without a catalog (a missing folder is refused before, see walkthrough)
    rc, _, err = cli(capsys, "--store", str(tmp_path / "s"), "sql", "SELECT 1")
    assert rc == 2 and f"splavu --store {tmp_path / 's'} publish" in err


def test_no_private_label_through_sql_from_any_parquet_file(catalog, capsys):
    """Every Parquet file of the store (and the globs over them), read through `splavu sql`: refused, or without a
    single private column: attr_*, subject_id (it links a person's videos without any attacker) or group. The
    fixture's manifests were written with attr_skin, subject_id and group (as before labels/ held them): building the
    catalog split them off, and the evaluation still reads them through the library."""
    root = catalog.root
    files = sorted(p for p in root.rglob("*.parquet") if p.is_file())
    assert any(p.parent.name == "labels" for p in files) and any(p.parent.name == "manifests" for p in files)
    paths = [str(p) for p in files] + [f"{root}/manifests/*.parquet", f"{root}/labels/*.parquet", f"{root}/**/*.parquet"]
    views = analyst.query(catalog, "SELECT view_name FROM duckdb_views() WHERE NOT internal")["view_name"].to_pylist()
    assert "videos" in views
    readable = []
    for src in [f"read_parquet('{p}')" for p in paths] + views:
        rc, out, err = cli(capsys, "--store", str(root), "sql", f"DESCRIBE SELECT * FROM {src}", "--format", "json")
        if rc == 0:
            readable.append(src)
            names = [r["column_name"] for r in json.loads(out)]
            assert names and not [n for n in names if n.startswith("attr_") or n in ("subject_id", "group")], \
                (src, names)
        else:
            assert "read-only" in err, (src, err)
    assert any("manifests" in s for s in readable) and not any("labels" in s for s in readable)
    # the evaluation's path: the library joins the labels back
    labels = catalog.read_shard_manifest("ar-000")
    assert labels["attr_skin"].to_pylist() == [0, 1, 0, 1] and labels["group"].to_pylist() == ["a", "b", "a", "b"]
    assert labels["subject_id"].to_pylist() == ["s0", "s1", "s2", "s3"]
    # nor as values under another name: no readable view holds a subject id
    for view in views:
        rc, out, _ = cli(capsys, "--store", str(root), "sql", f"SELECT * FROM {view}", "--format", "csv")
        assert rc == 0 and not any(f",s{i}," in f",{line}," for line in out.splitlines() for i in range(4)), view


def test_no_private_label_through_a_symbolic_link(catalog, capsys, tmp_path, monkeypatch):
    """Issue 27: DuckDB allowed its temp directory (`<cwd>/.tmp`) and followed symbolic links inside it, so a link
    `.tmp -> <store>/labels` read every private label. Now there is no temp directory, and a view's file reached
    through a link (here a manifest replaced by a link to its labels) is not allowed either."""
    root = catalog.root
    monkeypatch.chdir(tmp_path)
    (tmp_path / ".tmp").symlink_to(root / "labels")
    rc, out, _ = cli(capsys, "--store", str(root), "sql",
                     "SELECT value FROM duckdb_settings() WHERE name = 'allowed_directories'", "--format", "json")
    assert rc == 0 and json.loads(out) == [{"value": "[]"}]
    victim = root / "manifests" / "ar-001.parquet"
    victim.unlink()
    victim.symlink_to(root / "labels" / "ar-001.parquet")
    for sql in ["SELECT * FROM read_parquet('.tmp/ar-000.parquet')", "SELECT * FROM glob('.tmp/*')",
                f"SELECT * FROM read_parquet('{tmp_path}/.tmp/ar-000.parquet')", f"SELECT * FROM read_parquet('{victim}')"]:
        rc, out, err = cli(capsys, "--store", str(root), "sql", sql, "--format", "json")
        assert rc == 2 and "read-only" in err and "attr_" not in out, (sql, out, err)


# ---------------------------------------------------------------- a store that moves (issue 47, item 4)

def test_a_moved_store_answers_analysts_from_its_new_folder(catalog, capsys, tmp_path):
    """A store moved (or restored from a backup) to another folder serves `splavu sql` and `splavu neighbors` with the
    catalog it carries: the views name their files relative to the store root, and nothing reads the old folder."""
    from splavu_core.serve.neighbors import write_index
    from splavu_core.store.feature_store import FeatureStore

    write_index(catalog, ledger.current_version(catalog))
    sql = ("SELECT (SELECT count(*) FROM clips) AS clips, (SELECT count(*) FROM videos) AS videos, "
           "(SELECT count(*) FROM anonymized_features) AS anon, (SELECT count(*) FROM anonymized_features_all) AS every")
    rc, before, err = cli(capsys, "--store", str(catalog.root), "sql", sql, "--format", "json")
    assert rc == 0, err
    moved = tmp_path / "elsewhere" / "restored-store"
    moved.parent.mkdir()
    catalog.root.rename(moved)  # the old folder is gone: a view naming it could not read
    rc, after, err = cli(capsys, "--store", str(moved), "sql", sql, "--format", "json")
    assert rc == 0 and err == "" and json.loads(after) == json.loads(before) and json.loads(after)[0]["anon"] == 30
    video = analyst.query(FeatureStore(moved), "SELECT video_id FROM anonymized_features LIMIT 1")["video_id"][0].as_py()
    rc, out, err = cli(capsys, "--store", str(moved), "neighbors", video, "--k", "3", "--format", "json")
    assert rc == 0 and len(json.loads(out)) == 3, err
    # the analysts' limits hold in the new folder too
    rc, _, err = cli(capsys, "--store", str(moved), "sql", f"SELECT * FROM read_parquet('{moved}/labels/*.parquet')")
    assert rc == 2 and "read-only" in err


def test_a_copied_store_reads_its_own_files_not_the_originals(catalog, capsys, tmp_path):
    """A copy beside the original (a backup restored next to it): the copy's catalog names the original's files, yet
    analysts of the copy read the copy. Here the copy lost a shard's table: its answer says so, the original's not."""
    import shutil

    copy = tmp_path / "copy"
    shutil.copytree(catalog.root, copy)
    import pyarrow.parquet as pq

    part = copy / "anonymized" / ledger.current_version(catalog) / "tad-000.parquet"
    pq.write_table(pq.read_table(part).slice(0, 0), part)  # the copy's tad-000 table lost its rows
    sql = "SELECT count(*) AS n FROM anonymized_features"
    rc, out, err = cli(capsys, "--store", str(copy), "sql", sql, "--format", "json")
    assert rc == 0 and json.loads(out) == [{"n": 24}], err  # not the original's 30
    rc, out, err = cli(capsys, "--store", str(catalog.root), "sql", sql, "--format", "json")
    assert rc == 0 and json.loads(out) == [{"n": 30}], err


def test_a_catalog_naming_files_outside_the_store_says_so_and_not_that_the_query_is_wrong(catalog, capsys):
    """A view over a file outside the store (a catalog written by hand, or a copied one whose folder cannot be told):
    the error is the store's (rebuild the catalog), one line, not the analyst's ("read-only")."""
    import duckdb

    outside = catalog.root.parent / "elsewhere.parquet"
    outside.write_bytes((catalog.root / "storage.parquet").read_bytes())
    con = duckdb.connect(str(cat.catalog_path(catalog)))
    con.sql(f"CREATE VIEW extra AS SELECT * FROM read_parquet('{outside}')")
    con.close()
    rc, out, err = cli(capsys, "--store", str(catalog.root), "sql", "SELECT count(*) FROM videos")
    assert rc == 2 and err.count("\n") == 1 and "read-only" not in err, err
    assert "outside the store" in err and f"splavu --store {catalog.root} publish" in err
    assert "nothing is wrong with the query" in err
    cat.build_catalog(catalog)  # what the message says: rebuilt, it answers
    rc, out, err = cli(capsys, "--store", str(catalog.root), "sql", "SELECT count(*) AS n FROM videos", "--format", "json")
    assert rc == 0 and json.loads(out) == [{"n": 10}], err


# ---------------------------------------------------------------- the store changing under a query (issue 47, item 5)

def test_a_file_that_vanishes_under_a_query_is_retried_once_on_the_new_catalog(catalog, monkeypatch):
    """A writer that deletes a version's table rebuilds the catalog without it first; a reader still on the old
    catalog meets the vanished file, and its one retry, on the rebuilt catalog, answers."""
    import pyarrow.parquet as pq

    version = ledger.current_version(catalog)
    part = catalog.root / "anonymized" / version / "tad-000.parquet"
    moved_aside = pq.read_table(part)
    part.unlink()  # the store changed; the catalog still names the file
    rebuilt = []

    def pause(seconds):  # what happens meanwhile: the file is back (a re-publish) and the catalog rebuilt
        pq.write_table(moved_aside, part)
        rebuilt.append(cat.build_catalog(catalog))

    monkeypatch.setattr(analyst.time, "sleep", pause)
    before = dict(analyst.RETRIED)
    got = analyst.query(catalog, "SELECT count(*) AS n FROM anonymized_features_all")
    assert got["n"][0].as_py() == 30 and rebuilt
    assert sum(analyst.RETRIED.values()) == sum(before.values()) + 1


@pytest.mark.parametrize("view", ["anonymized_features", "anonymized_features_all"])
def test_a_store_that_keeps_changing_says_so_in_one_line(catalog, capsys, monkeypatch, view):
    """Nothing rebuilds the catalog after a table went away (a glob view, and a view listing its files by name,
    which DuckDB then reads as a folder): after the one retry, one line that blames the store, not the query."""
    version = ledger.current_version(catalog)
    for p in (catalog.root / "anonymized" / version).glob("*.parquet"):
        p.unlink()
    monkeypatch.setattr(analyst, "RETRY_PAUSE_S", 0.0)
    rc, out, err = cli(capsys, "--store", str(catalog.root), "sql", f"SELECT count(*) FROM {view}")
    assert rc == 2 and err.count("\n") == 1, err
    assert "the store changed while this query ran" in err and "nothing is wrong with the query" in err
    assert "read-only" not in err and "IO Error" not in err and "Permission Error" not in err


def test_a_parquet_file_replaced_while_it_was_read_is_the_stores_doing():
    """Under load during an erasure DuckDB once answered "Out of buffer" reading a table a writer was replacing; that
    is the store changing under the query (retried once, then one line), never the analyst's error."""
    import duckdb

    from splavu_core.serve import analyst

    torn = duckdb.InvalidInputException('Invalid Input Error: Out of buffer reading "/s/anonymized/v/ar-000.parquet"')
    assert analyst._store_changed(None, None, torn) == "/s/anonymized/v/ar-000.parquet changed while it was read"
    assert analyst._store_changed(None, None, duckdb.BinderException("Referenced column x not found")) is None
