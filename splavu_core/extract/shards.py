"""Extract clip and static latents of one shard: decode (threads) overlapped with encoding.

A video that cannot be used (corrupt, truncated, empty, unsupported, too short) goes to the
shard's quarantine table with the reason; it never fails the shard and never leaves a NaN or
zero row behind.

Videos of one shard may differ in size, frame rate and container: each video's frames are brought
to the encoder's input size (its preprocessing: resize, crop, normalise) in the decode thread, so the
encoder's batches mix clips of any videos. Frame rate only matters to the clip arithmetic, per video.
"""
from __future__ import annotations

import hashlib
import json
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable

import numpy as np
import pyarrow as pa
import torch

from splavu_core.extract.encoders.vfm import FrozenEncoder
from splavu_core.extract.pixel import PixelAnonymizer
from splavu_core.extract.sampling import ClipSampling, ClipSpan
from splavu_core.ingest.video import DecordVideo, VideoError
from splavu_core.store.feature_store import CLIP_INDEX_SCHEMA, QUARANTINE_SCHEMA, STATIC_INDEX_SCHEMA, ShardLatents
from splavu_core.threads import intra_op_threads


@dataclass
class DecodedVideo:
    row: dict
    clips: list[ClipSpan]
    fps: float
    clip_frames: np.ndarray | None     # (n_clips, T, H, W, 3) uint8; staged: see Preprocess.stage
    static_idx: np.ndarray             # (K,) frame indices
    static_frames: np.ndarray | None   # (K, H, W, 3) uint8; staged: (K, 1, ...) as Preprocess.stage gives
    error: str | None = None


def decode_video(row: dict, root: Path, sampling: ClipSampling, want_static: bool, threads: int = 1,
                 pixel: PixelAnonymizer | None = None, stage: Callable | None = None) -> DecodedVideo:
    """Decode exactly the frames a video's clips (and static clips) need; `pixel` anonymizes them first,
    `stage` (the encoder's Preprocess.stage) brings them to its input size. Any failure quarantines this video only."""
    path = root / row["path"]
    empty = DecodedVideo(row, [], 0.0, None, np.zeros(0, np.int64), None)
    try:
        dv = _decode(row, path, sampling, want_static, threads, pixel)
        if stage is not None:
            dv.clip_frames = stage(dv.clip_frames)
            dv.static_frames = stage(dv.static_frames[:, None]) if dv.static_frames is not None else None
        return dv
    except VideoError as e:
        empty.error = str(e)
    except Exception as e:  # one unusable video must never fail its shard: quarantine it with what went wrong
        empty.error = f"{path}: {type(e).__name__}: {str(e).strip()[:300]}"
    return empty


def _decode(row: dict, path: Path, sampling: ClipSampling, want_static: bool, threads: int,
            pixel: PixelAnonymizer | None) -> DecodedVideo:
    v = DecordVideo(path, num_threads=threads)
    clips = sampling.clips(v.info.n_frames, v.info.fps)
    if not clips:
        need = sampling.clip_len * sampling.step_for(v.info.fps)
        raise VideoError(f"{path}: too short: {v.info.n_frames} frames, a clip needs {need}")
    static_idx = sampling.static_frames(v.info.n_frames) if want_static else np.zeros(0, np.int64)
    wanted = np.unique(np.concatenate([np.concatenate([c.frames for c in clips]), static_idx]))
    frames = v.frames(wanted)  # (F, H, W, 3)
    if pixel is not None:  # a pixel baseline: the encoder only ever sees the transformed frames
        frames = pixel(path, wanted, frames)
    pos = {int(f): i for i, f in enumerate(wanted)}
    clip_frames = np.stack([frames[[pos[int(f)] for f in c.frames]] for c in clips])
    static_frames = frames[[pos[int(f)] for f in static_idx]] if len(static_idx) else None
    return DecodedVideo(row, clips, v.info.fps, clip_frames, static_idx, static_frames)


def manifest_hash(rows: list[dict]) -> str:
    return hashlib.sha256(json.dumps(rows, sort_keys=True, default=str).encode()).hexdigest()[:16]


def encoder_workers(encoder: FrozenEncoder, workers: int = 0) -> int:
    """How many batches run through the model at once. CPU: one per torch thread, each batch on one thread
    (measured on 2 cores: a batch split over 2 threads ran at ~30-60% of the work rate of one thread per batch,
    and collapsed when another job took a core, since every layer waits for the slower thread). GPU: one."""
    if workers:
        return workers
    return torch.get_num_threads() if encoder.device.type == "cpu" else 1


def extract_shard(shard: str, rows: list[dict], root: Path, encoder: FrozenEncoder, sampling: ClipSampling,
                  batch_size: int = 16, decode_threads: int = 2, static_splits=("train",),
                  log: Callable[[str], None] | None = None, progress: Callable[[int], None] | None = None,
                  pixel: PixelAnonymizer | None = None, workers: int = 0) -> ShardLatents:
    """Latents of every usable video in `rows`, in manifest order, clips in temporal order.

    `pixel`: a pixel-space baseline applied to the decoded frames before the encoder (its latents
    belong in that baseline's own store, see splavu_core.extract.pixel). `workers`: batches encoded at once
    (0: encoder_workers' choice). A clip's latent does not depend on its batch, its batch size or the thread
    count (tests/test_extract.py pins it), so how batches are spread over workers changes no byte."""
    assert sampling.clip_len == encoder.num_frames, (
        f"clip_len {sampling.clip_len} differs from the encoder's num_frames {encoder.num_frames}")
    root = Path(root)
    clip_out: dict[str, list] = {}      # video_id -> [(span, embedding)]
    static_out: dict[str, np.ndarray] = {}
    quarantine = []
    meta: dict[str, tuple] = {}
    pending: list[tuple[str, str, int, torch.Tensor]] = []  # (video_id, kind, i, staged frames) awaiting a batch
    encoding: deque = deque()           # (batch's (video_id, kind, i), future of its (B, D) embeddings)
    n_workers = encoder_workers(encoder, workers)

    def collect(keep: int):
        while len(encoding) > keep:
            keys, fut = encoding.popleft()
            for (vid, kind, i), e in zip(keys, fut.result()):
                if kind == "clip":
                    clip_out[vid][i] = e
                else:
                    static_out[vid][i] = e

    def flush(force=False):
        while len(pending) >= batch_size or (force and pending):
            chunk, pending[:] = pending[:batch_size], pending[batch_size:]
            # the worker builds its batch itself (Preprocess.batch), beside the other worker's forward
            encoding.append(([c[:3] for c in chunk], encode_pool.submit(encoder.embed_clips, [c[3] for c in chunk])))
            collect(keep=2 * n_workers)  # bounded: a batch waiting per worker beside the one it runs
        if force:
            collect(keep=0)

    # CPU with several workers: one intra-op thread each (decode threads' preprocessing included), so the
    # threads in flight match the cores instead of workers x torch threads + decode threads
    one_thread = 1 if encoder.device.type == "cpu" and n_workers > 1 else None
    with intra_op_threads(one_thread), ThreadPoolExecutor(max(1, decode_threads)) as pool, \
            ThreadPoolExecutor(n_workers) as encode_pool:
        todo = deque(rows)
        inflight = deque()
        done = 0
        while todo or inflight:
            while todo and len(inflight) < 2 * max(1, decode_threads):  # bounded read-ahead
                r = todo.popleft()
                inflight.append(pool.submit(decode_video, r, root, sampling, r["split"] in static_splits,
                                             pixel=pixel, stage=encoder.preprocess.stage))
            dv = inflight.popleft().result()
            vid = dv.row["video_id"]
            if dv.error:
                quarantine.append((vid, dv.row["path"], dv.error))
                if log:
                    log(f"quarantined {vid}: {dv.error}")
            else:
                meta[vid] = (dv.row, dv.clips, dv.fps)
                clip_out[vid] = [None] * len(dv.clips)
                pending.extend((vid, "clip", i, f) for i, f in enumerate(dv.clip_frames))
                if dv.static_frames is not None:
                    static_out[vid] = np.zeros((len(dv.static_idx), encoder.dim), np.float32)
                    # a static clip = one frame repeated clip_len times: the batch repeats it (Preprocess.batch)
                    pending.extend((vid, "static", k, f) for k, f in enumerate(dv.static_frames))
                    meta[vid] = meta[vid] + (dv.static_idx,)
            flush()
            done += 1
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
