"""`splavu forget` (issue 27): a subject erased from every layer of a real store, checked by reading every byte of
every file back (Zarr chunks and Parquet pages decoded, since they are compressed), the refit, the tombstone, the
receipt, a request killed mid-way and rerun, bad input, and the same on S3 (moto).

One store (a copy of `tiny_store` with an AAM published through Dagster) is shared by the module, in file order."""
import io
import json
import os
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import dagster as dg
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from test_object_store import s3  # noqa: F401  (the moto server, a fixture)
from test_reanonymize import train_aam

from assets.resources import EncoderResource, StoreResource
from pipeline.cli import main
from pipeline.runner import materialize_shard, run_reanonymize
from splavu_core import forget as fg
from splavu_core.publish import anonymized_tables as pub
from splavu_core.evaluation import score_cache
from splavu_core.serve import analyst
from splavu_core.serve import catalog as cat
from splavu_core.store import forget_records as erasure
from splavu_core.store import ledger
from splavu_core.store.feature_store import FeatureStore
from splavu_core.store.ledger import current_version, retired_versions

REPO = Path(__file__).resolve().parents[1]


def cli(capsys, *argv):
    rc = main(list(argv))
    out = capsys.readouterr()
    return rc, out.out, out.err


@pytest.fixture(scope="module")
def env(tiny_store, tmp_path_factory):
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("SPLAVU_PRIVACY_BUDGET", "-1")  # a 2-epoch AAM on a random tiny encoder: the mechanics only
        mp.setenv("SPLAVU_UTILITY_GATE", "-1")
        mp.delenv("DAGSTER_HOME", raising=False)  # the CLI's runs on an ephemeral instance
        root = tmp_path_factory.mktemp("forget") / "store"
        shutil.copytree(tiny_store, root)
        inst, store = dg.DagsterInstance.ephemeral(), StoreResource(root=str(root))
        v1 = train_aam(inst, store, tasks=["ar"])
        run_reanonymize(inst, store)
        assert current_version(FeatureStore(root)) == v1
        yield SimpleNamespace(root=root, feature_store=FeatureStore(root), inst=inst, store=store, v1=v1)


def manifest_rows(store: FeatureStore) -> list[dict]:
    """Every manifest row with its private columns (subject_id lives in labels/, joined by the library)."""
    return [r for k in store.files.glob("manifests", ".parquet")
            for r in store.read_shard_manifest(k.rsplit("/", 1)[-1][:-len(".parquet")]).to_pylist()]


def vectors_of(store: FeatureStore, ids: set) -> list[np.ndarray]:
    """The videos' raw clip and static latents and their anonymized rows in every version, read independently."""
    out = []
    for shard in store.committed_shards():
        d = store.read_shard(shard)
        out.append(d.clips[np.isin(d.index["video_id"].to_numpy(zero_copy_only=False), list(ids))])
        if k := d.static.shape[1] if len(d.static) else 0:
            vids = np.asarray(d.static_index["video_id"].to_pylist()[::k], dtype=object)
            out.append(d.static[np.isin(vids, list(ids))].reshape(-1, d.static.shape[2]))
    for key in store.files.match("anonymized/*/*.parquet"):
        t = store.files.read_parquet(key)
        out.append(pub.feature_matrix(t)[np.isin(t["video_id"].to_numpy(zero_copy_only=False), list(ids))])
    return [a for a in out if len(a)]


def unit(a):
    a = np.asarray(a, np.float32)
    a = a.reshape(-1, a.shape[-1])
    return a / np.maximum(np.linalg.norm(a, axis=1, keepdims=True), 1e-30)


def scan(files: dict[str, bytes], ids, vectors) -> list[str]:
    """Every byte of every file: the ids searched in the raw bytes, then each Parquet table, Arrow file, .npy array
    and Zarr array decoded and searched for the ids (strings) and the vectors (cosine > 1 - 1e-6, so a row-normalised
    copy counts). Returns what was found where."""
    import zarr

    found = []
    former = {}
    for v in vectors:
        former.setdefault(v.shape[1], []).append(unit(v))
    former = {d: np.concatenate(v) for d, v in former.items()}

    def check_vectors(where, arr):
        arr = np.asarray(arr)
        if arr.ndim >= 2 and arr.shape[-1] in former and arr.dtype.kind == "f":
            if arr.size and ((unit(arr) @ former[arr.shape[-1]].T) > 1 - 1e-6).any():
                found.append(f"vector in {where}")

    def check_table(where, t: pa.Table):
        for f in t.schema:
            col = t[f.name]
            if pa.types.is_string(f.type):
                if set(col.to_pylist()) & set(ids) or any(i in str(v) for v in set(col.to_pylist()) for i in ids):
                    found.append(f"id in {where}:{f.name}")
            elif pa.types.is_fixed_size_list(f.type) or pa.types.is_list(f.type):
                check_vectors(f"{where}:{f.name}", pub.feature_matrix(t.select([f.name]).rename_columns(["feature"])))

    for key, data in files.items():
        found += [f"id {i} in the bytes of {key}" for i in ids if i.encode() in data]
        if key.endswith(".parquet"):
            check_table(key, pq.read_table(io.BytesIO(data)))
        elif key.endswith(".arrow"):
            check_table(key, pa.ipc.open_file(pa.BufferReader(data)).read_all())
        elif key.endswith(".npy"):
            check_vectors(key, np.load(io.BytesIO(data)))
    # Zarr arrays: every chunk decoded through Zarr itself, from the same bytes
    for key in [k for k in files if k.endswith("latents.zarr/zarr.json")]:
        prefix = key[:-len("zarr.json")]
        mem = zarr.storage.MemoryStore({k[len(prefix):]: zarr.core.buffer.cpu.Buffer.from_bytes(v)
                                        for k, v in files.items() if k.startswith(prefix)})
        for name, arr in zarr.open_group(mem, mode="r").arrays():
            check_vectors(f"{prefix}{name}", arr[:])
    return found


def local_files(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in root.rglob("*") if p.is_file()}


def snapshot(root: Path) -> dict:
    return {str(p): (p.stat().st_mtime_ns, p.stat().st_size) for p in root.rglob("*") if p.is_file()}


# ---------------------------------------------------------------- bad input changes nothing

def test_bad_input_is_one_line_and_changes_nothing(env, capsys, tmp_path):
    before = snapshot(env.root)
    empty = tmp_path / "ids.txt"
    empty.write_text("\n")
    vid = manifest_rows(env.feature_store)[0]["video_id"]
    for argv, says in [(["--video", "no_such_video", "--reason", "r"], "no_such_video"),
                       (["--subject", "nobody", "--reason", "r"], "nobody"),
                       (["--file", str(empty), "--reason", "r"], str(empty)),
                       (["--video", vid], "--reason"),
                       (["--video", vid, "--reason", f"asked by {vid}"], "--reason"),
                       (["--reason", "r"], "--video")]:
        rc, out, err = cli(capsys, "--store", str(env.root), "forget", *argv)
        assert rc == 2 and err.startswith("splavu: error:") and err.count("\n") == 1 and says in err, (argv, err)
    assert snapshot(env.root) == before


# ---------------------------------------------------------------- a subject, end to end

def test_forget_subject_leaves_no_byte_of_them_and_refits(env, capsys):
    rows = manifest_rows(env.feature_store)
    subject = next(r["subject_id"] for r in rows if r["video_id"].startswith("ar_") and r["split"] == "train")
    ids = {r["video_id"] for r in rows if r.get("subject_id") == subject}
    vectors = vectors_of(env.feature_store, ids)
    assert ids and sum(len(v) for v in vectors) > 2 * len(ids)
    assert scan(local_files(env.root), ids, vectors)  # the scan does find them before
    untouched = {k: v for k, v in local_files(env.root).items() if k.startswith("latents/privacy-000/")}
    # a kept protocol output (score cache): outputs about them, named by a hash only; an erasure deletes them all
    planted = "cache/scores/" + "0" * 40 + ".npz"
    env.feature_store.files.put_atomic(planted, score_cache.encode(("ar", {"probs": np.zeros((1, 2, 3))})))

    rc, out, err = cli(capsys, "--store", str(env.root), "forget", "--subject", subject, "--reason", "consent withdrawn")
    assert rc == 0, err
    assert not env.feature_store.files.exists(planted)
    assert "none holds any of the" in out and "check after the refit" in out and ".mp4" in out  # their files named
    assert scan(local_files(env.root), ids | {subject}, vectors) == []
    # an unaffected shard is untouched, byte for byte
    assert {k: v for k, v in local_files(env.root).items() if k.startswith("latents/privacy-000/")} == untouched
    # the version fitted on them is retired; the refit is current and serves analysts
    v2 = current_version(env.feature_store)
    assert v2 and v2 != env.v1 and env.v1 in retired_versions(env.feature_store)
    assert not env.feature_store.files.exists(f"anonymized/{env.v1}") and not env.feature_store.files.exists(f"aam/{env.v1}")
    rc, text, err = cli(capsys, "--store", str(env.root), "sql", "SELECT (SELECT count(*) FROM anonymized_features) AS a, "
                      "(SELECT count(*) FROM clips) AS c", "--format", "json")
    assert rc == 0 and text, (rc, text, err)
    assert json.loads(text)[0]["a"] == json.loads(text)[0]["c"] > 0
    # the receipt: through the catalog, per layer, with shard hashes
    rc, text, err = cli(capsys, "--store", str(env.root), "sql", "SELECT step, layer, item, rows_removed, hash_before, "
                        "hash_after FROM erasures ORDER BY logged_at, layer", "--format", "json")
    assert rc == 0, err
    log = json.loads(text)
    raw = [r for r in log if r["layer"] == "raw_latents"]
    assert raw and all(r["rows_removed"] > 0 and r["hash_before"] != r["hash_after"] for r in raw)
    assert {r["step"] for r in log} == {"erase", "refit"} and any(r["item"] == env.v1 for r in log)
    assert any(r["layer"] == "cache" and r["item"] == score_cache.ROOT for r in log)


def test_forget_a_training_subject_through_the_job_as_the_ui_launches_it(env):
    """The `forget` job as the UI's Launchpad launches it: the code location's job with the subject and a reason in its
    config (no request opened beforehand, no CLI). It ends as `splavu forget` does: erased, the version fitted on them
    retired, a refit through both gates made current, a check after it and the receipt of both steps."""
    from pipeline import runner

    rows = manifest_rows(env.feature_store)
    subject = next(r["subject_id"] for r in rows if r["video_id"].startswith("ar_") and r["split"] == "train")
    ids = {r["video_id"] for r in rows if r.get("subject_id") == subject}
    vectors = vectors_of(env.feature_store, ids)
    before = current_version(env.feature_store)
    res = runner.run_job(env.inst, "forget", env.store, run_config={"ops": {"forget_videos": {"config": {
        "subjects": [subject], "reason": "consent withdrawn"}}}})
    assert res.success
    run = env.inst.get_run_by_id(res.run_id)
    assert run.remote_job_origin.repository_origin.get_label() == runner.REPOSITORY_LABEL
    mats = {}
    for m in res.asset_materializations_for_node("forget_videos"):
        mats.setdefault(m.asset_key.to_user_string(), []).append({k: v.value for k, v in m.metadata.items()})
    assert {"forget_request", "forget_refit", "aam_model", "anonymized_features", "feature_catalog"} <= set(mats)
    (erased,), (refit,) = mats["forget_request"], mats["forget_refit"]
    assert erased["videos"] == len(ids) and "none holds any of the" in erased["check"]
    assert refit["refit"] == "done" and refit["current"] and "none holds any of the" in refit["check"]
    assert all(g["passed"] for g in refit["gates"].values())
    after = current_version(env.feature_store)
    assert after == refit["version"] == mats["aam_model"][0]["version"] and after != before
    assert before in retired_versions(env.feature_store)
    assert scan(local_files(env.root), ids | {subject}, vectors) == []
    log = [r for r in erasure.read_log(env.feature_store).to_pylist() if r["request_id"] == erased["request_id"]]
    assert {r["step"] for r in log} == {"erase", "refit"}
    assert any(r["layer"] == "refit" and r["item"] == after and r["note"].startswith("current") for r in log)
    assert not fg.pending_requests(env.feature_store)


def test_tombstone_keeps_them_out_of_reextraction_and_ingest(env, capsys, tiny_bench, tiny_videomae):
    import pyarrow.csv as pcsv

    manifest = tiny_bench[0] / "ar" / "manifest.csv"
    gone = erasure.forgotten(env.feature_store, pcsv.read_csv(manifest)["video_id"].to_pylist())
    assert gone  # the user's manifest still lists the erased videos
    res = materialize_shard(env.inst, "ar-000", env.store, EncoderResource(checkpoint=str(tiny_videomae)))
    md = {m.asset_key.path[-1]: m.metadata for m in res.asset_materializations_for_node("extracted_latents")}
    assert md["clip_latents"]["skipped"].value  # the erasure left the shard up to date with the filtered manifest
    assert f"{len(gone)} erased video(s) skipped" in capsys.readouterr().err  # said, not silent
    assert not gone & set(env.feature_store.read_shard("ar-000").index["video_id"].to_pylist())
    assert not gone & {r["video_id"] for r in manifest_rows(env.feature_store)}  # video_manifest ran again, without them
    rc, _, err = cli(capsys, "--store", str(env.root), "ingest", "ar_again", str(manifest), "--roles", "ar")
    assert rc == 2 and "erased" in err and "--allow-forgotten" in err and err.count("\n") == 1
    assert not env.feature_store.files.exists("datasets/ar_again.json")


# ---------------------------------------------------------------- killed mid-request, then run again

def test_killed_mid_request_then_rerun_completes(env, capsys):
    rows = manifest_rows(env.feature_store)
    ids = [next(r["video_id"] for r in rows if r["video_id"].startswith(p)) for p in ("privacy_0", "tad_0")]
    vectors = vectors_of(env.feature_store, set(ids))
    shards = {s for t in fg.resolve(env.feature_store, ids)[0].values() for s in t["shards"]}
    assert len(shards) == 2
    argv = ["--store", str(env.root), "forget", "--video", *ids, "--reason", "deletion request"]
    proc = subprocess.run([sys.executable, "-m", "pipeline.cli", *argv], cwd=REPO, capture_output=True,
                          env={**os.environ, "SPLAVU_FORGET_CRASH_AFTER": "3", "PYTHONPATH": str(REPO)})  # after the first shard's commit
    assert proc.returncode == -signal.SIGKILL, proc.stderr.decode()[-3000:]
    assert fg.pending_requests(env.feature_store)  # the journal is there to finish it
    for shard in env.feature_store.committed_shards():  # every shard is whole: before or after, never half
        d = env.feature_store.read_shard(shard)
        assert d.index.num_rows == env.feature_store.committed(shard)["clips"]
    rc, out, err = cli(capsys, *argv)
    assert rc == 0, err
    assert "left unfinished" in out and not fg.pending_requests(env.feature_store)
    assert scan(local_files(env.root), set(ids), vectors) == []
    log = erasure.read_log(env.feature_store).to_pylist()
    raw = {r["item"]: r for r in log if r["layer"] == "raw_latents" and r["item"] in shards}
    assert set(raw) == shards  # the shard committed before the kill is in the receipt too, with both hashes
    assert all(r["hash_before"] and r["hash_after"] and r["hash_before"] != r["hash_after"] for r in raw.values())


def test_allow_forgotten_readmits_and_is_logged(env, capsys, tiny_bench):
    manifest = tiny_bench[0] / "ar" / "manifest.csv"
    before = erasure.read_tombstones(env.feature_store).num_rows
    rc, out, err = cli(capsys, "--store", str(env.root), "ingest", "ar_again", str(manifest), "--roles", "ar",
                       "--allow-forgotten")
    assert rc == 0, err
    assert erasure.read_tombstones(env.feature_store).num_rows < before
    assert [r for r in erasure.read_log(env.feature_store).to_pylist() if r["step"] == "readmit" and r["rows_removed"] > 0]


# ---------------------------------------------------------------- object storage

def test_forget_on_s3_leaves_no_trace_and_no_replaced_attempt(s3, capsys, tmp_path):
    import boto3
    import torch
    from test_object_store import BUCKET, s3_url

    from splavu_core.aam import AAMConfig, AnonymizingAdapter, save_adapter
    from splavu_core.serve import catalog as cat
    from splavu_core.serve.neighbors import write_index
    from splavu_core.store.feature_store import QUARANTINE_SCHEMA, ShardLatents

    url = s3_url("forget")
    store = FeatureStore(url)
    rng = np.random.default_rng(0)
    d = 8
    for s in ("ar-000", "ar-001"):
        vids = [f"{s}_v{i}" for i in range(4)]
        n = 3 * len(vids)
        index = pa.table({"video_id": [v for v in vids for _ in range(3)], "clip_index": pa.array([0, 1, 2] * 4, pa.int32()),
                          "start_frame": pa.array([0] * n, pa.int32()), "end_frame": pa.array([16] * n, pa.int32()),
                          "start_s": [0.0] * n, "end_s": [2.0] * n, "split": ["train"] * n})
        static_index = pa.table({"video_id": [v for v in vids for _ in range(2)], "k": pa.array([0, 1] * 4, pa.int32()),
                                 "frame_index": pa.array([0, 9] * 4, pa.int32())})
        store.write_shard(s, ShardLatents(rng.standard_normal((n, d)).astype(np.float32), index,
                                       rng.standard_normal((4, 2, d)).astype(np.float32), static_index,
                                       QUARANTINE_SCHEMA.empty_table()), {"encoder_fingerprint": "fp"}, "m")
        store.write_shard(s, store.read_shard(s), {"encoder_fingerprint": "fp"}, "m")  # a replaced attempt, kept for readers
        store.write_shard_manifest_table(s, pa.table({"video_id": vids, "path": [f"{v}.mp4" for v in vids],
                                                   "split": ["train"] * 4, "subject_id": ["a", "b", "c", "d"],
                                                   "attr_skin": [0, 1, 0, 1]}))
    torch.manual_seed(0)
    cfg = AAMConfig(dim=d, layers=1, heads=2, sub_tokens=2, token_width=4)
    adapter = AnonymizingAdapter(cfg)
    with torch.no_grad():
        for name, p in adapter.named_parameters():
            if name.endswith("proj.weight") or name.startswith("out."):
                p.normal_(0, 0.3)
    version = save_adapter(adapter, cfg, tmp_path / "aam", "fp")
    for s in ("ar-000", "ar-001"):
        pub.anonymize_shard(store, s, tmp_path / "aam")
    ledger.record_version(store, version, {"encoder_fingerprint": "fp", "config": cfg.to_dict()}, {})
    cat.build_catalog(store)
    write_index(store, version)
    assert len(store.files.listdir("latents/ar-000/attempts")) == 2

    ids = {"ar-000_v1", "ar-001_v2"}
    vectors = vectors_of(store, ids)
    rc, out, err = cli(capsys, "--store", url, "forget", "--video", *sorted(ids), "--reason", "erasure request")
    assert rc == 0, err
    assert "none holds any of the 2 erased id(s)" in out
    client, prefix = boto3.client("s3"), url.split(f"s3://{BUCKET}/", 1)[1] + "/"
    keys = [o["Key"] for page in client.get_paginator("list_objects_v2").paginate(Bucket=BUCKET, Prefix=prefix)
            for o in page.get("Contents", [])]
    files = {k[len(prefix):]: client.get_object(Bucket=BUCKET, Key=k)["Body"].read() for k in keys}
    local = cat.catalog_dir(store)  # the catalog and neighbour index live in a local cache folder
    files.update({f"catalog-dir/{k}": v for k, v in local_files(local).items()})
    assert scan(files, ids, vectors) == []
    for s in ("ar-000", "ar-001"):  # the replaced attempts are deleted, not left for readers
        assert [f"attempts/{a}" for a in store.files.listdir(f"latents/{s}/attempts")] == [store.committed(s)["data"]]
        assert store.read_shard(s).index.num_rows == 9
    assert not [k for k in files if k.startswith("_locks/") or k.startswith("erasure/journal/")]


# ---------------------------------------------------------------- the benchmark, at a tiny size

def test_forget_benchmark_smoke(tmp_path):
    proc = subprocess.run([sys.executable, str(REPO / "benchmarks" / "forget.py"), "--clips", "3000",
                           "--clips-per-shard", "1000", "--dim", "16", "--out", str(tmp_path / "store")],
                          cwd=REPO, capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert proc.returncode == 0, proc.stderr[-3000:]
    res = json.loads(proc.stdout)
    one = res["forget_video"]
    assert one["check_clean"] and one["shards_rewritten"] == 1
    assert one["latents_bytes_rewritten"] <= 1.2 * res["shard_bytes_mean"]
    assert res["forget_subject"]["check_clean"] and res["forget_subject"]["shards_rewritten"] >= 1
    assert re.match(r"^\d+(\.\d+)?$", str(one["seconds"]))


# ---------------------------------------------------------------- a rewrite and a publish of one shard

def test_a_rewrite_and_a_publish_of_one_shard_take_turns(tmp_path):
    """The erasure's rewrite holds the shard's locks; a publish of that shard (anonymize_shard) waits for it, and then
    publishes what the rewrite left, not the rows it removed."""
    import threading

    from test_publish_catalog import make_adapter, write_fake_shard

    s = FeatureStore(tmp_path / "store")
    write_fake_shard(s, "ar-000")
    adapter = make_adapter(s)
    events, blocked = [], threading.Event()
    real_lock = s.files.lock

    def lock(name, on_wait=None):  # the local lock calls on_wait when it finds the lock held, then blocks on it
        def waiting(msg):
            if threading.current_thread() is not threading.main_thread():
                blocked.set()
            if on_wait:
                on_wait(msg)
        return real_lock(name, on_wait=waiting)
    s.files.lock = lock

    def publish():
        events.append("publish started")
        pub.anonymize_shard(s, "ar-000", adapter)
        events.append("published")

    with s.rewriting("ar-000") as commit:
        t = threading.Thread(target=publish)
        t.start()
        assert blocked.wait(60), "the publish never reached the shard's lock"
        assert events == ["publish started"]  # waiting on the shard's lock, held by this rewrite
        d = s.read_shard("ar-000")
        keep = pa.array([v != "ar-000_v1" for v in d.index["video_id"].to_pylist()])
        commit(type(d)(d.clips[np.asarray(keep)], d.index.filter(keep), d.static, d.static_index, d.quarantine),
               s.shard_provenance("ar-000"), "erased")
    t.join(30)
    assert events == ["publish started", "published"]
    table = pub.read_anonymized(s, json.loads((adapter / "adapter.json").read_text())["version"])
    assert "ar-000_v1" not in table["video_id"].to_pylist() and table.num_rows == s.committed("ar-000")["clips"]


# ---------------------------------------------------------------- versions fitted on the videos, without a refit

def fitted_store(tmp_path):
    """A hand-built store whose `ar` dataset is registered with a training role, one version published and current."""
    from test_publish_catalog import make_adapter, publish, write_fake_shard

    s = FeatureStore(tmp_path / "store")
    for shard, seed in (("ar-000", 0), ("ar-001", 1)):
        write_fake_shard(s, shard, seed=seed)
    s.files.write_json("datasets/ar.json", {"name": "ar", "manifest": str(tmp_path / "gone.csv"), "shard_size": 4,
                                         "videos": 8, "shards": ["ar-000", "ar-001"], "roles": ["ar"]})
    return s, publish(s, make_adapter(s), ["ar-000", "ar-001"])


def test_the_receipt_is_in_the_erasures_view_when_forget_returns(tmp_path, capsys):
    """A video no version was fitted on (a test video): no refit, so no publish rebuilds the catalog afterwards; the
    receipt is in `erasures` anyway, the moment `splavu forget` returns."""
    s, _ = fitted_store(tmp_path)
    rows = s.read_shard_manifest("ar-000").to_pylist()
    video = next(r["video_id"] for r in rows if r["split"] == "test")
    cat.build_catalog(s)
    assert analyst.query(s, "SELECT count(*) AS n FROM erasures")["n"][0].as_py() == 0
    rc, out, err = cli(capsys, "--store", str(s.root), "forget", "--video", video, "--reason", "withdrawn")
    assert rc == 0 and "no refit needed" in out, err
    log = analyst.query(s, "SELECT step, layer, rows_removed FROM erasures").to_pylist()
    assert {r["step"] for r in log} == {"erase"}
    assert next(r for r in log if r["layer"] == "request")["rows_removed"] == 1


@pytest.mark.parametrize("policy", ["retire", "serve_until_refit"])
def test_versions_fitted_on_the_videos_are_retired_or_serve_until_a_refit_is_current(tmp_path, policy):
    from test_publish_catalog import make_adapter, publish

    from splavu_core.store.ledger import ledger_log, promote

    s, v = fitted_store(tmp_path)
    targets, _ = fg.resolve(s, videos=["ar-000_v0"])  # a train video of a training dataset
    assert targets["ar-000_v0"]["trains"]
    journal = fg.open_request(s, targets, "withdrawn", policy=policy)
    summary = fg.run_request(s, journal["request_id"], log=print)
    assert summary["check"]["clean"] and summary["fitted_versions"] == [v] and summary["policy"] == policy
    assert summary["refit_config"] is not None  # the CLI refits the current version's fit without the video
    receipt = [r for r in erasure.read_log(s).to_pylist() if r["request_id"] == journal["request_id"]]
    assert any(r["layer"] == "policy" and r["item"] == policy and r["note"] == fg.POLICIES[policy] for r in receipt)
    actions = {e["action"] for e in ledger_log(s) if e["version"] == v}
    if policy == "serve_until_refit":  # serving, rows removed, until a version fitted without them is current
        assert "erasure-override" in actions and current_version(s) == v and fg.served_until_refit(s) == {
            v: journal["request_id"]}
        assert "ar-000_v0" not in pub.read_anonymized(s, v)["video_id"].to_pylist()
        refit = publish(s, make_adapter(s, seed=2), ["ar-000", "ar-001"])  # a version fitted without them
        promote(s, refit, force=True, reason="the refit")
        assert fg.retire_served_until_refit(s, refit) == [v]
    assert "retire" in {e["action"] for e in ledger_log(s) if e["version"] == v} and v in retired_versions(s)
    assert current_version(s) != v and not fg.served_until_refit(s)
    assert not s.files.exists(f"anonymized/{v}") and not s.files.exists(f"aam/{v}")
    with pytest.raises(ledger.PublishError, match="retired"):
        promote(s, v, force=True, reason="try")


def test_the_erasure_policy_is_a_setting_and_a_request_can_override_it(tmp_path, monkeypatch):
    s, _ = fitted_store(tmp_path)
    assert fg.policy_of(None) == "retire"
    monkeypatch.setenv("SPLAVU_ERASURE_POLICY", "serve_until_refit")
    assert fg.policy_of(None) == "serve_until_refit" and fg.policy_of("retire") == "retire"
    with pytest.raises(fg.ForgetError, match="unknown erasure policy"):
        fg.policy_of("keep")
    monkeypatch.setenv("SPLAVU_ERASURE_POLICY", "keep")
    from splavu_core.settings import SettingsError

    with pytest.raises(SettingsError, match="SPLAVU_ERASURE_POLICY"):
        fg.policy_of(None)


def test_an_extraction_that_raced_an_erasure_removes_the_videos_again(tmp_path):
    from test_publish_catalog import write_fake_shard

    s = FeatureStore(tmp_path / "store")
    write_fake_shard(s, "ar-000")
    erasure.add_tombstones(s, ["ar-000_v2"], "r1")  # erased while the shard was being encoded
    said = []
    marker = fg.erase_raced(s, "ar-000", log=said.append)
    assert marker["videos"] == 3 and "ar-000_v2" not in s.read_shard("ar-000").index["video_id"].to_pylist()
    assert said and fg.erase_raced(s, "ar-000") is None
