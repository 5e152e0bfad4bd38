"""Clip sampling arithmetic: which frames make each clip and each static clip of a video."""
from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import NamedTuple

import numpy as np


class ClipSpan(NamedTuple):
    clip_index: int
    start_frame: int      # first frame (inclusive)
    end_frame: int        # last frame + 1 (exclusive)
    frames: np.ndarray    # (clip_len,) frame indices


@dataclass(frozen=True)
class ClipSampling:
    clip_len: int = 16            # frames per clip (the encoder's num_frames)
    frame_step: int = 1           # take every frame_step-th frame (ignored when target_fps is set)
    target_fps: float | None = None
    # static clips per video (0: none). 4, was 10: the default (keep) adapter's fit reads none of them, only the
    # pair-matching diagnostics do (2 of K per video), so 6 more per training video bought no interval
    static_k: int = 4

    def __post_init__(self):
        assert self.clip_len >= 1 and self.frame_step >= 1 and self.static_k >= 0, f"bad sampling {self}"
        assert self.target_fps is None or self.target_fps > 0, f"target_fps must be > 0, got {self.target_fps}"

    def as_dict(self) -> dict:
        return asdict(self)

    def step_for(self, fps: float) -> int:
        if self.target_fps is None:
            return self.frame_step
        return max(1, int(round(fps / self.target_fps)))

    def clips(self, n_frames: int, fps: float) -> list[ClipSpan]:
        """Every non-overlapping clip that fits entirely in the video, in temporal order."""
        step = self.step_for(fps)
        span = self.clip_len * step
        return [ClipSpan(i, i * span, (i + 1) * span, i * span + step * np.arange(self.clip_len))
                for i in range(n_frames // span)]

    def static_frames(self, n_frames: int) -> np.ndarray:
        """(static_k,) frame indices spread uniformly over the video; each becomes a static clip."""
        if self.static_k == 0:
            return np.zeros(0, dtype=np.int64)
        return np.linspace(0, n_frames - 1, self.static_k).round().astype(np.int64)
