"""The in-memory shape every trainer and evaluator consumes: one video's clip features + labels.

Raw latents (from the Zarr store) and anonymized features (from Parquet) both load into this,
so a head never knows which it is looking at.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


@dataclass
class VideoFeatures:
    video_id: str
    split: str                  # train / val / test
    feats: np.ndarray           # (n_clips, D) float32, clips in temporal order
    clip_start_s: np.ndarray    # (n_clips,) clip start time in seconds
    clip_end_s: np.ndarray      # (n_clips,) clip end time in seconds
    n_frames: int               # frames in the video
    fps: float
    meta: dict = field(default_factory=dict)  # manifest row: action, segments, anomaly, anomaly_intervals,
    #                                            subject_id, group, attr_<name> (parsed, None when absent)

    def __post_init__(self):
        assert self.feats.ndim == 2, f"{self.video_id}: feats must be (n_clips, D), got {self.feats.shape}"
        assert len(self.clip_start_s) == len(self.feats) == len(self.clip_end_s), f"{self.video_id}: clip times/feats mismatch"

    @property
    def dim(self) -> int:
        return self.feats.shape[1]


def split_of(videos: list[VideoFeatures], split: str) -> list[VideoFeatures]:
    return [v for v in videos if v.split == split]
