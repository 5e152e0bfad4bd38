"""Scale-out on an existing engine: the code location's own jobs, run by dagster-dask's executor on a
dask.distributed cluster of two worker processes (loopback), write the same store as Dagster's
multiprocess executor: latents byte for byte, anonymized and metric tables row for row.

The jobs are reconstructed from the module the UI and the daemon load (pipeline.definitions), every
resource reaches the steps through run config only, and each step's pid is checked against the
processes it was meant to run in. The instance has the concurrency settings of the shipped
dagster.yaml, which shows what the `encoder` pool does under each engine: the multiprocess executor
waits for a slot, the dask executor never asks for one (only the run queue can hold dask runs back,
with the run granularity of deploy/dask/dagster.yaml).
"""
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import dagster as dg
import numpy as np
import pyarrow.parquet as pq
import pytest
import yaml
from dagster import serialize_value

from pipeline.executors import code_location_job, run_config_for

REPO = Path(__file__).resolve().parents[1]
SMALL_ADAPTER = {"layers": 1, "heads": 2, "sub_tokens": 4, "token_width": 16}
FAST_PROBES = {"ar_epochs": 15, "tad_epochs": 5, "ad_epochs": 10, "privacy_epochs": 25}
RUN_TIMEOUT_S = float(os.environ.get("SPLAVU_TEST_RUN_TIMEOUT_S", "240"))  # one job run; past it the test fails (< pyproject timeout)
TIME_COLUMNS = {"created_at", "when"}  # wall-clock stamps: the only columns allowed to differ
SHARDS = ("tad-000", "tad-001")        # the tiny tad set in shards of 6 videos (static latents in both)
ANON_SHARD = "ar-000"
POOL = "encoder"


# ---------------------------------------------------------------- the engines

@pytest.fixture(scope="module")
def env():
    """One torch thread in every process that computes (steps inherit it; dask's nanny sets it too), so
    both engines do the same arithmetic; the privacy gate open, as in test_reanonymize."""
    with pytest.MonkeyPatch.context() as mp:
        for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
            mp.setenv(var, "1")
        mp.setenv("SPLAVU_PRIVACY_BUDGET", "-1")
        mp.setenv("SPLAVU_UTILITY_GATE", "-1")  # the utility gate off too: not measured (splavu_core.evaluation.gates)
        yield


@pytest.fixture(scope="module")
def cluster(env):
    """A real dask.distributed cluster: a scheduler and two worker processes on 127.0.0.1, closed after."""
    from distributed import Client, LocalCluster

    c = LocalCluster(n_workers=2, processes=True, host="127.0.0.1", threads_per_worker=1, dashboard_address=None)
    try:
        with Client(c) as client:
            c.worker_pids = set(client.run(os.getpid).values())
        assert len(c.worker_pids) == 2 and os.getpid() not in c.worker_pids
        yield c
    finally:
        c.close(timeout=60)  # a stuck task must not hang the session after its test failed


def instance_settings(path: Path) -> dict:
    return {"concurrency": yaml.safe_load(path.read_text())["concurrency"]}


# Step output is not captured here: Dagster's local capture tails each step's log file with `tail -F` and, on a dask
# worker, once hung the step's teardown waiting for that tail to end (a worker thread in compute_logs'
# _clean_up_subprocess; the run never finished, 2026-12-05). Nothing here reads captured output.
NO_CAPTURE = {"compute_logs": {"module": "dagster._core.storage.noop_compute_log_manager",
                               "class": "NoOpComputeLogManager"}}


@pytest.fixture(scope="module")
def instance(tmp_path_factory, env):
    """A persistent (sqlite) instance with the shipped dagster.yaml's concurrency settings; the dask
    workers and the step processes write their events to it."""
    inst = dg.DagsterInstance.local_temp(str(tmp_path_factory.mktemp("dagster_home")),
                                         overrides={**instance_settings(REPO / "dagster.yaml"), **NO_CAPTURE})
    try:
        yield inst
    finally:
        inst.dispose()


def engines(cluster) -> dict:
    # forkserver: step processes fork from one that has imported the code location once (~5 s a step here)
    return {"multiprocess": {"multiprocess": {"max_concurrent": 2, "start_method": {
                "forkserver": {"preload_modules": ["pipeline.definitions"]}}}},
            "dask": {"dask": {"cluster": {"existing": {"address": cluster.scheduler_address}}}}}


class Run:
    """One run of a pipeline.definitions job, reconstructed from the module as `dagster dev` does, in a
    process of its own (tests/cluster_run.py says why not a thread) so that several can be in flight;
    resources only through run config."""

    def __init__(self, instance, name: str, engine: dict, root, partition: str | None = None,
                 ops: dict | None = None, encoder: dict | None = None):
        self.instance, self.name, self.engine = instance, name, engine
        self.run_config = run_config_for(engine, root, encoder=encoder, ops=ops)
        self.tags = {"test/engine": next(iter(engine)), **({"dagster/partition": partition} if partition else {})}
        self.proc = None

    def start(self):
        args = {"instance_ref": serialize_value(self.instance.get_ref()), "job": self.name,
                "run_config": self.run_config, "tags": self.tags}
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
        self.proc = subprocess.Popen([sys.executable, str(REPO / "tests" / "cluster_run.py"), json.dumps(args)],
                                     cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    def result(self, timeout: float = RUN_TIMEOUT_S) -> dict[str, int]:
        try:
            out, err = self.proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:  # fail with evidence: every thread's stack, the run's events, dask's view
            self.proc.send_signal(signal.SIGUSR1)
            time.sleep(2)
            self.proc.kill()
            out, err = self.proc.communicate()
            pytest.fail(f"{self.name} on {next(iter(self.engine))}: still running after {timeout} s\n"
                        f"{stuck_report(self)}\nthe run's process, all threads:\n{err[-20000:]}", pytrace=False)
        assert self.proc.returncode == 0, f"{self.name}: its process exited {self.proc.returncode}:\n{err[-5000:]}"
        res = json.loads(out.strip().splitlines()[-1])
        assert res["success"], f"{self.name} on {next(iter(self.engine))} failed: {res['failures']}"
        self.run_id = res["run_id"]
        return res["pids"]


def stuck_report(run: Run) -> str:
    """Where a run that does not end is: its last events and (dask) what each worker is executing, with
    stacks. Safe to call here: no other run shares this process."""
    lines = []
    for r in run.instance.get_runs(dg.RunsFilter(tags=run.tags), limit=1):
        lines += [f"run {r.run_id} {r.status.value}, last events:"]
        lines += [f"  {e.dagster_event.event_type_value if e.dagster_event else ''} {e.step_key or ''} "
                  f"{(e.message or '')[:200]}" for e in run.instance.all_logs(r.run_id)[-15:]]
    address = run.engine.get("dask", {}).get("cluster", {}).get("existing", {}).get("address")
    if address:
        from distributed import Client

        with Client(address, timeout=10) as client:
            lines += ["dask processing:", repr(client.processing()), "dask call stacks:", repr(client.call_stack())]
    return "\n".join(lines)


def run_job(*args, **kw) -> dict[str, int]:
    r = Run(*args, **kw)
    r.start()
    return r.result()


def assert_ran_in(pids: dict[str, int], engine: str, cluster):
    assert pids and os.getpid() not in pids.values(), f"{engine}: a step ran in the test process: {pids}"
    if engine == "dask":
        assert set(pids.values()) <= cluster.worker_pids, f"dask: steps ran outside the workers: {pids}"
    else:
        assert not set(pids.values()) & cluster.worker_pids
        assert len(set(pids.values())) == len(pids), f"multiprocess: one process per step expected: {pids}"


def wait_for(what, timeout: float = 120):
    t0 = time.monotonic()
    while not (found := what()):
        assert time.monotonic() - t0 < timeout, f"gave up after {timeout} s waiting for {what.__doc__}"
        time.sleep(0.2)
    return found


def run_events(instance, engine: str, partition: str) -> list:
    runs = instance.get_runs(dg.RunsFilter(tags={"test/engine": engine, "dagster/partition": partition}))
    return [e for r in runs for e in instance.all_logs(r.run_id)]


# ---------------------------------------------------------------- comparing stores

def files_under(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def rows(path: Path) -> list[tuple]:
    """The rows of a Parquet table without its wall-clock columns, sorted (concurrent steps append in any order)."""
    t = pq.read_table(path)
    t = t.drop_columns([c for c in t.column_names if c in TIME_COLUMNS])
    assert t.num_rows > 0, f"{path}: no rows"
    def cell(v):  # NaN (e.g. a retention with raw at chance) equals itself here; lists and dicts as text
        return str(v) if isinstance(v, (list, dict)) or (isinstance(v, float) and math.isnan(v)) else v
    return sorted((tuple(cell(v) for v in r.values()) for r in t.to_pylist()), key=repr)


def assert_same_tables(a: Path, b: Path, pattern: str):
    pa_, pb = sorted(a.glob(pattern)), sorted(b.glob(pattern))
    assert pa_ and [p.relative_to(a) for p in pa_] == [p.relative_to(b) for p in pb], f"{pattern}: {pa_} vs {pb}"
    for x, y in zip(pa_, pb):
        assert rows(x) == rows(y), f"{x.relative_to(a)} differs between the engines"


# ---------------------------------------------------------------- 1. latents, and the encoder pool

@pytest.fixture(scope="module")
def extracted(tiny_bench, tiny_videomae, instance, cluster, tmp_path_factory):
    """With the only `encoder` slot held by someone else: dask extracts both tad shards in two concurrent
    runs (they finish: dask never asks for the slot); a multiprocess run of tad-000 waits for the slot
    until the test frees it."""
    from assets.resources import StoreResource
    from pipeline.runner import ingest

    bench, _ = tiny_bench
    roots = {e: tmp_path_factory.mktemp(f"extract_{e}") / "store" for e in ("multiprocess", "dask")}
    for root in roots.values():
        assert ingest(instance, StoreResource(root=str(root)), "tad", str(bench / "tad" / "manifest.csv"), 6) == \
            list(SHARDS)
    storage = instance.event_log_storage
    assert storage.initialize_concurrency_limit_to_default(POOL)
    pool_limit = storage.get_concurrency_info(POOL).slot_count
    assert storage.claim_concurrency_slot(POOL, "someone-else", "their_step").is_claimed

    encoder = {"checkpoint": str(tiny_videomae), "threads": 1, "decode_threads": 1}
    cfg = engines(cluster)
    t0 = time.monotonic()
    dask_runs = [Run(instance, "extract_latents", cfg["dask"], roots["dask"], partition=s, encoder=encoder)
                 for s in SHARDS]
    for r in dask_runs:
        r.start()
    dask_pids = {s: r.result() for s, r in zip(SHARDS, dask_runs)}
    dask_secs = time.monotonic() - t0

    mp = Run(instance, "extract_latents", cfg["multiprocess"], roots["multiprocess"], partition=SHARDS[0],
             encoder=encoder)
    mp.start()
    try:
        def blocked():
            """the multiprocess run's encoder step to report that it waits for the pool"""
            return [e for e in run_events(instance, "multiprocess", SHARDS[0])
                    if e.step_key == "extracted_latents" and f"blocked by limit for pool {POOL}" in (e.user_message or "")]
        run_id = wait_for(blocked)[0].run_id
        # the step asked the pool for its only slot and queues for it: pending there, holding none (read from the
        # pool's own records, not inferred from a pause)
        info = storage.get_concurrency_info(POOL)
        queued = run_id in info.pending_run_ids and run_id not in info.active_run_ids
        events_while_held = len(instance.all_logs(run_id))
    finally:
        storage.free_concurrency_slots_for_run("someone-else")
    mp_pids = mp.result()
    log = instance.all_logs(run_id)  # in the order written: whatever came before the slot was freed comes first
    starts = [i for i, e in enumerate(log)
              if e.step_key == "extracted_latents" and e.dagster_event_type == dg.DagsterEventType.STEP_START]
    return {"roots": roots, "dask_pids": dask_pids, "mp_pids": mp_pids, "pool_limit": pool_limit,
            "mp_queued_while_held": queued, "mp_started_while_held": [i for i in starts if i < events_while_held],
            "mp_started_after": bool(starts) and min(starts) >= events_while_held, "dask_secs": dask_secs}


def test_shipped_encoder_pool_limit_is_one_and_multiprocess_waits_for_it(extracted):
    assert extracted["pool_limit"] == 1  # dagster.yaml: concurrency.pools.default_limit
    assert extracted["mp_queued_while_held"], "the multiprocess encoder step was not queued for the pool's slot"
    assert extracted["mp_started_while_held"] == [], "the multiprocess encoder step ran without a pool slot"
    assert extracted["mp_started_after"], "the multiprocess encoder step did not start once the slot was free"


def test_dask_ignores_the_encoder_pool_and_keeps_concurrent_runs_apart(extracted, cluster):
    """Both dask runs finished while the only slot was held elsewhere, and both shards were written
    (dagster-dask's own task keys would have merged the two runs: pipeline/dask_engine.py)."""
    fs_root = extracted["roots"]["dask"]
    for shard, pids in extracted["dask_pids"].items():
        assert set(pids) == {"video_manifest", "extracted_latents"}
        assert_ran_in(pids, "dask", cluster)
        assert (fs_root / "latents" / shard / "clips.parquet").is_file(), f"{shard}: not written"
    a, b = (pq.read_table(fs_root / "latents" / s / "clips.parquet") for s in SHARDS)
    assert a.num_rows and b.num_rows and not set(a.column("video_id").to_pylist()) & set(b.column("video_id").to_pylist())


def test_dask_extracts_the_same_latents_as_multiprocess(extracted, cluster):
    import zarr

    assert set(extracted["mp_pids"]) == {"video_manifest", "extracted_latents"}
    assert_ran_in(extracted["mp_pids"], "multiprocess", cluster)
    shard = SHARDS[0]
    a, b = (extracted["roots"][e] / "latents" / shard for e in ("multiprocess", "dask"))
    fa, fb = files_under(a), files_under(b)
    assert {"clips.parquet", "static.parquet", "quarantine.parquet"} <= set(fa) and sorted(fa) == sorted(fb)
    differ = [k for k in fa if fa[k] != fb[k]]
    assert not differ, f"{shard}: files differ between multiprocess and dask: {differ}"
    za, zb = (zarr.open_group(str(p / "latents.zarr"), mode="r") for p in (a, b))
    for name in ("clips", "static"):
        x, y = za[name][:], zb[name][:]
        assert x.dtype == np.float32 and x.size > 0 and x.shape == y.shape and np.array_equal(x, y)
    assert_same_tables(*(extracted["roots"][e] for e in ("multiprocess", "dask")), f"manifests/{shard}.parquet")


def test_the_dask_workaround_is_still_needed(extracted, instance):
    """pipeline/dask_engine.py hands the run to dask inside an opaque box because distributed's argument
    parsing cannot walk a partitioned DagsterRun. When this fails, upstream fixed it: drop the box."""
    from dask._task_spec import parse_input

    run = instance.get_runs(dg.RunsFilter(tags={"test/engine": "dask", "dagster/partition": SHARDS[0]}))[0]
    assert run.partitions_subset is not None or run.run_op_concurrency is not None
    with pytest.raises(Exception, match="Iteration is not allowed"):
        parse_input(run)


def test_run_granularity_makes_the_run_queue_hold_back_a_second_encoder_run(tmp_path):
    """The run queue is what limits encoder work under dask: with deploy/dask/dagster.yaml's
    `granularity: run` the queued-run coordinator (its counter, given what the daemon gives it) keeps a
    second extract_latents run queued while one is in progress; with the local default (op) it
    releases it, and the dask executor would then run two encoder steps at once."""
    from dagster import DagsterRunStatus
    from dagster._core.op_concurrency_limits_counter import GlobalOpConcurrencyLimitsCounter

    from pipeline.definitions import defs

    job = defs.resolve_job_def("extract_latents")
    verdicts = {}
    for name, path in (("local", REPO / "dagster.yaml"), ("dask", REPO / "deploy" / "dask" / "dagster.yaml")):
        (tmp_path / name).mkdir()
        inst = dg.DagsterInstance.local_temp(str(tmp_path / name), overrides=instance_settings(path))
        try:
            inst.add_dynamic_partitions("shards", list(SHARDS))
            # the candidate's status does not matter to the counter (a QUEUED one would need a code-server origin)
            running, candidate = (inst.create_run_for_job(job, run_config={}, tags={"dagster/partition": s}, status=st)
                                  for s, st in zip(SHARDS, (DagsterRunStatus.STARTED, DagsterRunStatus.NOT_STARTED)))
            assert candidate.run_op_concurrency.all_pools == {POOL}
            in_progress = inst.get_run_records(dg.RunsFilter(statuses=[DagsterRunStatus.STARTED]))

            def daemon_pass():  # the counter as QueuedRunCoordinatorDaemon builds it on each pass
                return GlobalOpConcurrencyLimitsCounter(
                    inst, [candidate], in_progress, concurrency_keys=inst.event_log_storage.get_concurrency_keys(),
                    pool_limits=inst.event_log_storage.get_pool_limits(),
                    pool_granularity=inst.get_concurrency_config().pool_config.pool_granularity)
            daemon_pass()  # the first pass creates the pool at its default limit
            verdicts[name] = daemon_pass().is_blocked(candidate)
            assert inst.event_log_storage.get_concurrency_info(POOL).limit == 1
        finally:
            inst.dispose()
    assert verdicts == {"local": False, "dask": True}


# ---------------------------------------------------------------- 2. anonymization and evaluation

@pytest.fixture(scope="module")
def trained(tiny_store, instance, tmp_path_factory):
    """tiny_store with a small AAM recorded and every shard but ar-000 published (outside the compared runs);
    the privacy-budget measurements the promotion gate and the check ask for are cached in the store."""
    from splavu_core.aam.io import adapter_version, save_adapter
    from splavu_core.aam.config import TrainConfig
    from splavu_core.aam.train import train_aam
    from splavu_core.aam.training_data import load_training_data
    from splavu_core.evaluation.gates import measure_gates
    from splavu_core.publish.anonymized_tables import anonymize_shard
    from splavu_core.store.feature_store import FeatureStore
    from splavu_core.store.ledger import record_version

    root = tmp_path_factory.mktemp("trained") / "store"
    shutil.copytree(tiny_store, root, ignore=shutil.ignore_patterns(".*.lock"))
    store = FeatureStore(root)
    cfg = TrainConfig.from_flat(dict(epochs=3, batch=64, pretrain_head_epochs=2, w_lc=1.0, lr=3e-3,
                                     adapter=SMALL_ADAPTER))
    adapter, acfg, _ = train_aam(load_training_data(store), cfg, log=None)
    fp = store.encoder_fingerprint()
    version = adapter_version(adapter, acfg, fp)
    save_adapter(adapter, acfg, root / "aam" / version, fp)
    record_version(store, version, {"encoder_fingerprint": fp, "config": acfg.to_dict()}, make_current=False)
    shards = store.committed_shards()
    assert ANON_SHARD in shards and len(shards) > 2
    for shard in shards:
        if shard != ANON_SHARD:
            anonymize_shard(store, shard, root / "aam" / version)
    # the measurement the promotion gate and the privacy_budget check both read (one cache entry per version:
    # a check with other probe settings would replace it, and both would measure again inside the runs)
    measure_gates(store, version, utility=False)
    instance.add_dynamic_partitions("shards", [s for s in shards if not instance.has_dynamic_partition("shards", s)])
    return root, version


@pytest.fixture(scope="module")
def published_and_evaluated(trained, instance, cluster, tmp_path_factory):
    """Per engine, a copy of the trained store: reanonymize ar-000 (the asset and its privacy_budget check),
    then the whole evaluate job (six eval assets, the report, utility_retention)."""
    base, version = trained
    # two probe seeds: the engines must agree row for row, which does not need the report's five
    evals = {n: {"config": {**FAST_PROBES, "aam_version": version, "n_seeds": 2}} for n in
             ("action_recognition_eval", "temporal_detection_eval", "anomaly_detection_eval", "privacy_attack_eval",
              "bias_eval", "gait_eval")}
    evals["privacy_utility_report"] = {"config": {"aam_version": version, "n_seeds": 2}}
    out = {}
    for engine, cfg in engines(cluster).items():
        root = tmp_path_factory.mktemp(f"publish_{engine}") / "store"
        shutil.copytree(base, root)
        anon = run_job(instance, "reanonymize", cfg, root, partition=ANON_SHARD, ops={
            "anonymized_features": {"config": {"aam_version": version}},
            "anonymized_features_privacy_budget": {"config": {"aam_version": version}}})
        ev = run_job(instance, "evaluate", cfg, root, ops=evals)
        out[engine] = root, anon, ev
    return version, out


def test_dask_publishes_the_same_anonymized_table(published_and_evaluated, cluster):
    version, out = published_and_evaluated
    for engine, (_, anon, _) in out.items():
        assert set(anon) == {"anonymized_features", "anonymized_features_privacy_budget",
                             "anonymized_features_utility_budget"}
        assert_ran_in(anon, engine, cluster)
    a, b = out["multiprocess"][0], out["dask"][0]
    table = a / "anonymized" / version / f"{ANON_SHARD}.parquet"
    assert table.is_file() and pq.read_table(table).num_rows == \
        pq.read_table(a / "latents" / ANON_SHARD / "clips.parquet").num_rows
    assert_same_tables(a, b, f"anonymized/{version}/*.parquet")
    # ar-000 was the last shard: its run made the version current, in both stores
    assert_same_tables(a, b, "aam_versions.parquet")
    assert [r["is_current"] for r in pq.read_table(a / "aam_versions.parquet").to_pylist()] == [True]


def test_dask_evaluates_to_the_same_metrics_on_both_workers(published_and_evaluated, cluster):
    version, out = published_and_evaluated
    for engine, (_, _, ev) in out.items():
        assert len(ev) == 9 and {"privacy_utility_report", "unseen_tasks_eval"} <= set(ev), ev
        assert_ran_in(ev, engine, cluster)
    assert len(set(out["dask"][2].values())) == 2, f"the evaluation did not use both workers: {out['dask'][2]}"
    a, b = out["multiprocess"][0], out["dask"][0]
    assert_same_tables(a, b, "metrics/*.parquet")
    tasks = set(pq.read_table(next(a.glob("metrics/raw*.parquet"))).column("task").to_pylist())
    assert {"ar", "tad", "ad", "privacy", "gait"} <= tasks


# ---------------------------------------------------------------- choosing the engine

def test_a_cluster_whose_workers_run_several_threads_is_refused():
    """Two steps in two threads of one worker can deadlock on logging's locks (pipeline/dask_engine.py)."""
    from distributed import Client, LocalCluster

    from pipeline.dask_engine import check_one_thread_per_worker

    with LocalCluster(n_workers=1, threads_per_worker=2, processes=False, dashboard_address=":0") as c, \
            Client(c) as client:
        with pytest.raises(dg.DagsterInvariantViolationError, match=r"--nthreads 1"):
            check_one_thread_per_worker(client)
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=False, dashboard_address=":0") as c, \
            Client(c) as client:
        check_one_thread_per_worker(client)  # one thread each: accepted


def test_the_environment_chooses_the_default_engine():
    from pipeline.executors import default_engine

    assert default_engine({}) == {"multiprocess": {}}
    assert default_engine({"SPLAVU_EXECUTOR": "dask", "SPLAVU_DASK_SCHEDULER": "tcp://10.0.0.5:8786"}) == \
        {"dask": {"cluster": {"existing": {"address": "tcp://10.0.0.5:8786"}}}}
    assert default_engine({"SPLAVU_EXECUTOR": "dask"}) == {"dask": {"cluster": {"local": {}}}}
    with pytest.raises(ValueError, match="SPLAVU_EXECUTOR='celery'"):
        default_engine({"SPLAVU_EXECUTOR": "celery"})
    # what a code location loaded with that environment offers every job by default
    code = ("import json; from pipeline.definitions import defs; "
            "print(json.dumps(defs.resolve_job_def('extract_latents').executor_def.config_schema.as_field().default_value))")
    env = {**os.environ, "SPLAVU_EXECUTOR": "k8s"}
    out = subprocess.run([sys.executable, "-c", code], env=env, cwd=REPO, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert json.loads(out.stdout.strip().splitlines()[-1]) == {"k8s": {}}


def test_dask_workers_benchmark_runs_tiny(tiny_bench, tiny_videomae):
    """benchmarks/dask_workers.py (its smoke test lives here: it starts a cluster of its own) prints its JSON."""
    root, _ = tiny_bench
    p = subprocess.run([sys.executable, str(REPO / "benchmarks" / "dask_workers.py"), "--data", str(root),
                        "--datasets", "tad", "--shard-size", "20", "--checkpoint", str(tiny_videomae),
                        "--configs", "1_worker_1_thread"], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    out = json.loads(p.stdout[p.stdout.index("{"):])
    run = out["configs"]["1_worker_1_thread"]
    assert run["workers"] == 1 and run["clips_encoded"] > 0 and run["clips_per_s"] > 0
