"""A run of the code location, created as the UI creates one and executed in this process (the CLI's runs).

A run launched from the UI (or by `dagster job launch`, a schedule or a sensor) is created from the code location that
the workspace loads: it records that location's origin (`remote_job_origin`), which the Overview timeline places it
by and which Re-execute reloads its job through. `execute_in_process` and `execute_job` create runs without one, and
Dagster has no public API that creates a run with an origin and executes it in the calling process. So this module
does what `dagster job launch` does to create the run (dagster/_cli/job.py: the origin from the workspace file,
`instance.create_run` with it), then what a run worker does with it (`execute_run` of the reconstructable job). The
four private Dagster modules it imports are allowed here and in no other module (tests/test_layers.py): this is
the one place to look at when Dagster is upgraded (tests/test_ui_runs.py checks the result against a real webserver).
"""
from __future__ import annotations

import functools
from pathlib import Path

import dagster as dg
import yaml
from dagster._core.execution.api import create_execution_plan, execute_run
from dagster._core.remote_origin import RemoteRepositoryOrigin
from dagster._core.snap import snapshot_from_execution_plan
from dagster._core.workspace.load import location_origins_from_config

from pipeline.definitions import REPOSITORY_LABEL
from pipeline.executors import code_location_job

PROJECT = Path(__file__).resolve().parents[1]
# what workspace.yaml says, for an installation without the checkout's workspace.yaml
DEFAULT_WORKSPACE = {"load_from": [{"python_module": {"module_name": REPOSITORY_LABEL.split("@")[1],
                                                      "working_directory": "."}}]}


@functools.cache
def location_origin() -> RemoteRepositoryOrigin:
    """The repository origin of the code location as `dagster dev` / dagster-webserver load it from workspace.yaml
    (a managed gRPC code location named after its module, run in the project's folder)."""
    repository, location = REPOSITORY_LABEL.split("@")
    path = PROJECT / "workspace.yaml"
    config = yaml.safe_load(path.read_text()) if path.is_file() else DEFAULT_WORKSPACE
    origins = location_origins_from_config(config, str(path))
    if location not in origins:
        raise RuntimeError(f"{path} loads no code location named {location!r} (REPOSITORY_LABEL): {sorted(origins)}")
    return RemoteRepositoryOrigin(code_location_origin=origins[location], repository_name=repository)


def execute(instance: dg.DagsterInstance, name: str, run_config: dict, tags: dict, asset_keys: frozenset,
            check_keys: frozenset, raise_on_error: bool) -> dg.JobExecutionResult:
    """Create a run of the location's job `name` (its asset and check selection, run config, tags) with the location's
    origin, and execute it here. The run config must choose an executor that runs in this process."""
    recon = code_location_job(name)
    subset = recon.get_definition().get_subset(asset_selection=asset_keys, asset_check_selection=check_keys)
    plan = create_execution_plan(subset, run_config=run_config, tags=tags,
                                 instance_ref=instance.get_ref() if instance.is_persistent else None)
    run = instance.create_run(
        job_name=name, run_id=None, run_config=run_config, status=None, tags=tags, root_run_id=None,
        parent_run_id=None, step_keys_to_execute=plan.step_keys_to_execute,
        execution_plan_snapshot=snapshot_from_execution_plan(plan, subset.get_job_snapshot_id()),
        job_snapshot=subset.get_job_snapshot(), parent_job_snapshot=subset.get_parent_job_snapshot(),
        asset_selection=asset_keys, asset_check_selection=check_keys, resolved_op_selection=None, op_selection=None,
        remote_job_origin=location_origin().get_job_origin(name), job_code_origin=recon.get_python_origin(),
        asset_graph=subset.asset_layer.asset_graph)
    return execute_run(recon, run, instance, raise_on_error=raise_on_error)
