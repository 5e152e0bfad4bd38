"""Runs the CLI launches survive their own crash: dead runs are failed and their pool slots freed.

A run executed in-process (`execute_in_process` of a named job, what every `splavu` command does) has no run worker
that Dagster's run monitoring could check: after `kill -9` it stays STARTED forever and keeps its
`encoder` pool slot, so the next extraction blocks on that slot without a word. So every run the CLI
starts carries its owner in its tags (host, pid, the pid's start time: pids get reused), and

- before starting a run, the CLI marks failed every run this host owns whose process is gone, and
  frees the pool slots those runs held (`free_concurrency_slots_for_run`);
- while a run of ours waits on a pool slot, a watcher says so on the terminal (which run holds the
  slot, whose process, how to free it) and frees it by itself once the holder's process is gone.

Runs of other hosts (a cluster, `dagster dev` elsewhere) are never touched automatically: their
owner cannot be checked from here; `splavu fail-run RUN_ID` does it by hand.
"""
from __future__ import annotations

import os
import socket
import sys
import threading
from contextlib import contextmanager

import dagster as dg

from splavu_core.store.feature_store import StoreError

HOST, PID, PID_START = "splavu/host", "splavu/pid", "splavu/pid_start"
UNFINISHED = [dg.DagsterRunStatus.STARTED, dg.DagsterRunStatus.STARTING, dg.DagsterRunStatus.CANCELING,
              dg.DagsterRunStatus.NOT_STARTED]
POOLS = ("encoder",)
WATCH_EVERY_S = 2.0


def _start_time(pid: int) -> str | None:
    """The process's start time (Linux /proc; "" where unknown), None when no live process has this pid."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return None if fields[0] in ("Z", "X") else fields[19]  # a zombie is dead; field 22 = starttime
    except FileNotFoundError:
        return None
    except OSError:
        pass
    try:
        os.kill(pid, 0)
        return ""
    except ProcessLookupError:
        return None
    except PermissionError:
        return ""


def owner_tags() -> dict[str, str]:
    """Tags naming this process as the run's owner."""
    return {HOST: socket.gethostname(), PID: str(os.getpid()), PID_START: _start_time(os.getpid()) or ""}


def owner(run: dg.DagsterRun) -> str:
    t = run.tags
    return f"pid {t[PID]} on {t[HOST]}" if PID in t else "a process splavu did not start (dagster dev, a cluster)"


def is_dead(run: dg.DagsterRun) -> bool:
    """True only for a run this host owns whose process is gone (or is another process now)."""
    t = run.tags
    if t.get(HOST) != socket.gethostname() or not t.get(PID, "").isdigit():
        return False
    now = _start_time(int(t[PID]))
    return now is None or (bool(now) and bool(t.get(PID_START)) and now != t[PID_START])


def fail_run(instance: dg.DagsterInstance, run: dg.DagsterRun, why: str, log=print) -> None:
    """Mark `run` failed and free every pool slot it holds or waits for."""
    if run.status in UNFINISHED:
        instance.report_run_failed(run, f"marked failed by splavu: {why}")
    if instance.event_log_storage.supports_global_concurrency_limits:
        instance.event_log_storage.free_concurrency_slots_for_run(run.run_id)
    log(f"  run {run.run_id[:8]} ({run.job_name}, {owner(run)}) marked failed and its pool slots freed: {why}")


def fail_run_by_id(instance: dg.DagsterInstance, run_id: str, why: str, log=print) -> None:
    """fail_run on the run `run_id` of `instance` (`splavu fail-run`); StoreError when the instance has none."""
    run = instance.get_run_by_id(run_id)
    if run is None:
        raise StoreError(f"no run {run_id!r} in the Dagster instance at {instance.root_directory}")
    fail_run(instance, run, why, log)


def fail_dead_runs(instance: dg.DagsterInstance, log=print) -> list[str]:
    """Fail every unfinished run of this host whose owning process is gone; returns their run ids."""
    runs = instance.get_runs(filters=dg.RunsFilter(statuses=UNFINISHED, tags={HOST: socket.gethostname()}))
    dead = [r for r in runs if is_dead(r)]
    for r in dead:
        fail_run(instance, r, f"its process ({owner(r)}) is gone", log)
    return [r.run_id for r in dead]


def _my_waiting_steps(instance, pool: str) -> list:
    info = instance.event_log_storage.get_concurrency_info(pool)
    if not info.pending_steps or not info.claimed_slots:
        return []
    mine = {r.run_id for r in instance.get_runs(filters=dg.RunsFilter(statuses=UNFINISHED, tags=owner_tags()))}
    return [p for p in info.pending_steps if p.run_id in mine and p.assigned_timestamp is None]


def _holders(instance, pool: str) -> list[dg.DagsterRun]:
    info = instance.event_log_storage.get_concurrency_info(pool)
    ids = sorted({s.run_id for s in info.claimed_slots})
    return [r for r in (instance.get_run_by_id(i) for i in ids) if r is not None]


def _announce(instance, pool: str, store_root: str | None, log) -> None:
    info = instance.event_log_storage.get_concurrency_info(pool)
    log(f"splavu: waiting for a slot of the {pool!r} pool (limit {info.limit}), held by:")
    for r in _holders(instance, pool):
        log(f"  run {r.run_id} ({r.job_name}, {r.status.value}, {owner(r)})")
    where = f"--store {store_root} " if store_root else ""
    log(f"  It frees when that run ends; a dead holder on this host is failed automatically. If it runs elsewhere "
        f"and is gone: `splavu {where}fail-run RUN_ID`. To allow more at once: "
        f"`dagster instance concurrency set {pool} N`.")


def _watch(instance, stop: threading.Event, store_root: str | None, log) -> None:
    announced: dict[str, frozenset] = {}
    while not stop.wait(WATCH_EVERY_S):
        try:
            for pool in POOLS:
                if not _my_waiting_steps(instance, pool):
                    continue
                holders = _holders(instance, pool)
                for r in holders:
                    if is_dead(r):
                        fail_run(instance, r, f"it held the {pool!r} slot this run waits for and its process "
                                              f"({owner(r)}) is gone", log)
                key = frozenset(r.run_id for r in holders)
                if announced.get(pool) != key:
                    _announce(instance, pool, store_root, log)
                    announced[pool] = key
        except Exception as e:  # the watcher must never take the run down with it
            log(f"splavu: could not check the pool slots ({type(e).__name__}: {e})")


def _stderr(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


@contextmanager
def owned_run(instance: dg.DagsterInstance, store_root: str | None = None, log=_stderr):
    """Around one in-process run: fail this host's dead runs first, then watch the pools while it runs.
    Yields the tags that make the run ours."""
    if not instance.event_log_storage.supports_global_concurrency_limits:
        yield owner_tags()  # an ephemeral instance: no pools, no other process can share it
        return
    fail_dead_runs(instance, log)
    stop = threading.Event()
    watcher = threading.Thread(target=_watch, args=(instance, stop, store_root, log), daemon=True,
                               name="splavu-pool-watcher")
    watcher.start()
    try:
        yield owner_tags()
    finally:
        stop.set()
        watcher.join(timeout=WATCH_EVERY_S * 2)
