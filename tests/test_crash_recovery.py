"""After `kill -9` of a running `splavu extract`, the next one completes unattended (issue 13, item 2).

Real processes on a real Dagster instance ($DAGSTER_HOME with the repo's dagster.yaml: sqlite storage, an
`encoder` pool of one slot), a real SIGKILL of the whole process group."""
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

# `splavu extract` whose extraction step never ends: it holds the encoder pool's slot until killed
STALLED_EXTRACT = textwrap.dedent("""
    import sys, time
    import assets.resources
    def stall(*a, **k):  # inside the step, before the encoder loads: the slot is claimed by then
        print("holding the encoder slot", flush=True)
        time.sleep(3600)
    assets.resources.EncoderResource.load = stall
    from pipeline.cli import main
    sys.exit(main(sys.argv[1:]))
""")


@pytest.fixture
def home_and_store(tiny_bench, tmp_path, monkeypatch):
    """A Dagster home like `make setup` makes (this process uses it too), and a store with a one-video dataset."""
    from pipeline.cli import main

    home = tmp_path / "dagster_home"
    home.mkdir()
    shutil.copy(REPO / "dagster.yaml", home / "dagster.yaml")
    monkeypatch.setenv("DAGSTER_HOME", str(home))
    bench, _ = tiny_bench
    ds = tmp_path / "one"
    ds.mkdir()
    header, first = (bench / "gait" / "manifest.csv").read_text().splitlines()[:2]
    path = first.split(",")[header.split(",").index("path")]
    (ds / Path(path).parent).mkdir(parents=True, exist_ok=True)
    shutil.copy(bench / "gait" / path, ds / path)
    (ds / "manifest.csv").write_text(f"{header}\n{first}\n")
    store = tmp_path / "store"
    assert main(["--store", str(store), "ingest", "one", str(ds / "manifest.csv")]) == 0
    return {**os.environ, "PYTHONPATH": str(REPO), "SPLAVU_LOG_LEVEL": "ERROR"}, store


def splavu(env, *argv, stalled=False):
    cmd = [sys.executable, "-c", STALLED_EXTRACT] if stalled else [sys.executable, "-m", "pipeline.cli"]
    proc = subprocess.Popen(cmd + list(argv), cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            start_new_session=True)
    proc.said = ""
    return proc


def read_until(proc, needle, timeout):
    """proc's output so far, once it contains `needle` (fails after `timeout` s)."""
    import selectors

    sel, end = selectors.DefaultSelector(), time.monotonic() + timeout
    sel.register(proc.stdout, selectors.EVENT_READ)
    while needle not in proc.said and time.monotonic() < end:
        if sel.select(timeout=1):
            chunk = os.read(proc.stdout.fileno(), 65536)
            if not chunk:
                break
            proc.said += chunk.decode(errors="replace")
    sel.close()
    if needle not in proc.said:
        pytest.fail(f"no {needle!r} within {timeout} s; output so far:\n{proc.said}")
    return proc.said


def encoder_slot_holders() -> set[str]:
    import dagster as dg

    with dg.DagsterInstance.get() as inst:
        return {s.run_id for s in inst.event_log_storage.get_concurrency_info("encoder").claimed_slots}


def kill_9(proc) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)  # the whole process group, as a crash or `kill -9 -PGID` does
    proc.wait()


def test_extract_after_kill_9_completes_unattended_and_says_what_it_waits_for(home_and_store, tiny_videomae, capfd):
    from pipeline.cli import main

    env, store = home_and_store
    args = ("--store", str(store), "extract", "--checkpoint", str(tiny_videomae))
    first = splavu(env, *args, stalled=True)
    procs = [first]
    try:
        read_until(first, "holding the encoder slot", 120)
        (held,) = encoder_slot_holders()
        # 1. an extract that must wait for a live holder says which run holds the slot and how to free it...
        second = splavu(env, *args, stalled=True)
        procs.append(second)
        read_until(second, "waiting for a slot", 120)
        said = read_until(second, "fail-run", 10)
        assert held in said and f"pid {first.pid}" in said
        # 2. ...and when that holder is killed, the wait ends by itself: the dead run is failed, its slot freed
        kill_9(first)
        said = read_until(second, "holding the encoder slot", 120)
        assert f"run {held[:8]}" in said and "marked failed" in said
        # 3. a crash before the next extract starts (the case): it fails the dead run first, then completes
        (held,) = encoder_slot_holders()
        kill_9(second)
        capfd.readouterr()
        assert main(list(args)) == 0
        assert f"run {held[:8]}" in capfd.readouterr().err
        assert (store / "latents" / "one-000" / "_COMMIT.json").is_file()
        assert encoder_slot_holders() == set()
    finally:
        for p in procs:
            kill_9(p)
