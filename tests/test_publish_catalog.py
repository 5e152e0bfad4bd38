"""Publishing anonymized tables (guards, versions, retention, purges) and the DuckDB catalog.

A store is built by hand (random latents, no video, no encoder) and the adapter is a fresh AAM
whose zero-initialised output layers are randomised: it looks trained, and is not the identity."""
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from splavu_core.aam import AAMConfig, AnonymizingAdapter, save_adapter
from splavu_core.publish import anonymized_tables as pub
from splavu_core.serve import analyst
from splavu_core.serve import catalog as cat
from splavu_core.serve.tables import format_table
from splavu_core.store import ledger
from splavu_core.store.feature_store import QUARANTINE_SCHEMA, FeatureStore, ShardLatents

D = 16
FP = "videomae-test"


def write_fake_shard(store: FeatureStore, shard: str, n_videos: int = 4, clips_per_video: int = 3, seed: int = 0):
    rng = np.random.default_rng(seed)
    vids = [f"{shard}_v{i}" for i in range(n_videos)]
    splits = ["train", "test"] * n_videos
    idx = {"video_id": [], "clip_index": [], "start_frame": [], "end_frame": [], "start_s": [], "end_s": [], "split": []}
    for i, v in enumerate(vids):
        for c in reversed(range(clips_per_video)):  # stored out of order on purpose
            idx["video_id"].append(v), idx["clip_index"].append(c), idx["split"].append(splits[i])
            idx["start_frame"].append(16 * c), idx["end_frame"].append(16 * (c + 1))
            idx["start_s"].append(16 * c / 8.0), idx["end_s"].append(16 * (c + 1) / 8.0)
    n = len(idx["video_id"])
    index = pa.table(idx, schema=pa.schema([("video_id", pa.string()), ("clip_index", pa.int32()),
                                            ("start_frame", pa.int32()), ("end_frame", pa.int32()),
                                            ("start_s", pa.float64()), ("end_s", pa.float64()), ("split", pa.string())]))
    static_index = pa.table({"video_id": [v for v in vids for _ in range(2)], "k": pa.array([0, 1] * n_videos, pa.int32()),
                             "frame_index": pa.array([0, 10] * n_videos, pa.int32())})
    data = ShardLatents(clips=rng.standard_normal((n, D)).astype(np.float32), index=index,
                        static=rng.standard_normal((n_videos, 2, D)).astype(np.float32), static_index=static_index,
                        quarantine=QUARANTINE_SCHEMA.empty_table())
    store.write_shard(shard, data, {"encoder_fingerprint": FP}, manifest_hash="test")
    manifest = pa.table({"video_id": vids, "path": [f"{v}.mp4" for v in vids], "split": splits[:n_videos],
                         "action": ["walk", "run"] * (n_videos // 2),
                         "segments": [json.dumps([[0.0, 1.0, "walk"]])] * n_videos,
                         "anomaly": [0, 1] * (n_videos // 2),
                         "anomaly_intervals": [None, json.dumps([[0.5, 1.5]])] * (n_videos // 2),
                         "subject_id": [f"s{i}" for i in range(n_videos)], "group": ["a", "b"] * (n_videos // 2),
                         "attr_skin": [0, 1] * (n_videos // 2)})
    p = store.shard_manifest_path(shard)
    p.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(manifest, p)
    return data


def make_adapter(store: FeatureStore, seed: int = 1, fp: str = FP, identity: bool = False,
                 clip_context: bool = False) -> Path:
    torch.manual_seed(seed)
    cfg = AAMConfig(dim=D, layers=1, heads=2, sub_tokens=4, token_width=8, clip_context=clip_context)
    adapter = AnonymizingAdapter(cfg)
    if not identity:  # "trained-looking": the zero-initialised projections get random weights
        with torch.no_grad():
            for name, p in adapter.named_parameters():
                if name.endswith("proj.weight") or name.startswith("out."):
                    p.normal_(0, 0.3)
    tmp = store.root / "aam" / f"tmp-{seed}-{fp}-{identity}-{clip_context}"
    version = save_adapter(adapter, cfg, tmp, fp)
    final = store.root / "aam" / version
    if not final.exists():
        tmp.rename(final)
    return final


def version_of(adapter_dir: Path) -> str:
    return json.loads((adapter_dir / "adapter.json").read_text())["version"]


def publish(store, adapter_dir, shards, make_current=True) -> str:
    for s in shards:
        pub.anonymize_shard(store, s, adapter_dir)
    meta = json.loads((adapter_dir / "adapter.json").read_text())
    ledger.record_version(store, meta["version"], meta, {"ar_top1": 0.5}, make_current=make_current)
    return meta["version"]


@pytest.fixture
def store(tmp_path):
    s = FeatureStore(tmp_path / "store")
    write_fake_shard(s, "ar-000", seed=0)
    write_fake_shard(s, "ar-001", seed=1)
    write_fake_shard(s, "tad-000", n_videos=2, seed=2)
    return s


# ---------------------------------------------------------------- publishing

def test_published_table_schema_and_no_raw_rows(store):
    ad = make_adapter(store)
    info = pub.anonymize_shard(store, "ar-000", ad)
    assert not info["skipped"] and info["rows"] == 12 and info["dim"] == D and info["version"] == version_of(ad)
    t = pq.read_table(info["path"])
    assert t.schema == pub.anonymized_schema(D)
    assert t.schema.field("feature").type == pa.list_(pa.float32(), D)
    assert t.schema.field("created_at").type == pa.timestamp("us", tz="UTC")
    assert set(t["aam_version"].to_pylist()) == {version_of(ad)} and set(t["encoder_fingerprint"].to_pylist()) == {FP}
    raw = store.read_shard("ar-000", with_static=False)
    feats = pub.feature_matrix(t)
    assert np.isfinite(feats).all() and feats.shape == raw.clips.shape
    pub.assert_no_raw_latents(t, raw.clips)
    assert not np.isclose(feats, raw.clips, atol=1e-4).all(axis=1).any()
    assert t.select(list(pub.INDEX_COLUMNS)).equals(raw.index)  # row order = the raw index
    again = pub.anonymize_shard(store, "ar-000", ad)
    assert again["skipped"] and again["rows"] == 12


def test_clip_context_adapter_sees_whole_videos(store):
    from splavu_core.aam import load_adapter

    ad = make_adapter(store, clip_context=True)
    t = pq.read_table(pub.anonymize_shard(store, "ar-000", ad)["path"])
    adapter, _, _ = load_adapter(ad)
    raw = store.read_shard("ar-000", with_static=False)
    for vid in ("ar-000_v0", "ar-000_v3"):
        rows = np.flatnonzero(np.array(raw.index["video_id"].to_pylist()) == vid)
        rows = rows[np.argsort(raw.index["clip_index"].to_numpy()[rows])]  # temporal order
        with torch.no_grad():
            want = adapter(torch.from_numpy(raw.clips[rows][None]))[0].numpy()
        assert np.allclose(pub.feature_matrix(t)[rows], want, atol=1e-6)


def test_no_raw_latents_guard_catches_a_leak(store):
    raw = store.read_shard("ar-000", with_static=False).clips
    leaky = raw[::-1].copy() + np.float32(1.0)
    leaky[5] = raw[2]  # one raw row, at another position
    leaky[7] = -0.0 * raw[3] + raw[3]  # exact copy through arithmetic
    table = pa.table({"video_id": ["x"] * len(raw), "clip_index": list(range(len(raw))),
                      "feature": pa.FixedSizeListArray.from_arrays(pa.array(leaky.reshape(-1)), D)})
    with pytest.raises(ledger.PublishError, match="2 of 12 published feature rows equal a raw latent row; first: video 'x' clip 5"):
        pub.assert_no_raw_latents(table, raw)
    ok = pa.table({"feature": pa.FixedSizeListArray.from_arrays(pa.array((raw + 1e-3).reshape(-1)), D)})
    pub.assert_no_raw_latents(ok, raw)


def test_identity_adapter_is_refused(store):
    ad = make_adapter(store, identity=True)
    with pytest.raises(ledger.PublishError, match="adapter is the identity.*refusing to publish raw latents"):
        pub.anonymize_shard(store, "ar-000", ad)
    assert not pub.anonymized_path(store, version_of(ad), "ar-000").exists()


def test_missing_and_other_encoder_adapters_are_refused(store):
    good = make_adapter(store)
    first = pub.anonymize_shard(store, "ar-000", good)
    before = Path(first["path"]).read_bytes()
    with pytest.raises(ledger.PublishError, match="no AAM adapter at"):
        pub.anonymize_shard(store, "ar-000", store.root / "aam" / "nope")
    other = make_adapter(store, seed=2, fp="vjepa2-other")
    with pytest.raises(ledger.PublishError, match="'vjepa2-other'.*'videomae-test'"):
        pub.anonymize_shard(store, "ar-000", other)
    with pytest.raises(ledger.PublishError, match="encoder"):
        ledger.record_version(store, version_of(other), {"encoder_fingerprint": "vjepa2-other", "config": {}})
    assert not pub.anonymized_dir(store, version_of(other)).exists()
    assert Path(first["path"]).read_bytes() == before
    assert pub.read_anonymized(store, version_of(good)).num_rows == 12


def test_versions_current_switch_and_retention(store):
    shards = ["ar-000", "tad-000"]
    v1, v2, v3 = (publish(store, make_adapter(store, seed=s), shards) for s in (1, 2, 3))
    assert len({v1, v2, v3}) == 3 and ledger.current_version(store) == v3
    t = ledger.read_versions(store)
    assert t.schema == ledger.VERSIONS_SCHEMA and sum(t["is_current"].to_pylist()) == 1
    assert json.loads(t.filter(pa.compute.equal(t["version"], v1))["metrics"][0].as_py()) == {"ar_top1": 0.5}
    assert pub.read_anonymized(store)["aam_version"].unique().to_pylist() == [v3]
    # the versions coexist, each readable
    assert pub.read_anonymized(store, v1).num_rows == pub.read_anonymized(store, v2).num_rows == 18
    ledger.set_current(store, v1)  # roll back to the oldest
    assert ledger.current_version(store) == v1 and sum(ledger.read_versions(store)["is_current"].to_pylist()) == 1
    ledger.record_version(store, v2, {"encoder_fingerprint": FP, "config": {}}, {}, make_current=False)
    assert ledger.current_version(store) == v1
    out = pub.apply_retention(store, keep=1)
    assert out["deleted"] == [v2] and set(out["kept"]) == {v1, v3} and out["bytes_freed"] > 0
    assert not pub.anonymized_dir(store, v2).exists()
    assert pub.anonymized_dir(store, v1).is_dir() and pub.anonymized_dir(store, v3).is_dir()
    assert pub.apply_retention(store, keep=1)["deleted"] == []  # idempotent


def test_purge_raw_latents_refuses_then_purges(store):
    v = publish(store, make_adapter(store), ["ar-000"])
    raw_dirs = [store.shard_dir(s) for s in ("ar-000", "ar-001")]
    with pytest.raises(ledger.PublishError, match="allow_retraining"):
        pub.purge_raw_latents(store, ["ar-000"], v)
    with pytest.raises(ledger.PublishError, match="nothing deleted.*ar-001 \\(no anonymized table"):
        pub.purge_raw_latents(store, ["ar-000", "ar-001"], v, allow_retraining=False)
    assert all((d / "latents.zarr").is_dir() for d in raw_dirs)
    pub.anonymize_shard(store, "ar-001", make_adapter(store))
    out = pub.purge_raw_latents(store, ["ar-000", "ar-001"], v, allow_retraining=False)
    assert out["purged"] == ["ar-000", "ar-001"] and out["bytes_freed"] > 0
    assert not any(d.exists() for d in raw_dirs) and store.committed_shards() == ["tad-000"]
    # the anonymized copies are now the only ones: retention keeps them even for an old version
    v2 = publish(store, make_adapter(store, seed=5), ["tad-000"])
    out = pub.apply_retention(store, keep=1)
    assert out["deleted"] == [v] and sorted(out["protected"]) == [f"{v}/ar-000", f"{v}/ar-001"]
    videos = pub.load_video_features(store, "anonymized", version=v)
    assert len(videos) == 8 and ledger.current_version(store) == v2


def test_load_video_features_raw_and_anonymized(store):
    v = publish(store, make_adapter(store), ["ar-000", "ar-001", "tad-000"])
    raw = pub.load_video_features(store, "raw", datasets=["ar"])
    anon = pub.load_video_features(store, "anonymized", datasets=["ar"])
    assert [x.video_id for x in raw] == [x.video_id for x in anon] == [f"ar-00{s}_v{i}" for s in (0, 1) for i in range(4)]
    a, b = raw[1], anon[1]
    assert a.feats.shape == b.feats.shape == (3, D) and not np.allclose(a.feats, b.feats)
    assert list(a.clip_start_s) == [0.0, 2.0, 4.0] and a.n_frames == 48 and a.fps == 8.0 and a.split == "test"
    assert b.meta["anomaly_intervals"] == [[0.5, 1.5]] and b.meta["segments"] == [[0.0, 1.0, "walk"]]
    assert b.meta["attr_skin"] == 1 and b.meta["dataset"] == "ar" and b.meta["action"] == "run"
    assert raw[0].meta["anomaly_intervals"] is None
    # clip order is temporal even though the raw index stores clips out of order
    t = pub.read_anonymized(store, v, shards=["ar-000"])
    first = t.filter(pa.compute.equal(t["video_id"], "ar-000_v1"))
    by_clip = dict(zip(first["clip_index"].to_pylist(), pub.feature_matrix(first)))
    assert np.array_equal(b.feats, np.stack([by_clip[c] for c in range(3)]))


def test_corrupted_part_is_named_and_the_rest_stays_readable(store):
    v1 = publish(store, make_adapter(store, seed=1), ["ar-000", "ar-001"])
    v2 = publish(store, make_adapter(store, seed=2), ["ar-000", "ar-001"])
    cat.build_catalog(store)
    bad = pub.anonymized_path(store, v2, "ar-001")
    bad.write_bytes(b"PAR1 this is not parquet" * 10)
    with pytest.raises(ledger.PublishError, match=str(bad)):
        pub.read_anonymized(store)
    assert pub.read_anonymized(store, shards=["ar-000"]).num_rows == 12
    assert pub.read_anonymized(store, v1).num_rows == 24
    with pytest.raises(cat.CatalogError, match="ar-001.parquet"):
        cat.build_catalog(store)
    assert analyst.query(store, "SELECT count(*) AS n FROM aam_versions")["n"][0].as_py() == 2  # the old catalog
    assert not pub.anonymize_shard(store, "ar-001", make_adapter(store, seed=2))["skipped"]  # re-publish repairs it
    cat.build_catalog(store)


# ---------------------------------------------------------------- catalog

def views(store):
    return analyst.query(store, "SELECT view_name, sql FROM duckdb_views() WHERE NOT internal ORDER BY view_name").to_pylist()


def test_catalog_build_idempotent_and_queries(store):
    empty = cat.build_catalog(store)  # before anything is published: every view exists and queries
    assert empty["rows"]["anonymized_features"] == 0 and empty["rows"]["videos"] == 10
    v = publish(store, make_adapter(store), ["ar-000", "ar-001", "tad-000"])
    first = cat.build_catalog(store)
    assert first["version"] == v and first["dim"] == D
    assert first["rows"] == {**first["rows"], "videos": 10, "clips": 30, "anonymized_features": 30,
                             "anonymized_features_all": 30, "aam_versions": 1, "metrics": 0, "runs": 0, "quarantine": 0}
    names = [r["view_name"] for r in views(store)]
    assert names == sorted(["videos", "clips", "quarantine", "anonymized_features", "anonymized_features_all",
                            "aam_versions", "metrics", "runs", "storage", "erasures"])
    q = ("SELECT dataset, shard, video_id, clip_index, array_cosine_similarity(feature, feature) AS s "
         "FROM anonymized_features ORDER BY shard, video_id, clip_index")
    r1, v1 = analyst.query(store, q), views(store)
    assert np.allclose(r1["s"].to_numpy(), 1.0, atol=1e-5) and set(r1["dataset"].to_pylist()) == {"ar", "tad"}
    cat.build_catalog(store)
    assert views(store) == v1 and analyst.query(store, q).equals(r1)
    # no tables (nothing copied), and raw latent arrays are never read
    assert analyst.query(store, "SELECT count(*) AS n FROM duckdb_tables()")["n"][0].as_py() == 0
    assert not any("latents.zarr" in r["sql"] for r in v1)
    assert analyst.query(store, "SELECT typeof(feature) AS t FROM anonymized_features LIMIT 1")["t"][0].as_py() == f"FLOAT[{D}]"
    assert analyst.query(store, "SELECT metric, value FROM metrics").num_rows == 0
    assert analyst.query(store, "SELECT run_id, job, status, started_at, finished_at FROM runs").num_rows == 0
    kinds = set(analyst.query(store, "SELECT DISTINCT kind FROM storage")["kind"].to_pylist())
    assert {"raw_latents", "raw_index", "anonymized", "manifests", "aam"} <= kinds
    vids = analyst.query(store, 'SELECT dataset, action FROM videos WHERE video_id = \'tad-000_v1\'').to_pylist()
    assert vids == [{"dataset": "tad", "action": "run"}]
    # private columns (attr_*, subject_id, group) are for evaluation only: not in the analysts' view
    columns = analyst.query(store, "SELECT * FROM videos LIMIT 0").column_names
    assert "action" in columns and not [c for c in columns if c.startswith("attr_") or c in ("subject_id", "group")]
    (store.root / "metrics").mkdir()
    pq.write_table(pa.table({"feature_set": ["raw"], "aam_version": [None], "task": ["ar"], "metric": ["top1"],
                             "value": [0.9], "split": ["test"]}), store.root / "metrics" / "x.parquet")
    cat.build_catalog(store)
    assert analyst.query(store, "SELECT value FROM metrics")["value"].to_pylist() == [0.9]


def test_catalog_rebuild_with_readers_and_writers(store):
    publish(store, make_adapter(store), ["ar-000"])
    cat.build_catalog(store)
    path = cat.catalog_path(store)
    holder = ("import duckdb, sys; c = duckdb.connect(sys.argv[1], read_only=sys.argv[2] == 'ro'); "
              "print('ready', flush=True); sys.stdin.readline(); "
              "print(c.sql('SELECT count(*) FROM anonymized_features').fetchall()[0][0], flush=True)")
    reader = subprocess.Popen([sys.executable, "-c", holder, str(path), "ro"], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    try:
        assert reader.stdout.readline().strip() == "ready"
        pub.anonymize_shard(store, "ar-001", make_adapter(store))
        assert cat.build_catalog(store)["rows"]["anonymized_features"] == 24
        out, _ = reader.communicate("go\n", timeout=60)
        assert out.strip() == "24"  # glob views see the new shard; the reader's old file still works
    finally:
        reader.kill()
    writer = subprocess.Popen([sys.executable, "-c", holder, str(path), "rw"], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    try:
        assert writer.stdout.readline().strip() == "ready"
        before = path.read_bytes()
        with pytest.raises(cat.CatalogError, match="held open for writing"):
            cat.build_catalog(store)
        assert path.read_bytes() == before and not list(store.root.glob(".catalog.*"))
    finally:
        writer.communicate("go\n", timeout=60)
    assert analyst.query(store, "SELECT count(*) AS n FROM clips")["n"][0].as_py() == 12 * 2 + 6
    # in this process too: a connection held open on the old file must not make query() read stale views
    import duckdb

    held = duckdb.connect(str(path), read_only=True)
    try:
        (store.root / "runs").mkdir()
        pq.write_table(pa.table({"run_id": ["r1"], "job": ["publish"], "status": ["SUCCESS"]}), store.root / "runs" / "r1.parquet")
        cat.build_catalog(store)
        assert analyst.query(store, "SELECT run_id FROM runs")["run_id"].to_pylist() == ["r1"]
    finally:
        held.close()


def test_neighbors(store):
    publish(store, make_adapter(store), ["ar-000", "ar-001", "tad-000"])
    cat.build_catalog(store)
    nb = analyst.neighbors(store, "ar-000_v1", k=5)
    assert nb.num_rows == 5 and nb.column_names[:4] == ["video_id", "clip_index", "split", "similarity"]
    sims = nb["similarity"].to_numpy()
    assert (np.diff(sims) <= 0).all() and "ar-000_v1" not in nb["video_id"].to_pylist()
    first = analyst.neighbors(store, "ar-000_v1", k=100, reduce="first")
    assert first.num_rows == 27  # 30 clips minus the video's own 3
    with pytest.raises(cat.CatalogError, match="'nope' is not in the current anonymized table"):
        analyst.neighbors(store, "nope")


def test_format_table():
    t = pa.table({"name": ["a", "bbbb"], "n": [1, 22], "x": [0.5, None], "f": [[1.0, 2.0, 3.0, 4.0, 5.0], [1.0]]})
    text = format_table(t).splitlines()
    assert text[0].split() == ["name", "n", "x", "f"] and text[-1] == "(2 rows)"
    assert text[2].startswith("a     ") and "[1, 2, 3, 4, ...]" in text[2]
    assert format_table(t, "csv").splitlines()[1] == 'a,1,0.5,"[1.0, 2.0, 3.0, 4.0, 5.0]"'
    assert json.loads(format_table(t, "json"))[1] == {"name": "bbbb", "n": 22, "x": None, "f": [1.0]}


def test_publish_and_catalog_never_import_the_encoder():
    code = "import splavu_core.publish.anonymized_tables, splavu_core.serve.catalog, sys; assert 'transformers' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True, cwd=Path(__file__).resolve().parents[1])
