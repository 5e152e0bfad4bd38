"""Extract clip and static latents of one shard: decoding overlapped with encoding.

A video that cannot be used (corrupt, truncated, empty, unsupported, too short) goes to the
shard's quarantine table with the reason; it never fails the shard and never leaves a NaN or
zero row behind.

Videos of one shard may differ in size, frame rate and container: each video's frames are brought to the encoder's
input size (its preprocessing: resize, crop, normalise), so the encoder's batches mix clips of any videos. Frame rate
only matters to the clip arithmetic, per video. Three ways to decode, one loop, one order of rows:
- decoder processes (SPLAVU_DECODE_WORKERS, default the cores; decode_pool.py) hand each video's uint8 frames over in
  shared memory; each batch is prepared on the encoder's device in one step (Preprocess.on_device);
- GPU decoding (SPLAVU_DECODER=nvdec) in the decode threads: frames on the GPU, prepared the same way;
- decode threads in this process (SPLAVU_DECODE_WORKERS=0, and pixel baselines, whose transforms stay here): the path
  before issue 61, each video staged in its thread (Preprocess.stage), each clip converted in its batch slot.
The first and the last give the same bytes (tests/test_extract.py).
"""
from __future__ import annotations

import hashlib
import json
import time
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack, nullcontext
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable, Iterator

import numpy as np
import pyarrow as pa
import torch

from splavu_core.extract.decode import ExtractError, quarantine_reason, read_clips
from splavu_core.extract.decode_pool import Task, available_cores, decoder_pool
from splavu_core.extract.encoders.vfm import FrozenEncoder, Pending
from splavu_core.extract.pixel import PixelAnonymizer
from splavu_core.extract.sampling import ClipSampling, ClipSpan
from splavu_core.extract.stage_times import StageTimes
from splavu_core.settings import settings
from splavu_core.store.feature_store import CLIP_INDEX_SCHEMA, QUARANTINE_SCHEMA, STATIC_INDEX_SCHEMA, ShardLatents
from splavu_core.threads import intra_op_threads


@dataclass
class DecodedVideo:
    row: dict
    clips: list[ClipSpan]
    fps: float
    clip_frames: Any                   # (n_clips, T, H, W, 3) uint8 (numpy or torch); staged: see Preprocess.stage
    static_idx: np.ndarray             # (K,) frame indices
    static_frames: Any                 # (K, H, W, 3) uint8; staged, or torch: (K, 1, ...)
    error: str | None = None
    ready: Any = None                  # CUDA event: the frames are on the device


def _failed(row: dict, error: str) -> DecodedVideo:
    return DecodedVideo(row, [], 0.0, None, np.zeros(0, np.int64), None, error=error)


def decode_video(row: dict, root: Path, sampling: ClipSampling, want_static: bool, threads: int = 1,
                 pixel: PixelAnonymizer | None = None, stage: Callable | None = None) -> DecodedVideo:
    """Decode exactly the frames a video's clips (and static clips) need; `pixel` anonymizes them first,
    `stage` (the encoder's Preprocess.stage) brings them to its input size. Any failure quarantines this video only."""
    path = root / row["path"]
    try:
        vc = read_clips(path, sampling, want_static, threads)
        frames = vc.frames
        if pixel is not None:  # a pixel baseline: the encoder only ever sees the transformed frames
            frames = pixel(path, vc.wanted, frames)
        dv = DecodedVideo(row, vc.clips, vc.fps, frames[vc.clip_rows], vc.static_idx,
                          frames[vc.static_rows] if len(vc.static_idx) else None)
        if stage is not None:
            dv.clip_frames = stage(dv.clip_frames)
            dv.static_frames = stage(dv.static_frames[:, None]) if dv.static_frames is not None else None
        return dv
    except Exception as e:  # one unusable video must never fail its shard: quarantine it with what went wrong
        return _failed(row, quarantine_reason(path, e))


def _decode_on_gpu(row: dict, root: Path, sampling: ClipSampling, want_static: bool) -> DecodedVideo:
    """decode_video with NVDEC: frames on the GPU, on a CUDA stream of this video's (its event says when ready)."""
    path = root / row["path"]
    stream = torch.cuda.Stream() if torch.cuda.is_available() else None
    try:
        with torch.cuda.stream(stream) if stream is not None else nullcontext():
            vc = read_clips(path, sampling, want_static, backend="nvdec")
            rows = torch.as_tensor(vc.clip_rows, device=vc.frames.device)
            static = vc.frames[torch.as_tensor(vc.static_rows, device=vc.frames.device)][:, None]  # (K, 1, H, W, 3)
            dv = DecodedVideo(row, vc.clips, vc.fps, vc.frames[rows], vc.static_idx,  # (n_clips, T, H, W, 3)
                              static if len(vc.static_idx) else None)
            if stream is not None:
                dv.ready = torch.cuda.Event()
                dv.ready.record(stream)
        return dv
    except Exception as e:
        return _failed(row, quarantine_reason(path, e))


class DeviceFeed:
    """Host frames → the encoder's device. On CPU nothing moves (the batch reads the shared memory in place); on
    CUDA a pinned copy, then an asynchronous copy on a stream of its own, overlapping the encoder's forward."""

    def __init__(self, device: torch.device):
        self.device = device
        self.stream = torch.cuda.Stream(device) if device.type == "cuda" else None

    def put(self, frames: torch.Tensor) -> tuple[torch.Tensor, Any]:
        """frames on the device, and the CUDA event of their copy (None: there already)."""
        if self.stream is None or frames.is_cuda:
            return frames.to(self.device), None
        with torch.cuda.stream(self.stream):
            out = frames.pin_memory().to(self.device, non_blocking=True)
            ready = torch.cuda.Event()
            ready.record(self.stream)
        return out, ready


def _from_threads(decode_one: Callable[[dict], DecodedVideo], rows: list[dict], threads: int,
                  times: StageTimes | None) -> Iterator[DecodedVideo]:
    """Each row's video decoded in `threads` threads of this process, in order, with a bounded read-ahead."""
    def timed(row):
        t0 = time.perf_counter()
        dv = decode_one(row)
        if times is not None:
            times.add(decode=time.perf_counter() - t0)
        return dv

    threads = max(1, threads)
    with ThreadPoolExecutor(threads) as pool:
        todo, inflight = deque(rows), deque()
        while todo or inflight:
            while todo and len(inflight) < 2 * threads:
                inflight.append(pool.submit(timed, todo.popleft()))
            yield inflight.popleft().result()


def _from_processes(pool, rows: list[dict], root: Path, sampling: ClipSampling, static_splits,
                    encoder: FrozenEncoder, times: StageTimes | None) -> Iterator[DecodedVideo]:
    """Each row's video from the decoder processes, in order, its frames on the encoder's device."""
    feed, T = DeviceFeed(encoder.device), sampling.clip_len
    resize = (encoder.preprocess.short_side, encoder.preprocess.crop)
    tasks = [Task(i, str(root / r["path"]), r["split"] in static_splits, sampling, resize) for i, r in enumerate(rows)]
    for d in pool.decode(tasks):
        row = rows[d.seq]
        if d.error:
            yield _failed(row, d.error)
            continue
        t0 = time.perf_counter()
        frames, ready = feed.put(torch.from_numpy(d.frames))  # (n_clips * T + K, h, w, 3)
        if times is not None:
            times.add(decode=d.seconds, copy=time.perf_counter() - t0)
        n = len(d.clips) * T
        yield DecodedVideo(row, d.clips, d.fps, frames[:n].view(len(d.clips), T, *frames.shape[1:]), d.static_idx,
                           frames[n:, None] if len(d.static_idx) else None, ready=ready)  # (K, 1, h, w, 3)


def manifest_hash(rows: list[dict]) -> str:
    return hashlib.sha256(json.dumps(rows, sort_keys=True, default=str).encode()).hexdigest()[:16]


def encoder_workers(encoder: FrozenEncoder, workers: int = 0) -> int:
    """How many batches run through the model at once. CPU: one per torch thread, each batch on one thread
    (measured on 2 cores: a batch split over 2 threads ran at ~30-60% of the work rate of one thread per batch,
    and collapsed when another job took a core, since every layer waits for the slower thread). GPU: one."""
    if workers:
        return workers
    return torch.get_num_threads() if encoder.device.type == "cpu" else 1


def decode_workers(workers: int | None = None) -> int:
    """Decoder processes: `workers`, else $SPLAVU_DECODE_WORKERS, else the cores this process may use (0: threads)."""
    if workers is None:
        workers = settings().decode_workers
    return available_cores() if workers is None else workers


def choose_decoder(name: str, device: torch.device) -> str:
    """The backend SPLAVU_DECODER=`name` means here, for an encoder on `device`: decord or nvdec."""
    if name == "decord":
        return name
    from splavu_core.ingest import nvdec  # here: only asking for GPU decoding loads it

    why = nvdec.unavailable()
    if name == "nvdec":
        if why:
            raise ExtractError(f"SPLAVU_DECODER=nvdec asks for GPU decoding, but {why}: unset SPLAVU_DECODER (or set "
                               f"it to decord, or to auto: GPU decoding only where it can run)")
        return name
    if name == "auto":
        return "nvdec" if why is None and device.type == "cuda" else "decord"
    raise ExtractError(f"SPLAVU_DECODER={name!r}: expected decord, nvdec or auto")


def extract_shard(shard: str, rows: list[dict], root: Path, encoder: FrozenEncoder, sampling: ClipSampling,
                  batch_size: int = 16, decode_threads: int = 2, static_splits=("train",),
                  log: Callable[[str], None] | None = None, progress: Callable[[int], None] | None = None,
                  pixel: PixelAnonymizer | None = None, workers: int = 0, decoders: int | None = None,
                  decoder: str | None = None, times: StageTimes | None = None) -> ShardLatents:
    """Latents of every usable video in `rows`, in manifest order, clips in temporal order.

    `pixel`: a pixel-space baseline applied to the decoded frames before the encoder (its latents
    belong in that baseline's own store, see splavu_core.extract.pixel). `workers`: batches encoded at once
    (0: encoder_workers' choice). A clip's latent does not depend on its batch, its batch size or the thread
    count (tests/test_extract.py pins it), so how batches are spread over workers changes no byte. `decoders`:
    decoder processes (None: decode_workers' choice; 0: `decode_threads` threads here); `decoder`: the backend
    (None: $SPLAVU_DECODER); `times`: where the stages' busy seconds are added up."""
    assert sampling.clip_len == encoder.num_frames, (
        f"clip_len {sampling.clip_len} differs from the encoder's num_frames {encoder.num_frames}")
    root = Path(root)
    backend = "decord" if pixel is not None else choose_decoder(decoder or settings().decoder, encoder.device)
    n_decoders = 0 if pixel is not None else decode_workers(decoders)  # a pixel transform runs in this process
    clip_out: dict[str, list] = {}      # video_id -> [(span, embedding)]
    static_out: dict[str, np.ndarray] = {}
    quarantine = []
    meta: dict[str, tuple] = {}
    pending: list[tuple] = []           # (video_id, kind, i, frames, ready event) awaiting a batch
    encoding: deque = deque()           # (batch's (video_id, kind, i), future of its (B, D) embeddings)
    n_workers = encoder_workers(encoder, workers)
    staged = backend == "decord" and n_decoders == 0  # the threads path: frames staged per video, batched per clip

    def collect(keep: int):
        while len(encoding) > keep:
            keys, fut = encoding.popleft()
            embs = fut.result()
            for (vid, kind, i), e in zip(keys, embs.numpy() if isinstance(embs, Pending) else embs):
                if kind == "clip":
                    clip_out[vid][i] = e
                else:
                    static_out[vid][i] = e

    def flush(force=False):
        while len(pending) >= batch_size or (force and pending):
            chunk, pending[:] = pending[:batch_size], pending[batch_size:]
            clips = [c[3] for c in chunk]
            if staged:  # the worker builds its batch itself (Preprocess.batch), beside the other worker's forward
                fut = encode_pool.submit(encoder.embed_clips, clips, times)
            else:
                ready = list({id(c[4]): c[4] for c in chunk if c[4] is not None}.values())
                fut = encode_pool.submit(encoder.embed_frames, clips, ready, times)
            encoding.append(([c[:3] for c in chunk], fut))
            collect(keep=2 * n_workers)  # bounded: a batch waiting per worker beside the one it runs
        if force:
            collect(keep=0)

    # CPU with several workers: one intra-op thread each (decode threads' preprocessing included), so the
    # threads in flight match the cores instead of workers x torch threads + decode threads
    one_thread = 1 if encoder.device.type == "cpu" and n_workers > 1 else None
    with ExitStack() as stack:
        stack.enter_context(intra_op_threads(one_thread))
        encode_pool = stack.enter_context(ThreadPoolExecutor(n_workers))
        if backend == "nvdec":
            videos = _from_threads(lambda r: _decode_on_gpu(r, root, sampling, r["split"] in static_splits), rows,
                                   decode_threads, times)
        elif staged:
            videos = _from_threads(lambda r: decode_video(r, root, sampling, r["split"] in static_splits, pixel=pixel,
                                                          stage=encoder.preprocess.stage), rows, decode_threads, times)
        else:
            pool = stack.enter_context(decoder_pool(n_decoders))
            videos = _from_processes(pool, rows, root, sampling, static_splits, encoder, times)
        stack.callback(videos.close)  # first on the way out: a pool left with work queued is not kept for reuse
        for done, dv in enumerate(videos, 1):
            vid = dv.row["video_id"]
            if dv.error:
                quarantine.append((vid, dv.row["path"], dv.error))
                if log:
                    log(f"quarantined {vid}: {dv.error}")
            else:
                meta[vid] = (dv.row, dv.clips, dv.fps)
                clip_out[vid] = [None] * len(dv.clips)
                pending.extend((vid, "clip", i, f, dv.ready) for i, f in enumerate(dv.clip_frames))
                if dv.static_frames is not None:
                    static_out[vid] = np.zeros((len(dv.static_idx), encoder.dim), np.float32)
                    # a static clip = one frame repeated clip_len times: the batch repeats it
                    pending.extend((vid, "static", k, f, dv.ready) for k, f in enumerate(dv.static_frames))
                    meta[vid] = meta[vid] + (dv.static_idx,)
            flush()
            if progress:
                progress(done)
        flush(force=True)

    return _assemble(rows, clip_out, static_out, meta, quarantine, encoder.dim, shard, log)


def _assemble(rows, clip_out, static_out, meta, quarantine, dim, shard, log) -> ShardLatents:
    clips, idx = [], {k: [] for k in CLIP_INDEX_SCHEMA.names}
    static, sidx = [], {k: [] for k in STATIC_INDEX_SCHEMA.names}
    for r in rows:
        vid = r["video_id"]
        if vid not in clip_out:
            continue
        embs = np.stack(clip_out[vid]).astype(np.float32)
        if not np.isfinite(embs).all() or (vid in static_out and not np.isfinite(static_out[vid]).all()):
            quarantine.append((vid, r["path"], "encoder produced non-finite values"))
            if log:
                log(f"quarantined {vid}: encoder produced non-finite values")
            continue
        row, spans, fps = meta[vid][:3]
        clips.append(embs)
        for s in spans:
            idx["video_id"].append(vid)
            idx["clip_index"].append(s.clip_index)
            idx["start_frame"].append(s.start_frame)
            idx["end_frame"].append(s.end_frame)
            idx["start_s"].append(s.start_frame / fps)
            idx["end_s"].append(s.end_frame / fps)
            idx["split"].append(r["split"])
        if vid in static_out:
            static.append(static_out[vid])
            for k, f in enumerate(meta[vid][3]):
                sidx["video_id"].append(vid)
                sidx["k"].append(k)
                sidx["frame_index"].append(int(f))
    now = datetime.now(timezone.utc)
    K = max((len(s) for s in static), default=0)
    return ShardLatents(
        clips=np.concatenate(clips) if clips else np.zeros((0, dim), np.float32),
        index=pa.table(idx, schema=CLIP_INDEX_SCHEMA),
        static=np.stack(static) if static else np.zeros((0, K, dim), np.float32),
        static_index=pa.table(sidx, schema=STATIC_INDEX_SCHEMA),
        quarantine=pa.table({"video_id": [q[0] for q in quarantine], "path": [q[1] for q in quarantine],
                             "error": [q[2] for q in quarantine], "when": [now] * len(quarantine),
                             "shard": [shard] * len(quarantine)}, schema=QUARANTINE_SCHEMA))
