"""Which engine runs a job's steps: Dagster's own executors, chosen per environment or per run.

Every job of the code location (pipeline/definitions.py) uses `splavu_executor`. It is a thin
selector over executors that Dagster and its integration libraries ship; nothing here schedules,
queues or moves data:

    multiprocess  (default) dagster's multiprocess_executor: one process per step on this machine
    in_process    dagster's in_process_executor: every step in the run's own process
    dask          dagster-dask's dask_executor: each step is a task on a dask.distributed cluster
    k8s           dagster-k8s's k8s_job_executor: each step is a Kubernetes Job (one pod per step)

The default engine comes from the environment of the process that loads the code location:

    SPLAVU_EXECUTOR=multiprocess|in_process|dask|k8s
    SPLAVU_DASK_SCHEDULER=tcp://scheduler:8786   dask: connect to this cluster (unset: a LocalCluster per run)

and any run can pick another in its run config, with that executor's own config under its name:

    execution:
      config:
        dask: {cluster: {existing: {address: "tcp://scheduler:8786"}}}

The dask and k8s branches are checked against dagster-dask's / dagster-k8s's own config schemas
when the run starts (those libraries are imported only then: importing dagster-dask costs ~1.5 s,
which every step process would otherwise pay). Resources reach the steps through run config or the
workers' environment (SPLAVU_STORE, ...), never through pickled objects.

What a cluster engine does not do (docs/scale-out.md, "The encoder pool"): the dask executor does not
claim Dagster concurrency-pool slots (the `encoder` pool is then enforced only by the run queue,
with `concurrency.pools.granularity: run`), and it ignores retry policies.
"""
from __future__ import annotations

import warnings
from contextlib import contextmanager
from pathlib import Path

import dagster as dg

from splavu_core.settings import ENGINES, read_settings, settings

CLUSTER_ENGINES = ("dask", "k8s")  # config checked against the integration library's schema at run start


@contextmanager
def _integration_import():
    """Imports dagster-dask / dagster-k8s without their version warning: the newest release of the
    integrations on the package index is one patch behind dagster (requirements-dagster.txt)."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Found version mismatch between `dagster-shared`")
        yield


def _cluster_executor(engine: str) -> dg.ExecutorDefinition:
    """The integration library's executor definition; imported only when a run asks for it (they are optional
    installs, and dagster_k8s pulls in the kubernetes client)."""
    with _integration_import():
        if engine == "dask":
            from dagster_dask import dask_executor  # optional install, only when asked for
            return dask_executor
        from dagster_k8s import k8s_job_executor  # optional install, only when asked for
        return k8s_job_executor


def engine_config(engine: str, config: dict | None) -> dict:
    """`config` for `engine` checked against that executor's own schema, defaults filled in.
    Raises DagsterInvalidConfigError naming execution.config.<engine> and the offending field."""
    if engine not in ENGINES:
        raise dg.DagsterInvalidConfigError(
            f"execution.config: unknown engine {engine!r} (one of {', '.join(ENGINES)})", [], config)
    if engine in CLUSTER_ENGINES:
        target = _cluster_executor(engine)
    else:
        target = dg.multiprocess_executor if engine == "multiprocess" else dg.in_process_executor

    @dg.job(name=f"check_{engine}_config", executor_def=target)
    def empty():  # an empty job that runs on `target`: its run config is checked by dagster's public validator
        pass

    try:
        checked = dg.validate_run_config(empty, {"execution": {"config": config or {}}})
    except dg.DagsterInvalidConfigError as e:
        raise dg.DagsterInvalidConfigError(f"Invalid config at execution.config.{engine} (checked against the "
                                           f"{engine} executor's schema)", e.errors, config) from None
    ((_, value),) = checked["execution"].items()  # {executor name: its config, defaults filled in}
    return value


def default_engine(env: dict | None = None) -> dict:
    """{engine: config} from SPLAVU_EXECUTOR / SPLAVU_DASK_SCHEDULER (env: this process's environment)."""
    s = settings() if env is None else read_settings(env)
    engine = s.executor
    if engine == "dask":
        address = s.dask_scheduler
        return {"dask": {"cluster": {"existing": {"address": address}} if address else {"local": {}}}}
    return {engine: {}}


def _requirements(config: dict) -> list:
    return [] if "in_process" in config else dg.multiple_process_executor_requirements()


def _config_schema() -> dg.Field:
    engines = {"multiprocess": dg.multiprocess_executor.config_schema.as_field(),
               "in_process": dg.in_process_executor.config_schema.as_field()}
    for name, lib in (("dask", "dagster-dask's dask_executor"), ("k8s", "dagster-k8s's k8s_job_executor")):
        engines[name] = dg.Field(dg.Permissive(), is_required=False,
                                 description=f"{lib} config; checked against its schema when the run starts")
    return dg.Field(dg.Selector(engines), default_value=default_engine(),
                    description=f"One Dagster executor per run; default from $SPLAVU_EXECUTOR")


@dg.executor(name="splavu", config_schema=_config_schema(), requirements=_requirements)
def splavu_executor(init_context: dg.InitExecutorContext) -> dg.Executor:
    """Runs the job with the Dagster executor named in execution.config (see the module doc)."""
    ((engine, config),) = init_context.executor_config.items()
    if engine == "dask":  # dagster-dask's executor, run-scoped (pipeline/dask_engine.py says why)
        with _integration_import():
            from pipeline.dask_engine import dask_engine  # loads distributed: dask runs only
        return dask_engine(engine_config(engine, config))
    if engine == "k8s":
        target, config = _cluster_executor(engine), engine_config(engine, config)
    else:
        target = dg.multiprocess_executor if engine == "multiprocess" else dg.in_process_executor
    inner = dg.InitExecutorContext(job=init_context.job, executor_def=target, executor_config=config,
                                instance=init_context.instance)
    return target.executor_creation_fn(inner)


# ---------------------------------------------------------------- running a job of the code location

def code_location_job(name: str):
    """Job `name` of pipeline.definitions as a ReconstructableJob, so that step processes, dask workers and pods
    load it from the module themselves (they call pipeline.definitions.job_named(name)). The module is named, not
    imported: pipeline.definitions imports this one."""
    return dg.build_reconstructable_job("pipeline.definitions", "job_named", reconstructable_args=(name,),
                                        reconstructor_working_directory=str(Path(__file__).resolve().parents[1]))


def run_config_for(engine: dict, store_root: str, encoder: dict | None = None, ops: dict | None = None,
                   log_level: str = "WARNING") -> dict:
    """Run config that takes everything a step needs to wherever it runs: the engine ({name: config}),
    the store root, the encoder resource's settings, op config."""
    resources = {"store": {"config": {"root": str(store_root)}}}
    if encoder:
        resources["encoder"] = {"config": dict(encoder)}
    return {"execution": {"config": engine}, "resources": resources, "ops": ops or {},
            "loggers": {"console": {"config": {"log_level": log_level}}}}
