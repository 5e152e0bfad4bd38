"""The cluster configurations shipped in deploy/ are valid for the Dagster and integration releases in
requirements: checked with Dagster's own config machinery against the real schemas (dagster's instance
schema, dagster-k8s's K8sRunLauncher and k8s_job_executor, the code location's jobs). No cluster runs
here; a typo'd key must be refused, naming the key."""
import copy
import importlib
import warnings
from pathlib import Path

import dagster as dg
import pytest
import yaml
from dagster._config import process_config
from dagster._core.instance.config import dagster_instance_config

from pipeline.executors import engine_config

REPO = Path(__file__).resolve().parents[1]
K8S = REPO / "deploy" / "k8s"
DASK = REPO / "deploy" / "dask"
PG_ENV = {"DAGSTER_PG_HOST": "postgres", "DAGSTER_PG_USER": "dagster", "DAGSTER_PG_PASSWORD": "secret"}


@pytest.fixture
def pg_env(monkeypatch):
    for k, v in PG_ENV.items():
        monkeypatch.setenv(k, v)


def k8s_launcher():
    with warnings.catch_warnings():  # the integration is one patch release behind dagster (requirements-dagster.txt)
        warnings.simplefilter("ignore")
        from dagster_k8s import K8sRunLauncher
    return K8sRunLauncher


def load_instance(folder: Path, text: str | None = None, tmp_path: Path | None = None) -> dict:
    """dagster.yaml of `folder` (or `text` written to tmp_path) through dagster's own instance loader."""
    if text is not None:
        (tmp_path / "dagster.yaml").write_text(text)
        folder = tmp_path
    config, custom_class = dagster_instance_config(str(folder), "dagster.yaml")
    assert custom_class is None
    return config


def launcher_errors(config: dict) -> list[str]:
    res = process_config(k8s_launcher().config_type(), config)
    return [] if res.success else [e.message for e in res.errors]


@pytest.mark.parametrize("folder", [K8S, DASK, REPO], ids=["k8s", "dask", "local"])
def test_instance_configs_are_valid(folder, pg_env):
    config = load_instance(folder)
    assert config["run_coordinator"]["class"] == "QueuedRunCoordinator"
    assert config["concurrency"]["pools"]["default_limit"] == 1  # the `encoder` pool, docs/scale-out.md
    assert config["nux"] == {"enabled": False}  # the UI's sign-up pop-up, which covers every page on first load
    if folder is not REPO:
        assert set(config["storage"]) == {"postgres"}


def test_dask_instance_holds_encoder_runs_in_the_run_queue(pg_env):
    assert load_instance(DASK)["concurrency"]["pools"]["granularity"] == "run"  # why: tests/test_cluster.py


def test_k8s_run_launcher_config_matches_dagster_k8s(pg_env):
    launcher = load_instance(K8S)["run_launcher"]
    expected = k8s_launcher()  # imported quietly first
    assert getattr(importlib.import_module(launcher["module"]), launcher["class"]) is expected
    assert launcher_errors(launcher["config"]) == []


def test_k8s_run_config_matches_the_executor_and_the_jobs():
    run_config = yaml.safe_load((K8S / "run_config.yaml").read_text())
    checked = engine_config("k8s", run_config["execution"]["config"]["k8s"])  # k8s_job_executor's own schema
    assert checked["job_namespace"] == "splavu"
    from pipeline.definitions import defs

    job = defs.resolve_job_def("extract_latents")
    assert job.executor_def.name == "splavu"
    dg.validate_run_config(job, run_config)  # the whole run config against the job's schema
    # per-step overrides are a map keyed by step name, which no schema checks: they must name real steps
    assert set(checked["per_step_k8s_config"]) <= set(job.graph.node_dict), checked["per_step_k8s_config"]


def test_typos_are_refused_and_named(pg_env, tmp_path):
    good = yaml.safe_load((K8S / "dagster.yaml").read_text())

    launcher = copy.deepcopy(good["run_launcher"]["config"])
    launcher["job_namspace"] = launcher.pop("job_namespace")
    errors = launcher_errors(launcher)
    assert errors and any("job_namspace" in e for e in errors), errors

    instance = copy.deepcopy(good)
    instance["concurrency"]["pools"]["default_limt"] = instance["concurrency"]["pools"].pop("default_limit")
    with pytest.raises(dg.DagsterInvalidConfigError, match="default_limt"):
        load_instance(K8S, yaml.safe_dump(instance), tmp_path)

    run_config = yaml.safe_load((K8S / "run_config.yaml").read_text())
    k8s = run_config["execution"]["config"]["k8s"]
    k8s["max_concurent"] = k8s.pop("max_concurrent")
    with pytest.raises(dg.DagsterInvalidConfigError, match=r"execution\.config\.k8s(.|\n)*max_concurent"):
        engine_config("k8s", k8s)
    with pytest.raises(dg.DagsterInvalidConfigError, match="unknown engine 'kubernetes'"):
        engine_config("kubernetes", k8s)


def launchpad_default(job: dg.JobDefinition) -> dict:
    """The run config the Launchpad opens a job with: the webserver's rootDefaultYaml (dagster_graphql), computed the
    same way from the job's snapshot."""
    from dagster._core.snap.snap_to_yaml import default_values_yaml_from_type_snap

    snap = job.get_job_snapshot()
    schema = snap.config_schema_snapshot
    return yaml.safe_load(default_values_yaml_from_type_snap(
        schema, schema.get_config_snap(snap.mode_def_snaps[0].root_config_key)))


def test_the_launchpad_shows_which_store_a_run_writes_to():
    """A field left to its default_factory is not in the job's default run config, so the Launchpad showed no store;
    the code location states the root, and every job that has the store opens with it, absolute."""
    from pipeline.definitions import defs

    root = defs.resources["store"].root
    assert Path(root).is_absolute()
    jobs = [j for j in defs.get_repository_def().get_all_jobs() if not j.name.startswith("__")]
    assert {"extract_latents", "forget", "train_aam", "reanonymize"} <= {j.name for j in jobs}
    for job in jobs:
        assert launchpad_default(job)["resources"]["store"]["config"]["root"] == root, job.name


def test_the_store_default_is_absolute_where_local(monkeypatch, tmp_path):
    from assets.resources import store_root_default

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("SPLAVU_STORE", "my_store")
    assert store_root_default() == str(tmp_path / "my_store")
    monkeypatch.setenv("SPLAVU_STORE", "s3://bucket/prefix")
    assert store_root_default() == "s3://bucket/prefix"
    monkeypatch.delenv("SPLAVU_STORE")
    assert store_root_default() == str(tmp_path / "store")


def test_make_ui_starts_the_webserver_and_the_daemon():
    """`dagster dev` runs both: a webserver alone leaves a Launchpad run in the queue (QueuedRunCoordinator)."""
    import subprocess

    out = subprocess.run(["make", "--no-print-directory", "-n", "ui"], cwd=REPO, capture_output=True, text=True, check=True).stdout
    assert out.splitlines()[-1].split()[:4] == [".venv/bin/dagster", "dev", "-w", "workspace.yaml"], out
