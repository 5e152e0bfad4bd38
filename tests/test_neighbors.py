"""The neighbour index (splavu_core.serve.neighbors): exact against DuckDB's query and against a brute-force reference,
built from published features only, bypassed when stale, pruned with its version's tables; the approximate (faiss
IVF) mode on the same rows."""
import json

import numpy as np
import pyarrow as pa
import pytest
from test_publish_catalog import make_adapter, publish, store, write_fake_shard  # noqa: F401  (store: a fixture)

from splavu_core.publish import anonymized_tables as pub
from splavu_core.serve import analyst
from splavu_core.serve import catalog as cat
from splavu_core.serve import neighbors as nn


def test_index_answers_what_duckdb_answers(store):
    version = publish(store, make_adapter(store), ["ar-000", "ar-001", "tad-000"])
    cat.build_catalog(store)
    written = nn.refresh_indexes(store)
    assert written == {"written": [version], "pruned": []}
    index = nn.Index.open(store, version)
    assert index.from_index
    for vid, reduce, k in (("ar-000_v1", "mean", 5), ("tad-000_v0", "first", 100)):
        want = analyst.neighbors(store, vid, k=k, reduce=reduce)
        got = nn.neighbors(store, vid, k=k, reduce=reduce, index=index)
        assert got["video_id"].to_pylist() == want["video_id"].to_pylist()
        assert got["clip_index"].to_pylist() == want["clip_index"].to_pylist()
        assert got["dataset"].to_pylist() == want["dataset"].to_pylist()
        np.testing.assert_allclose(got["similarity"].to_numpy(), want["similarity"].to_numpy(), atol=1e-5)
    assert nn.neighbors(store, "tad-000_v0", k=100, index=index).num_rows == 27  # 30 clips less its own 3


def test_index_holds_published_features_never_raw(store):
    version = publish(store, make_adapter(store), ["ar-000", "ar-001", "tad-000"])
    built = nn.write_index(store, version)
    feats = np.load(f"{built['path']}/features.npy")
    published = pub.feature_matrix(pub.read_anonymized(store, version))
    unit = published / np.linalg.norm(published, axis=1, keepdims=True)
    ids = pa.ipc.open_file(pa.memory_map(f"{built['path']}/ids.arrow")).read_all()
    order = pub.read_anonymized(store, version)
    assert ids["video_id"].to_pylist() == order["video_id"].to_pylist()
    np.testing.assert_allclose(feats, unit, atol=1e-6)
    raw = np.concatenate([store.read_shard(s, with_static=False).clips for s in ("ar-000", "ar-001", "tad-000")])
    raw_unit = raw / np.linalg.norm(raw, axis=1, keepdims=True)
    assert np.abs(feats @ raw_unit.T).max() < 0.9999  # no published row is a (normalised) raw latent


def test_stale_index_is_bypassed_and_retention_prunes_it(store):
    old = publish(store, make_adapter(store, seed=1), ["ar-000", "ar-001"])
    nn.write_index(store, old)
    pub.anonymize_shard(store, "tad-000", store.loc("aam", old))  # a shard published after the index
    index = nn.Index.open(store, old)
    assert not index.from_index and "tad-000_v0" in index.ids["video_id"].to_pylist()
    assert nn.refresh_indexes(store)["written"] == [old] and nn.Index.open(store, old).from_index

    new = publish(store, make_adapter(store, seed=2), ["ar-000", "ar-001", "tad-000"])
    nn.refresh_indexes(store)
    assert nn.index_dir(store, new).is_dir()
    kept = pub.apply_retention(store, keep=1)
    assert kept["deleted"] == [old] and nn.prune_indexes(store) == [old]  # what anonymized_features does after it
    assert not nn.index_dir(store, old).exists() and nn.index_dir(store, new).is_dir()
    with pytest.raises(nn.NeighborsError, match=f"AAM version '{old}' is not recorded|no published tables"):
        nn.neighbors(store, "ar-000_v1", version=old)


def test_explains_an_empty_current_table(store):
    assert "no AAM version in" in _error(store, "ar-000_v1")
    version = publish(store, make_adapter(store), ["ar-000", "ar-001"], make_current=False)
    store.files.write_json(f"reports/privacy_budget/{version}.json", {"key": "k", "measure": {
        "leakage_removed": 0.04, "raw_cmap": 0.86, "anonymized_cmap": 0.85, "chance_cmap": 0.5}})
    msg = _error(store, "ar-000_v1")
    assert "no AAM version is current" in msg and f"{version} (" in msg and "2/3 shards published" in msg
    assert "refused by the privacy budget (leakage removed 0.040 < budget 0.5: FAILED)" in msg and f"--version {version}" in msg
    found = nn.neighbors(store, "ar-000_v1", k=3, version=version)
    assert found.num_rows == 3 and "ar-000_v1" not in found["video_id"].to_pylist()


def _error(store, video_id) -> str:
    with pytest.raises(nn.NeighborsError) as e:
        nn.neighbors(store, video_id)
    return str(e.value)


@pytest.mark.parametrize("kind", ["clustered", "random"])
def test_exact_search_equals_brute_force(kind):
    """Blocks smaller than the table (the merge across blocks), excluded rows, and a k larger than what is left."""
    rng = np.random.default_rng(0)
    n, d = 5_000, 24  # any width: it comes from the rows
    x = rng.standard_normal((n, d)).astype(np.float32)
    if kind == "clustered":
        x = x * 0.2 + rng.standard_normal((50, d)).astype(np.float32)[rng.integers(0, 50, n)]
    unit = x / np.linalg.norm(x, axis=1, keepdims=True)
    for i, k, block in ((0, 10, 512), (17, 10, 999), (4242, 100, 1 << 18)):
        exclude = np.array([i, i + 1, 3])
        rows, sims = nn.exact_top_k(unit, unit[i], k, exclude, block=block)
        full = unit @ unit[i]
        full[exclude] = -np.inf
        want = np.argsort(-full, kind="stable")[:k]
        assert rows.tolist() == want.tolist()
        np.testing.assert_allclose(sims, full[want], atol=1e-6)
    rows, _ = nn.exact_top_k(unit[:5], unit[0], 10, np.array([0]), block=2)
    assert sorted(rows.tolist()) == [1, 2, 3, 4]


def test_approximate_mode_probing_every_list_is_exact(store):
    version = publish(store, make_adapter(store), ["ar-000", "ar-001", "tad-000"])
    built = nn.write_index(store, version, approximate=True, nlist=4)
    assert built["ivf_lists"] == 4
    index = nn.Index.open(store, version)
    assert index.ivf is not None
    exact = nn.neighbors(store, "ar-000_v1", k=5, index=index, mode="exact")
    approx = nn.neighbors(store, "ar-000_v1", k=5, index=index, mode="approximate", nprobe=4)
    auto = nn.neighbors(store, "ar-000_v1", k=5, index=index)  # auto: the IVF index, since there is one
    for got in (approx, auto):
        assert got.drop_columns(["similarity"]).to_pylist() == exact.drop_columns(["similarity"]).to_pylist()
        np.testing.assert_allclose(got["similarity"].to_numpy(), exact["similarity"].to_numpy(), atol=1e-6)
    small = nn.write_index(store, version)  # 30 rows: below $SPLAVU_ANN_MIN_ROWS, so no IVF index
    assert small["ivf_lists"] is None and nn.Index.open(store, version).ivf is None
    with pytest.raises(nn.NeighborsError, match="no approximate index"):
        nn.neighbors(store, "ar-000_v1", k=5, version=version, mode="approximate")


def test_a_search_the_store_changed_under_is_retried_once(store, monkeypatch, capsys):
    """`splavu neighbors` while the version's index is swapped (or its tables retired): searched once more from the
    ledger; a store that keeps changing is said in one line, not a FileNotFoundError."""
    from pipeline.cli import main

    version = publish(store, make_adapter(store), ["ar-000", "ar-001", "tad-000"])
    cat.build_catalog(store)
    nn.write_index(store, version)
    real_open, calls = nn.Index.open, []

    def open_once_swapped(s, v):
        calls.append(v)
        if len(calls) == 1:
            raise FileNotFoundError(f"{nn.index_dir(s, v)}/features.npy")
        return real_open(s, v)

    monkeypatch.setattr(nn.Index, "open", staticmethod(open_once_swapped))
    monkeypatch.setattr(nn.time, "sleep", lambda s: None)
    got = nn.search(store, "ar-000_v1", k=3)
    assert got.num_rows == 3 and calls == [version, version]

    monkeypatch.setattr(nn.Index, "open", staticmethod(lambda s, v: (_ for _ in ()).throw(FileNotFoundError("gone"))))
    rc = main(["--store", str(store.root), "neighbors", "ar-000_v1", "--k", "3"])
    err = capsys.readouterr().err
    assert rc == 2 and err.count("\n") == 1 and "the store changed while this search ran" in err, err
