"""Publishing anonymized features through Dagster: the asset, the catalog asset, re-anonymization by
declarative automation and the schedule, and the analysts' CLI (`splavu sql`, `splavu neighbors`).

One store (a copy of the `tiny_store` fixture) is shared by the module and evolves in stages: AAM v1 published
everywhere (the `env` fixture) -> v2 rolled out by automation (`v2`) -> a new shard (`extra_shard`); the tests read
or change it around those stages (a gate failing and passing again, a rollback, retention, bad inputs). A stage runs
once per module, in the test that checks it or, when that test was not selected, in the first test that needs it:
any test runs alone (`pytest -k`), and the whole file runs in file order as before. The encoder's loader is patched
to raise for all of it."""
import json
import shutil
import subprocess
import sys
from contextlib import contextmanager
from datetime import datetime, timezone
from pathlib import Path
from types import SimpleNamespace

import dagster as dg
import pyarrow.parquet as pq
import pytest

from assets.anonymized import (
    anonymized_features,
    maybe_promote,
    registered_shards,
    shards_lacking,
    target_versions,
    unpinned_version,
)
from assets.catalog import feature_catalog
from assets.evaluation import GATE_CHECKS
from assets.resources import StoreResource
from pipeline.cli import main
from pipeline.reanonymize import (
    build_reanonymize_schedule,
    reanonymize_automation,
    reanonymize_job,
    reanonymize_schedule,
    refresh_catalog_job,
)
from pipeline.runner import run_reanonymize
from splavu_core.publish import anonymized_tables as pub
from splavu_core.serve import analyst
from splavu_core.serve import catalog as cat
from splavu_core.store import ledger

REPO = Path(__file__).resolve().parents[1]
AAM = {"epochs": 2, "batch": 64, "layers": 1, "heads": 2, "sub_tokens": 4, "token_width": 16, "lr": 1e-2, "operating_point": "as_given",
       "diagnose_steps": 30}  # tiny: the diagnostic critics need not converge for these tests


def refuse(*a, **k):
    raise AssertionError("the encoder must never be loaded to publish anonymized features")


def train_aam(inst, store, **over) -> str:
    """The `train_aam` job, as `splavu train` runs it."""
    from pipeline import runner

    return runner.train_aam(inst, store, {**AAM, **over})["version"]


def execute(env, req: dg.RunRequest) -> dict:
    """Run what a sensor / schedule requested, as the daemon would (same partition, config, tags)."""
    res = dg.materialize([anonymized_features], instance=env.inst, partition_key=req.partition_key,
                         run_config=req.run_config, resources={"store": env.store}, tags=req.tags)
    return {k: v.value for k, v in res.asset_materializations_for_node("anonymized_features")[0].metadata.items()}


def local_defs(store: StoreResource) -> dg.Definitions:
    """What pipeline/definitions.py wires up for this issue (plus the assets it builds on)."""
    from assets import aam, anonymized, catalog, latents, manifest
    from assets.resources import EncoderResource

    return dg.Definitions(
        assets=dg.load_assets_from_modules([manifest, latents, aam, anonymized, catalog]), asset_checks=GATE_CHECKS,
        jobs=[reanonymize_job, refresh_catalog_job], sensors=[reanonymize_automation],
        schedules=[reanonymize_schedule], resources={"store": store, "encoder": EncoderResource()})


def automation(env) -> tuple[list[str], int]:
    """One tick of the code location's automation conditions (what reanonymize_automation evaluates):
    (the anonymized_features shards requested, feature_catalog runs requested). The cursor stays on env."""
    from pipeline.definitions import defs

    res = dg.evaluate_automation_conditions(defs, env.inst, cursor=env.cursor)
    env.cursor = res.cursor
    return (sorted(res.get_requested_partitions(dg.AssetKey("anonymized_features"))),
            res.get_num_requested(dg.AssetKey("feature_catalog")))


def run_unpinned(env, shard: str) -> dict:
    """A shard's run as the automation launches it: no run config, the blocking gates riding along."""
    res = dg.materialize([anonymized_features, *GATE_CHECKS], instance=env.inst, partition_key=shard,
                         resources={"store": env.store}, raise_on_error=False)
    return {k: v.value for k, v in res.asset_materializations_for_node("anonymized_features")[0].metadata.items()}


@contextmanager
def schedule_ticks(env):
    """Schedule contexts need a persistent instance: a throwaway sqlite one with the same shard partitions."""
    inst = dg.DagsterInstance.local_temp(str(env.tmp.mktemp("dagster_home")))  # not `with`: that leaks a ContextVar
    inst.add_dynamic_partitions("shards", env.inst.get_dynamic_partitions("shards"))

    def tick():
        ctx = dg.build_schedule_context(instance=inst, resources={"store": env.store},
                                        repository_def=env.defs.get_repository_def(),
                                        scheduled_execution_time=datetime(2026, 1, 2, 3, tzinfo=timezone.utc))
        with dg.partition_loading_context(dynamic_partitions_store=inst):
            return reanonymize_schedule.evaluate_tick(ctx)
    try:
        yield tick
    finally:
        inst.dispose()


def cli(capsys, *argv) -> tuple[int, str, str]:
    rc = main(list(argv))
    out = capsys.readouterr()
    return rc, out.out, out.err


@pytest.fixture(scope="module")
def env(tiny_store, tiny_bench, tmp_path_factory):
    import assets.resources
    import splavu_core.extract.encoders.vfm

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(splavu_core.extract.encoders.vfm, "load_encoder", refuse)
        mp.setattr(assets.resources, "load_encoder", refuse)
        # a 2-epoch AAM on a random tiny encoder cannot meet a real privacy budget; promotion mechanics are
        # tested here with the gate open, the gate itself in test_a_version_failing_the_budget_stays_out
        mp.setenv("SPLAVU_PRIVACY_BUDGET", "-1")
        mp.setenv("SPLAVU_UTILITY_GATE", "-1")  # the utility gate too (tests/test_gates_intervals.py tests both)
        root = tmp_path_factory.mktemp("reanon") / "store"
        shutil.copytree(tiny_store, root)
        inst = dg.DagsterInstance.ephemeral()
        store = StoreResource(root=str(root))
        v1 = train_aam(inst, store)
        first = run_reanonymize(inst, store)  # every shard (one run each), then the catalog
        yield SimpleNamespace(root=root, inst=inst, store=store, feature_store=store.store(), v1=v1, first=first,
                              bench=tiny_bench[0], tmp=tmp_path_factory, defs=local_defs(store), cursor=None, stages={})


def stage(env, name: str, run) -> SimpleNamespace:
    """Stage `name` of the module store's story: run(env) once per module (in the test that checks it, or in the
    first test that needs it when that one was not selected). A stage that failed fails every test that needs it
    instead of running twice on a half-changed store."""
    if name not in env.stages:
        env.stages[name] = "failed"
        run(env)
        env.stages[name] = "done"
    if env.stages[name] == "failed":
        pytest.fail(f"stage {name!r} of the module store failed in an earlier test", pytrace=False)
    return env


@pytest.fixture
def v2(env):
    """The store after v2 was rolled out by automation (roll_out_v2): env.v2 current, the catalog on it."""
    return stage(env, "v2 rolled out", roll_out_v2)


@pytest.fixture
def extra_shard(v2):
    """The store after a new dataset's shard extra-000 landed and was published with v2 (publish_extra_shard)."""
    return stage(v2, "extra shard published", publish_extra_shard)


def test_every_shard_published_from_cached_latents_only(env):
    store = env.feature_store
    shards = registered_shards(store)
    assert len(shards) >= 6 and set(env.first["shards"]) == set(shards)
    total = 0
    for s in shards:
        md = env.first["shards"][s]
        clips = store.committed(s)["clips"]
        assert md["skipped"] is False and md["rows"] == clips and md["aam_version"] == env.v1
        assert md["clips_per_s"] > 0
        # a full-width adapter reports how far it moved the latents; a keep adapter publishes fewer dims
        assert md["max_abs_change"] > 0 if "max_abs_change" in md else md["dim"] < store.committed(s)["dim"]
        table = pq.read_table(pub.anonymized_path(store, env.v1, s))
        assert table.num_rows == clips and table.schema.field("feature").type.list_size == md["dim"]
        # the only vector column is `feature`, and none of its rows is a raw latent
        assert [f.name for f in table.schema if str(f.type).startswith(("fixed_size_list", "list"))] == ["feature"]
        pub.assert_no_raw_latents(table, store.read_shard(s, with_static=False).clips)
        total += clips
    assert ledger.current_version(store) == env.v1
    assert env.first["catalog"]["rows"]["anonymized_features"] == total
    assert env.first["catalog"]["aam_version"] == env.v1


def test_publish_says_what_it_did(env):
    """First publish: the version became current in this run; again: nothing new, and current since before
    (it used to print "published N clips ... (already current)" for a publish that wrote nothing). Runs right
    after the env's first publish, before other tests add versions and shards."""
    from pipeline.messages import publish_summary

    first = publish_summary(env.first)
    assert f"with AAM {env.v1}" in first and f"AAM {env.v1} is now current (was None)" in first
    again = publish_summary(run_reanonymize(env.inst, env.store, version=env.v1, catalog=False))
    n = len(env.first["shards"])
    assert again == (f"nothing new to publish: all {n} shard(s) already have AAM {env.v1}'s tables; "
                     f"AAM {env.v1} was already current before this publish")


def test_rerun_skips_a_published_shard(env):
    shard = registered_shards(env.feature_store)[0]
    path = pub.anonymized_path(env.feature_store, env.v1, shard)
    before = path.stat().st_mtime_ns
    out = run_reanonymize(env.inst, env.store, shard_keys=[shard], catalog=False)
    assert out["shards"][shard]["skipped"] is True and out["shards"][shard]["clips_per_s"] == 0
    assert path.stat().st_mtime_ns == before


def test_catalog_asset_is_idempotent_and_records_runs(env):
    mds = []
    for _ in range(2):
        res = dg.materialize([feature_catalog], instance=env.inst, resources={"store": env.store})
        mds.append({k: v.value for k, v in res.asset_materializations_for_node("feature_catalog")[0].metadata.items()})
    a, b = mds
    assert a["views"] == b["views"] and {"videos", "clips", "anonymized_features", "aam_versions", "quarantine",
                                         "metrics", "runs"} <= set(a["views"])
    same = lambda r: {k: v for k, v in r.items() if k not in ("runs", "storage")}  # noqa: E731
    assert same(a["rows"]) == same(b["rows"])
    assert b["rows"]["runs"] == a["rows"]["runs"] + 1  # the second build's own run
    runs = analyst.query(env.feature_store, "SELECT run_id, job, status, finished_at FROM runs").to_pylist()
    by_id = {r["run_id"]: r for r in runs}
    assert by_id[res.run_id]["status"] == "STARTED"  # its own run, as of its build
    done = [r for r in runs if r["status"] == "SUCCESS"]
    assert len(done) >= len(registered_shards(env.feature_store)) + 1 and all(r["finished_at"] for r in done)


def test_cli_sql_and_neighbors(env, capsys):
    root = str(env.root)
    rc, out, _ = cli(capsys, "--store", root, "sql",
                     "SELECT dataset, split, count(*) AS clips FROM anonymized_features GROUP BY ALL ORDER BY ALL")
    assert rc == 0 and out.splitlines()[0].split() == ["dataset", "split", "clips"] and "rows)" in out
    rc, out, _ = cli(capsys, "--store", root, "sql", "SELECT count(*) AS n FROM anonymized_features",
                     "--format", "json")
    total = sum(env.feature_store.committed(s)["clips"] for s in registered_shards(env.feature_store))
    assert rc == 0 and json.loads(out) == [{"n": total}]
    rc, out, _ = cli(capsys, "--store", root, "sql", "SELECT video_id, dataset FROM videos ORDER BY ALL LIMIT 2",
                     "--format", "csv")
    assert rc == 0 and out.splitlines()[0] == "video_id,dataset" and len(out.splitlines()) == 3

    vid, ds = analyst.query(env.feature_store, "SELECT video_id, dataset FROM anonymized_features WHERE dataset = 'ar' "
                                "ORDER BY video_id LIMIT 1").to_pylist()[0].values()
    rc, out, _ = cli(capsys, "--store", root, "neighbors", vid, "--dataset", ds, "--k", "3", "--format", "json")
    rows = json.loads(out)
    assert rc == 0 and len(rows) == 3 and all(r["video_id"] != vid or r["dataset"] != ds for r in rows)
    assert rows[0]["similarity"] >= rows[-1]["similarity"]
    rc, out, _ = cli(capsys, "--store", root, "neighbors", vid, "--dataset", ds, "--k", "2")
    assert rc == 0 and out.splitlines()[0].split() == ["video_id", "clip_index", "split", "similarity", "dataset"]
    rc, out, _ = cli(capsys, "--store", root, "neighbors", vid, "--dataset", ds, "--k", "3", "--format", "json",
                     "--search", "exact")
    assert rc == 0 and json.loads(out) == rows  # auto is exact for a table without an IVF index
    rc, _, err = cli(capsys, "--store", root, "neighbors", vid, "--dataset", ds, "--search", "approximate")
    assert rc == 2 and "no approximate index" in err

    # read-only, and clear errors with exit code 2
    rc, _, err = cli(capsys, "--store", root, "sql", "CREATE TABLE t AS SELECT 1")
    assert rc == 2 and "read-only" in err.lower()
    rc, _, err = cli(capsys, "--store", root, "sql", "SELECT nope FROM videos")
    assert rc == 2 and "nope" in err
    rc, _, err = cli(capsys, "--store", root, "neighbors", "no_such_video")
    assert rc == 2 and "no video 'no_such_video' is registered" in err  # unlike a video not yet published
    empty = str(env.tmp.mktemp("empty"))
    rc, _, err = cli(capsys, "--store", empty, "sql", "SELECT 1")
    assert rc == 2 and "run feature_catalog first" in err
    rc, _, err = cli(capsys, "--store", empty, "neighbors", vid)
    assert rc == 2 and "no AAM version in" in err and "splavu train" in err


def test_automation_rolls_out_a_new_version_then_rebuilds_the_catalog_once(env):
    stage(env, "v2 rolled out", roll_out_v2)


def roll_out_v2(env):
    store = env.feature_store
    for shard in registered_shards(store):  # tiny_store extracted them through another instance: record them here
        env.inst.report_runless_asset_event(dg.AssetMaterialization("clip_latents", partition=shard))
    assert automation(env) == ([], 0)  # turning the sensor on does not replay what is already published
    v2 = train_aam(env.inst, env.store, seed=1)
    assert v2 != env.v1 and ledger.current_version(store) == env.v1  # recorded, not current before it is published
    assert target_versions(store) == [env.v1, v2] and unpinned_version(store) == v2
    shards = registered_shards(store)
    assert automation(env) == (shards, 0)  # every shard; the catalog waits for them

    for s in shards[:-1]:
        md = run_unpinned(env, s)
        assert md["aam_version"] == v2 and md["is_current"] is False
    assert ledger.current_version(store) == env.v1  # not current until every registered shard has its table
    md = run_unpinned(env, shards[-1])
    assert md["is_current"] is True and ledger.current_version(store) == v2
    for v in (env.v1, v2):  # both versions coexist, each complete and readable
        assert shards_lacking(store, v) == [] and pub.read_anonymized(store, version=v).num_rows > 0
    assert automation(env) == ([], 1)  # every shard done, the gates passed: the catalog, once
    res = dg.materialize([feature_catalog], instance=env.inst, resources={"store": env.store})
    assert res.asset_materializations_for_node("feature_catalog")[0].metadata["aam_version"].value == v2
    assert analyst.query(env.feature_store, "SELECT DISTINCT aam_version FROM anonymized_features").to_pylist() == [
        {"aam_version": v2}]
    assert automation(env) == ([], 0)
    env.v2 = v2


def test_automation_waits_while_a_blocking_gate_fails(v2, monkeypatch):
    env = v2
    monkeypatch.setenv("SPLAVU_PRIVACY_BUDGET", "1.01")  # no adapter removes more than all leakage
    md = run_unpinned(env, "ar-000")  # nothing to write, but the gates judge v2 again: refused
    assert md["skipped"] is True and md["aam_version"] == env.v2
    env.inst.report_runless_asset_event(dg.AssetMaterialization("clip_latents", partition="tad-000"))  # re-extracted
    assert automation(env) == ([], 0)  # neither the shard nor the catalog while privacy_budget fails
    assert automation(env) == ([], 0)
    monkeypatch.setenv("SPLAVU_PRIVACY_BUDGET", "-1")
    assert run_unpinned(env, "ar-000")["skipped"] is True  # the gates pass again
    assert automation(env) == (["tad-000"], 1)  # the shard that waited, and the catalog
    assert run_unpinned(env, "tad-000")["skipped"] is True
    dg.materialize([feature_catalog], instance=env.inst, resources={"store": env.store})  # after tad-000's run
    assert automation(env) == ([], 0)


def test_automation_publishes_a_new_shard_once_its_latents_land(v2):
    stage(v2, "extra shard published", publish_extra_shard)


def publish_extra_shard(env):
    from splavu_core.ingest.datasets import register_dataset

    store = env.feature_store
    # a new dataset arrives (as from the inbox): register it, and give it latents (a copy of ar-000's)
    assert register_dataset(store, "extra", env.bench / "ar" / "manifest.csv", shard_size=10 ** 6) == ["extra-000"]
    shutil.copytree(store.shard_dir("ar-000"), store.shard_dir("extra-000"))
    shutil.copy(store.shard_manifest_path("ar-000"), store.shard_manifest_path("extra-000"))
    env.inst.add_dynamic_partitions("shards", ["extra-000"])  # as the inbox sensor / `splavu ingest` do
    assert automation(env) == ([], 0)  # its latents are not materialised yet
    env.inst.report_runless_asset_event(dg.AssetMaterialization("clip_latents", partition="extra-000"))
    assert automation(env) == (["extra-000"], 0)
    md = run_unpinned(env, "extra-000")
    assert md["skipped"] is False and md["aam_version"] == env.v2 and md["is_current"] is True
    assert shards_lacking(store, env.v2) == []


def test_a_rollback_sticks(extra_shard):
    env = extra_shard
    store = env.feature_store
    ledger.set_current(store, env.v1)  # roll back by hand
    assert target_versions(store) == [env.v1]  # v2 was current once: it is not "being rolled out" again
    assert unpinned_version(store) == env.v1  # so an unpinned run publishes what analysts read
    assert shards_lacking(store, env.v1) == ["extra-000"]
    current, why = maybe_promote(store, env.v2)  # v2 is complete, but must not undo the rollback
    assert current is False and "made current once before" in why and ledger.current_version(store) == env.v1
    ledger.set_current(store, env.v2)


def test_schedule_is_defined_stopped_and_requests_what_is_missing(v2, monkeypatch):
    env = v2
    assert reanonymize_schedule.name == "reanonymize_schedule" and reanonymize_schedule.job_name == "reanonymize"
    assert reanonymize_schedule.default_status == dg.DefaultScheduleStatus.STOPPED
    assert reanonymize_schedule.cron_schedule == "0 3 * * *"
    monkeypatch.setenv("SPLAVU_REANONYMIZE_CRON", "*/15 * * * *")
    assert build_reanonymize_schedule().cron_schedule == "*/15 * * * *"

    with schedule_ticks(env) as tick:
        nothing = tick()
        assert nothing.run_requests == [] and "complete table" in nothing.skip_message
        gone = pub.anonymized_path(env.feature_store, env.v2, "tad-000")
        gone.unlink()
        reqs = tick().run_requests
    assert [r.partition_key for r in reqs] == ["tad-000"] and reqs[0].tags["splavu/trigger"] == "cron"
    assert execute(env, reqs[0])["skipped"] is False and gone.is_file()


def test_retention_keeps_the_newest_versions(v2):
    env = v2
    store = env.feature_store
    req = dg.RunRequest(partition_key="ar-000", run_config={"ops": {"anonymized_features": {"config": {
        "aam_version": env.v2, "retention": 1}}}})
    md = execute(env, req)
    assert md["skipped"] is True and md["retention"]["deleted"] == [env.v1]
    assert not pub.anonymized_dir(store, env.v1).exists() and shards_lacking(store, env.v2) == []
    assert pub.read_anonymized(store).num_rows == sum(store.committed(s)["clips"] for s in registered_shards(store))


def _snapshot(store):
    return {p: p.read_bytes() for p in sorted((store.root / "anonymized").rglob("*.parquet"))}


def test_missing_or_foreign_aam_is_a_clear_error_and_tables_stay_readable(v2, tiny_store):
    env = v2
    feature_store = env.feature_store
    before = _snapshot(feature_store)

    def publish(store, version, pattern):
        with pytest.raises(ledger.PublishError, match=pattern):
            dg.materialize([anonymized_features], instance=env.inst, partition_key="ar-000",
                           resources={"store": store}, run_config={"ops": {"anonymized_features": {"config": {
                               "aam_version": version}}}})

    publish(env.store, "0123456789abcdef", "is not recorded .* materialise aam_model first")
    aam_dir = feature_store.root / "aam" / env.v2
    aside = feature_store.root / "aam_aside"
    aam_dir.rename(aside)  # recorded, but the adapter files are gone
    try:
        publish(env.store, "", r"no AAM adapter at .*train aam_model first")
    finally:
        aside.rename(aam_dir)
    # an adapter trained on another encoder's latents, copied into the store by hand
    from splavu_core.aam import AAMConfig, AnonymizingAdapter, save_adapter

    cfg = AAMConfig(dim=feature_store.committed("ar-000")["dim"], layers=1, heads=2, sub_tokens=4, token_width=16)
    tmp = feature_store.root / "aam" / "foreign-tmp"
    foreign = save_adapter(AnonymizingAdapter(cfg), cfg, tmp, "videomae-other")
    tmp.rename(feature_store.root / "aam" / foreign)
    publish(env.store, foreign, "trained on latents of encoder 'videomae-other'.*refusing to mix")
    shutil.rmtree(feature_store.root / "aam" / foreign)
    assert _snapshot(feature_store) == before  # nothing published, nothing removed
    assert pub.read_anonymized(feature_store).num_rows > 0
    assert analyst.query(feature_store, "SELECT count(*) AS n FROM anonymized_features").to_pylist()[0]["n"] > 0

    fresh = env.tmp.mktemp("noaam") / "store"  # a store that never had an AAM
    shutil.copytree(tiny_store, fresh)
    publish(StoreResource(root=str(fresh)), "", "no AAM version is recorded .* materialise aam_model first")
    assert not (fresh / "anonymized").exists()


PUBLISH_SCRIPT = """
import json, sys
import dagster as dg
import splavu_core.extract.encoders.vfm as vfm
def refuse(*a, **k):
    raise AssertionError("the encoder must never be loaded")
vfm.load_encoder = refuse
from pipeline.runner import run_reanonymize
from assets.resources import StoreResource
out = run_reanonymize(dg.DagsterInstance.ephemeral(), StoreResource(root=sys.argv[1]), shard_keys=[sys.argv[2]])
print(json.dumps({"skipped": out["shards"][sys.argv[2]]["skipped"], "views": out["catalog"]["views"],
                  "transformers_imported": "transformers" in sys.modules}))
"""


def test_publishing_never_imports_transformers(v2):
    env = v2
    copy = env.tmp.mktemp("subproc") / "store"
    shutil.copytree(env.root, copy)
    (copy / "anonymized" / env.v2 / "gait-000.parquet").unlink()
    out = subprocess.run([sys.executable, "-c", PUBLISH_SCRIPT, str(copy), "gait-000"], cwd=REPO, capture_output=True,
                         text=True, env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin", "OMP_NUM_THREADS": "1"})
    assert out.returncode == 0, out.stderr[-3000:]
    res = json.loads(out.stdout.strip().splitlines()[-1])
    assert res == {"skipped": False, "views": res["views"], "transformers_imported": False}
    assert (copy / "anonymized" / env.v2 / "gait-000.parquet").is_file()


def test_definitions_wire_up():
    defs = local_defs(StoreResource())
    dg.Definitions.validate_loadable(defs)
    assert defs.resolve_job_def("reanonymize").partitions_def.name == "shards"
    assert defs.resolve_job_def("refresh_catalog").partitions_def is None
    assert {s.name for s in defs.sensors} == {"reanonymize_automation"}
    for asset, label in (("anonymized_features", "reanonymize"), ("feature_catalog", "refresh_catalog")):
        assert defs.resolve_assets_def(asset).automation_conditions_by_key[dg.AssetKey(asset)].get_label() == label


def test_a_version_failing_the_budget_stays_out(env, monkeypatch):
    monkeypatch.setenv("SPLAVU_PRIVACY_BUDGET", "1.01")  # no adapter removes more than all leakage
    before = ledger.current_version(env.feature_store)
    v = train_aam(env.inst, env.store, seed=5)
    out = run_reanonymize(env.inst, env.store, version=v, catalog=False)
    assert shards_lacking(env.feature_store, v) == []  # every table written...
    assert ledger.current_version(env.feature_store) == before  # ...but the version never became current
    last = [md for md in out["shards"].values() if "budget" in str(md.get("promotion", ""))]
    assert last and "not made current" in last[-1]["promotion"]
    assert "budget 1.01" in ledger.refused_versions(env.feature_store)[v]["why"]  # recorded for the analysts' notice
    cat.build_catalog(env.feature_store)  # and the refused table stays out of the analysts' catalog
    assert v not in analyst.query(env.feature_store, "SELECT DISTINCT aam_version FROM anonymized_features_all")["aam_version"].to_pylist()


def test_cli_store_option_after_the_subcommand(env, capsys):
    """The README: every command takes --store; after the subcommand too (it used to be refused there)."""
    rc, out, err = cli(capsys, "sql", "--store", str(env.root), "SELECT count(*) AS n FROM videos", "--format", "json")
    assert rc == 0 and json.loads(out)[0]["n"] > 0, err
    rc, _, err = cli(capsys, "--store", str(env.tmp.mktemp("elsewhere")), "sql", "--store", str(env.root), "SELECT 1")
    assert rc == 0, err  # the one after the subcommand wins


def test_cli_runs_are_the_code_locations_named_jobs(env):
    """What `splavu train` / `publish` start shows in the instance's run records (and so in the UI) under the job's
    name with its asset selection, never as __ephemeral_asset_job__ with an empty selection."""
    runs = [r for r in env.inst.get_runs() if r.tags.get("splavu/entry") == "cli"]
    by_job: dict[str, set] = {}
    for r in runs:
        by_job.setdefault(r.job_name, set()).update(k.to_user_string() for k in r.asset_selection or ())
    assert by_job["train_aam"] == {"aam_model"}
    assert by_job["reanonymize"] == {"anonymized_features"} and by_job["refresh_catalog"] == {"feature_catalog"}
    assert "__ephemeral_asset_job__" not in by_job
    shard_runs = [r for r in runs if r.job_name == "reanonymize"]
    assert {r.tags["dagster/partition"] for r in shard_runs} >= set(env.first["shards"])


def test_sensors_that_write_to_the_store_start_stopped():
    """`dagster dev` must not launch runs that write to the store until someone turns a sensor on."""
    from pipeline.definitions import defs

    # every sensor of the location (no implicit default automation sensor: reanonymize_automation covers the
    # only assets with conditions)
    assert {s.name: s.default_status for s in defs.get_repository_def().sensor_defs} == {
        name: dg.DefaultSensorStatus.STOPPED for name in ("inbox_sensor", "reanonymize_automation")}
