"""dagster-dask's executor, with two defects of the installed release worked around (and nothing else).

Imported only by runs that choose the dask engine (pipeline/executors.py). The executor is
dagster_dask.executor.DaskExecutor itself: it builds the step graph, connects to the cluster and
submits one task per step; each task runs the step with dagster's execute_plan on a worker. Two
things break that for this code location, both in how the step's inputs are handed to
`Client.submit`, so the fix is a view of the run context that DaskExecutor.execute reads:

1. Partitioned runs, and runs with a concurrency pool, do not start ("Iteration is not allowed on
   `@record`s"): distributed's Client.submit walks every argument looking for futures, and
   DagsterRun's partitions_subset / run_op_concurrency are dagster @records, which refuse iteration.
   The run is handed over inside `_Opaque`, which dask passes through untouched and which unpickles
   as the DagsterRun itself on the worker.
2. Two concurrent runs of one job share task keys (`<job>.<step>`; dagster issue #21418): the
   scheduler takes the second run's step for the first run's, the second run reports success with
   the other run's events and its shard is never written. Concurrent runs of one job are the normal
   case here (one extract_latents run per shard), so the key includes the run id.

tests/test_cluster.py checks both against the real cluster, and that (1) is still needed.

One more guard, not a workaround: each dask task runs a step with execute_plan in a worker thread, and
two Dagster steps in two threads of one process can deadlock on the logging module's locks (a step's log
manager calls logging.config.dictConfig, which closes every live handler, while the other step sits in
its DagsterLogHandler; dagster-dask sets threads_per_worker=1 on the clusters it starts for this reason).
On an existing cluster nobody enforced that, so a run refuses to start on workers with more than one thread.
"""
from __future__ import annotations

import dagster as dg
import dask.distributed
# The one private Dagster import of the project (tests/test_layers.py allows exactly it): DaskExecutor.execute
# checks that its context IS a PlanOrchestrationContext, which dagster does not export, so the run-scoped view below
# has to subclass it. It goes with this workaround.
from dagster._core.execution.context.system import PlanOrchestrationContext
from dagster_dask.executor import DaskExecutor


def _same(obj):
    return obj


class _Opaque:
    """Holds an object that dask must not look inside; pickles as the object itself."""

    def __init__(self, obj):
        self.obj = obj

    def __reduce__(self):
        return _same, (self.obj,)


class _RunScopedContext(PlanOrchestrationContext):
    """The orchestration context as DaskExecutor.execute reads it: same state, task keys scoped to
    the run, the run itself opaque to dask's argument parsing."""

    def __init__(self, context: PlanOrchestrationContext):  # a view: no re-initialisation
        self.__dict__.update(context.__dict__)

    @property
    def job_name(self) -> str:  # DaskExecutor uses it only to name the dask tasks (and clusters it starts)
        run = self.plan_data.dagster_run
        return f"{run.job_name}.{run.run_id}"

    @property
    def dagster_run(self):  # handed to Client.submit as is
        return _Opaque(self.plan_data.dagster_run)

    @property
    def run_config(self):  # IPlanContext reads it through dagster_run
        return self.plan_data.dagster_run.run_config


def check_one_thread_per_worker(client) -> None:
    """Refuse a cluster on which two steps could share a process (see the module's docstring)."""
    threaded = {w: n for w, n in client.nthreads().items() if n > 1}
    if threaded:
        raise dg.DagsterInvariantViolationError(
            f"dask workers {sorted(threaded.items())} run several threads: Dagster steps are not thread-safe "
            f"(two in one process can deadlock on logging's locks). Start workers with `--nthreads 1` "
            f"(`dask worker ADDRESS --nworkers N --nthreads 1`).")


class RunScopedDaskExecutor(DaskExecutor):
    def execute(self, plan_context, execution_plan):
        if not isinstance(plan_context, PlanOrchestrationContext):
            raise TypeError(f"expected a PlanOrchestrationContext, got {type(plan_context).__name__}")
        if self.cluster_type == "existing":
            with dask.distributed.Client(**self.build_dict(plan_context.job_name)) as client:
                check_one_thread_per_worker(client)
        return super().execute(_RunScopedContext(plan_context), execution_plan)


def dask_engine(config: dict) -> RunScopedDaskExecutor:
    """The executor for a checked dask_executor config ({"cluster": {<type>: {...}}})."""
    ((cluster_type, cluster_config),) = config["cluster"].items()
    return RunScopedDaskExecutor(cluster_type, cluster_config)
