"""Decoder processes: each decodes one video at a time on one core and hands its clip frames to the extracting
process through shared memory.

A video's frames travel as one memfd (anonymous shared memory) whose descriptor goes over the worker's pipe:
nothing is named, so nothing leaks when either side dies (the kernel frees it with its last descriptor or mapping),
and it is not bounded by /dev/shm's size. The extracting process maps it and reads the clips in place (on CPU the
encoder's batch reads them straight from it; on a GPU they are copied once to the device).

Each worker is a fresh interpreter (`python -c`, spawn's semantics): never fork, since the extracting process runs
torch's and Dagster's threads, which a fork would copy in whatever state they were in. Not multiprocessing's spawn
either, which re-imports the parent's __main__ in every worker (the `splavu` CLI, Dagster's run worker: seconds of
imports) and needs an `if __name__ == "__main__"` guard in every script that extracts. A worker imports only numpy,
decord and this package's torch-free modules, and talks over a socket pair (multiprocessing's Connection).
A worker that dies (killed, out of memory) stops the extraction with ExtractError naming it and its video; it never
hangs: its socket reads EOF the moment it dies, and the wait also polls the processes.
"""
from __future__ import annotations

import atexit
import mmap
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import traceback
from collections import deque
from contextlib import contextmanager
from dataclasses import dataclass
from multiprocessing.connection import Connection, wait
from multiprocessing.reduction import recv_handle, send_handle
from pathlib import Path
from typing import Iterator

import numpy as np

from splavu_core.extract.decode import ExtractError, VideoClips, crop_box, quarantine_reason, read_clips
from splavu_core.extract.sampling import ClipSampling, ClipSpan

SETTING = "SPLAVU_DECODE_WORKERS"
PER_WORKER = 2  # tasks queued per worker: one decoding, one waiting, so it never waits for the extracting process


def available_cores() -> int:
    """The cores this process may run on (its affinity, which containers and taskset narrow), not the machine's."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


@dataclass(frozen=True)
class Task:
    seq: int
    path: str
    want_static: bool
    sampling: ClipSampling
    resize: tuple[int, int]     # the encoder's (short_side, crop): the worker crops when no resize is needed


@dataclass
class Decoded:
    """One video as a worker hands it over: `frames` holds its clips' frames, then its static frames."""
    seq: int
    error: str | None
    clips: list[ClipSpan]
    fps: float
    static_idx: np.ndarray
    shape: tuple = ()           # (n_clips * T + K, h, w, 3)
    seconds: float = 0.0        # the worker's time decoding and writing it
    frames: np.ndarray | None = None  # the shared memory, mapped here (None until received, or on error)


def _shared_frames(vc: VideoClips, resize: tuple[int, int], seq: int) -> tuple[int, tuple]:
    """vc's clip frames then static frames, cropped when that is all the encoder does, in a new memfd: (fd, shape)."""
    frames = vc.frames
    box = crop_box(frames.shape[1], frames.shape[2], *resize)
    short_side, crop = resize
    if box is not None and crop == short_side:  # then the crop is still a frame the encoder crops to itself
        top, left = box
        frames = frames[:, top:top + crop, left:left + crop]
    rows = np.concatenate([vc.clip_rows.ravel(), vc.static_rows])
    shape = (len(rows), *frames.shape[1:])
    nbytes = int(np.prod(shape))
    fd = os.memfd_create(f"splavu-decode-{seq}", os.MFD_CLOEXEC)
    try:
        os.ftruncate(fd, nbytes)
        with mmap.mmap(fd, nbytes) as mm:
            out = np.frombuffer(mm, np.uint8).reshape(shape)
            np.take(frames, rows, axis=0, out=out)  # (n_clips * T + K, h, w, 3)
            del out  # the mapping closes with no view left on it
    except BaseException:
        os.close(fd)
        raise
    return fd, shape


def serve(fd: int) -> None:
    """A worker's life: decode each task that comes over the socket `fd`, until told to stop or the socket closes."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the extracting process's to handle; it ends us
    conn, parent = Connection(fd), os.getppid()
    while True:
        try:
            task = conn.recv()
        except EOFError:  # the extracting process is gone
            return
        if task is None:
            return
        t0 = time.perf_counter()
        try:
            try:
                vc = read_clips(Path(task.path), task.sampling, task.want_static, threads=1)
            except Exception as e:  # one unusable video never fails its shard: it is quarantined
                conn.send(Decoded(task.seq, quarantine_reason(Path(task.path), e), [], 0.0, np.zeros(0, np.int64)))
                continue
            fd, shape = _shared_frames(vc, task.resize, task.seq)
            conn.send(Decoded(task.seq, None, vc.clips, vc.fps, vc.static_idx, shape, time.perf_counter() - t0))
            send_handle(conn, fd, parent)
            os.close(fd)
        except (BrokenPipeError, EOFError):
            return
        except Exception:  # not the video's fault (out of memory for the shared frames, ...): the extraction stops
            conn.send(("failed", task.seq, traceback.format_exc(limit=4)))


class DecoderPool:
    """`workers` decoder processes, each with its own socket."""

    def __init__(self, workers: int):
        assert workers >= 1, workers
        self.owner = os.getpid()
        self.conns, self.procs = [], []
        # the worker imports what this process can: its sys.path, as multiprocessing's spawn passes it
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
        for _ in range(workers):
            here, there = socket.socketpair()
            self.procs.append(subprocess.Popen(
                [sys.executable, "-c", f"from splavu_core.extract.decode_pool import serve; serve({there.fileno()})"],
                pass_fds=(there.fileno(),), env=env, stdin=subprocess.DEVNULL))
            there.close()
            self.conns.append(Connection(here.detach()))
        self.broken = False

    @property
    def size(self) -> int:
        return len(self.procs)

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self.procs]

    def decode(self, tasks: list[Task]) -> Iterator[Decoded]:
        """Each task's video, in the order of `tasks`, with at most PER_WORKER tasks per worker queued ahead.
        Stopping early (an exception in the caller) leaves the pool broken: it is closed, not reused."""
        todo = deque(tasks)
        queued: list[deque] = [deque() for _ in self.procs]  # per worker: its tasks, oldest first
        done: dict[int, Decoded] = {}
        order = deque(t.seq for t in tasks)
        finished = not order
        try:
            while order:
                for w, q in enumerate(queued):  # top up every worker
                    while todo and len(q) < PER_WORKER:
                        q.append(todo.popleft())
                        try:
                            self.conns[w].send(q[-1])
                        except OSError:  # its end of the socket closed: it died
                            self._died(w, queued)
                while order[0] not in done:
                    self._receive(queued, done)
                seq = order.popleft()
                finished = not order  # the last one is in: nothing of this shard is left in the workers
                yield done.pop(seq)
        finally:
            if not finished:
                self.broken = True

    def _receive(self, queued: list[deque], done: dict[int, Decoded]) -> None:
        ready = wait(self.conns, timeout=1.0)
        for w, conn in enumerate(self.conns):
            if conn not in ready:
                continue
            try:
                msg = conn.recv()
                if isinstance(msg, tuple):  # ("failed", seq, traceback)
                    self.broken = True
                    raise ExtractError(f"decoder process {self.procs[w].pid} failed on {queued[w][0].path}:\n{msg[2]}")
                if msg.error is None:
                    fd = recv_handle(conn)
                    try:
                        mm = mmap.mmap(fd, int(np.prod(msg.shape)))
                    finally:
                        os.close(fd)
                    msg.frames = np.frombuffer(mm, np.uint8).reshape(msg.shape)  # the array keeps the mapping
            except (EOFError, OSError, RuntimeError):  # its end of the socket closed (a descriptor short): it died
                self._died(w, queued)
            task = queued[w].popleft()
            assert task.seq == msg.seq, (task.seq, msg.seq)
            done[msg.seq] = msg
        for w, p in enumerate(self.procs):  # a death reads as EOF on its socket; this is the belt to those braces
            if p.poll() is not None and not self.conns[w].poll():
                self._died(w, queued)

    def _died(self, w: int, queued: list[deque]) -> None:
        self.broken = True
        p = self.procs[w]
        try:
            code = p.wait(timeout=5)
        except subprocess.TimeoutExpired:
            code = None
        how = (f"was killed by {signal.Signals(-code).name}" if code is not None and code < 0 else
               f"exited with code {code}")
        doing = f" while decoding {queued[w][0].path}" if queued[w] else ""
        raise ExtractError(f"decoder process {p.pid} {how}{doing}; extraction stopped and nothing of this shard was "
                           f"written (out of memory? fewer decoders with {SETTING}, or 0 to decode in threads)")

    def close(self) -> None:
        for conn in self.conns:
            try:
                conn.send(None)
            except OSError:
                pass
        for p in self.procs:
            try:
                p.wait(timeout=2)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        for conn in self.conns:
            conn.close()


# An idle pool per size is kept for the next shard: `splavu extract` runs every shard in one process, and starting
# the workers (spawn, then numpy and decord) costs about half a second a shard. One size in practice (the setting).
_idle: dict[int, DecoderPool] = {}
_idle_lock = threading.Lock()


def _healthy(pool: DecoderPool) -> bool:
    return pool.owner == os.getpid() and not pool.broken and all(p.poll() is None for p in pool.procs)


@contextmanager
def decoder_pool(workers: int) -> Iterator[DecoderPool]:
    """A pool of `workers` decoder processes: this process's idle one of that size, else a new one."""
    with _idle_lock:
        pool = _idle.pop(workers, None)
    if pool is not None and not _healthy(pool):
        pool.close()
        pool = None
    pool = pool or DecoderPool(workers)
    try:
        yield pool
    finally:
        if not _healthy(pool):
            pool.close()
        else:
            with _idle_lock:
                pool, _idle[workers] = _idle.get(workers), pool
            if pool is not None:  # another extraction in this process returned one of this size meanwhile
                pool.close()


@atexit.register
def close_idle() -> None:
    """End this process's idle decoder processes (they also end by themselves when it exits)."""
    with _idle_lock:
        pools = list(_idle.values())
        _idle.clear()
    for pool in pools:
        if pool.owner == os.getpid():
            pool.close()
