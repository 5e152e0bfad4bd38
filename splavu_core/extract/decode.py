"""Decoding one video for extraction: the frames its clips and static clips need, each decoded once.

No torch here: the decoder processes (splavu_core/extract/decode_pool.py) import this module and nothing heavier.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from splavu_core.extract.sampling import ClipSampling, ClipSpan
from splavu_core.ingest.decoders import open_video
from splavu_core.ingest.video import VideoError


class ExtractError(Exception):
    """Extraction cannot go on here (a decoder backend this machine lacks, a decoder process that died); the message
    names the setting or the video, and nothing of the shard was written."""


@dataclass
class VideoClips:
    clips: list[ClipSpan]
    fps: float
    frames: Any                # (F, H, W, 3) uint8, numpy (decord) or torch (nvdec): every frame needed, once
    wanted: np.ndarray         # (F,) their indices in the video
    clip_rows: np.ndarray      # (n_clips, T) rows of `frames`
    static_idx: np.ndarray     # (K,) frame indices in the video
    static_rows: np.ndarray    # (K,) rows of `frames`


def read_clips(path: Path, sampling: ClipSampling, want_static: bool, threads: int = 1,
               backend: str = "decord") -> VideoClips:
    """Decode exactly the frames of a video's clips (and static clips); VideoError when it is too short."""
    v = open_video(path, backend, **({"num_threads": threads} if backend == "decord" else {}))
    clips = sampling.clips(v.info.n_frames, v.info.fps)
    if not clips:
        need = sampling.clip_len * sampling.step_for(v.info.fps)
        raise VideoError(f"{path}: too short: {v.info.n_frames} frames, a clip needs {need}")
    static_idx = sampling.static_frames(v.info.n_frames) if want_static else np.zeros(0, np.int64)
    clip_idx = np.stack([c.frames for c in clips])  # (n_clips, T)
    wanted = np.unique(np.concatenate([clip_idx.ravel(), static_idx]))
    frames = v.frames(wanted)  # (F, H, W, 3)
    return VideoClips(clips, v.info.fps, frames, wanted, np.searchsorted(wanted, clip_idx), static_idx,
                      np.searchsorted(wanted, static_idx))


def quarantine_reason(path: Path, e: Exception) -> str:
    """What the quarantine table says about a video that failed: the decoder's own message, else the exception's."""
    if isinstance(e, VideoError):
        return str(e)
    return f"{path}: {type(e).__name__}: {str(e).strip()[:300]}"


def crop_box(height: int, width: int, short_side: int, crop: int) -> tuple[int, int] | None:
    """(top, left) of the encoder's centre crop when frames of this size need no resize (their short side is already
    the encoder's), else None: the one place this arithmetic lives (Preprocess and the decoder processes use it)."""
    if min(height, width) != short_side:
        return None
    return (height - crop) // 2, (width - crop) // 2
