"""The Dagster UI lists the CLI's runs: a real `dagster-webserver` on this repository's workspace.yaml and a
throwaway $DAGSTER_HOME, asked over GraphQL what the UI asks for a job's Runs tab and for the Overview timeline (which
draws only runs with a code-location origin), and for every asset group's description."""
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
import yaml

from pipeline.definitions import REPOSITORY_LABEL, REPOSITORY_TAG

REPO = Path(__file__).resolve().parents[1]

JOB_RUNS = """query($s: PipelineSelector!) { pipelineOrError(params: $s) {
  __typename ... on Pipeline { runs { runId } } } }"""
RUNS = """query($f: RunsFilter) { runsOrError(filter: $f) { ... on Runs { results { runId } } } }"""
# the Overview timeline's own fragment (RunTimelineFragment): it places a run by its repository origin
TIMELINE = """query($f: RunsFilter!) { runsOrError(filter: $f) { ... on Runs { results { runId pipelineName
  repositoryOrigin { repositoryName repositoryLocationName } } } } }"""
GROUPS = """query($r: RepositorySelector!) { repositoryOrError(repositorySelector: $r) { __typename ... on Repository {
  assetGroups { groupName } assetNodes { groupName assetKey { path }
  metadataEntries { label ... on TextMetadataEntry { text } } } } } }"""
REEXECUTE = """mutation($p: ReexecutionParams!) { launchPipelineReexecution(reexecutionParams: $p) { __typename
  ... on PythonError { message } } }"""
LOCATIONS = """{ workspaceOrError { ... on Workspace { locationEntries { name
  locationOrLoadError { __typename ... on RepositoryLocation { repositories { name } } } } } } }"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def graphql(port: int, query: str, variables: dict | None = None) -> dict:
    req = urllib.request.Request(f"http://127.0.0.1:{port}/graphql", headers={"Content-Type": "application/json"},
                                 data=json.dumps({"query": query, "variables": variables or {}}).encode())
    with urllib.request.urlopen(req, timeout=30) as r:
        out = json.load(r)
    assert "errors" not in out, out["errors"]
    return out["data"]


def webserver(home: Path, port: int) -> subprocess.Popen:
    """`dagster-webserver -w workspace.yaml` in its own process group (with the code server it starts)."""
    return subprocess.Popen([sys.executable, "-m", "dagster_webserver", "-w", "workspace.yaml", "-h", "127.0.0.1",
                             "-p", str(port)], cwd=REPO, env={**os.environ, "DAGSTER_HOME": str(home)},
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)


def stop(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(10)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)
    except ProcessLookupError:
        pass


def wait_until_up(proc: subprocess.Popen, port: int, timeout: float = 90) -> None:
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        assert proc.poll() is None, f"dagster-webserver exited with {proc.returncode}"
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/server_info", timeout=2):
                return
        except OSError:
            time.sleep(0.5)
    raise AssertionError(f"dagster-webserver not up after {timeout} s")


def test_the_label_is_the_workspaces_location():
    """REPOSITORY_LABEL names the location workspace.yaml loads (a python_module is named after its module)."""
    (entry,) = yaml.safe_load((REPO / "workspace.yaml").read_text())["load_from"]
    module = entry["python_module"]
    assert REPOSITORY_LABEL.split("@")[1] == module.get("location_name", module["module_name"])


def test_a_cli_run_is_the_locations_run_and_every_group_is_described(tmp_path, monkeypatch):
    from assets.groups import GROUPS as DESCRIBED
    from assets.groups import METADATA_KEY
    from pipeline import runner
    from pipeline.definitions import defs

    home = tmp_path / "dagster_home"
    home.mkdir()
    shutil.copy(REPO / "dagster.yaml", home)
    monkeypatch.setenv("DAGSTER_HOME", str(home))
    inst = runner.instance()
    store = runner.StoreResource(root=str(tmp_path / "store"))
    cli_run = runner.run_job(inst, "refresh_catalog", store).run_id  # what every `splavu` command runs through
    # the same job executed in-process without the tag and the origin, as the CLI did before: the UI's job page and
    # the Overview timeline leave it out
    bare = defs.resolve_job_def("refresh_catalog").execute_in_process(
        instance=inst, run_config={"resources": {"store": {"config": {"root": store.root}}}}).run_id
    inst.dispose()

    port = free_port()
    proc = webserver(home, port)
    try:
        wait_until_up(proc, port)
        (loc,) = graphql(port, LOCATIONS)["workspaceOrError"]["locationEntries"]
        assert loc["locationOrLoadError"]["__typename"] == "RepositoryLocation"
        assert REPOSITORY_LABEL == f"{loc['locationOrLoadError']['repositories'][0]['name']}@{loc['name']}"
        repo, location = REPOSITORY_LABEL.split("@")
        selector = {"repositoryLocationName": location, "repositoryName": repo, "pipelineName": "refresh_catalog"}
        job_page = graphql(port, JOB_RUNS, {"s": selector})["pipelineOrError"]
        assert job_page["__typename"] == "Pipeline"
        assert [r["runId"] for r in job_page["runs"]] == [cli_run]
        # the Runs tab's own query (PipelineRunsFeedRoot): the job's name and the repository tag
        feed = graphql(port, RUNS, {"f": {"pipelineName": "refresh_catalog",
                                          "tags": [{"key": REPOSITORY_TAG, "value": REPOSITORY_LABEL}]}})
        assert [r["runId"] for r in feed["runsOrError"]["results"]] == [cli_run]
        everything = graphql(port, RUNS)["runsOrError"]["results"]  # the global Runs page has both
        assert {r["runId"] for r in everything} == {cli_run, bare}
        # (a) the Overview timeline: the CLI's run has this location's repository origin, the bare one none
        origins = {r["runId"]: r["repositoryOrigin"] for r in
                   graphql(port, TIMELINE, {"f": {"statuses": ["SUCCESS"]}})["runsOrError"]["results"]}
        assert origins[cli_run] == {"repositoryName": repo, "repositoryLocationName": location}
        assert origins[bare] is None
        # and the UI's Re-execute -> All steps finds the CLI run's job through that origin (queued: no daemon here)
        again = graphql(port, REEXECUTE, {"p": {"parentRunId": cli_run, "strategy": "ALL_STEPS"}})
        assert again["launchPipelineReexecution"]["__typename"] == "LaunchRunSuccess", again
        # (b) every asset group the UI lists has a description, on every asset of the group
        found = graphql(port, GROUPS, {"r": {"repositoryLocationName": location, "repositoryName": repo}})
        found = found["repositoryOrError"]
        groups = {g["groupName"] for g in found["assetGroups"]}
        assert groups == set(DESCRIBED)
        for node in found["assetNodes"]:
            text = {e["label"]: e.get("text") for e in node["metadataEntries"]}.get(METADATA_KEY)
            assert text == DESCRIBED[node["groupName"]] and len(text) > 40, node["assetKey"]
    finally:
        stop(proc)
