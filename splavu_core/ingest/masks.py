"""Person masks stored beside a video: videos/x.mp4 -> videos/x.mask.npz, (T, H, W) bool, bit-packed.

The synthetic renderer writes its true actor silhouettes this way; the pixel baselines read them.
No torch here: the renderer's worker processes import this.
"""
from __future__ import annotations

import os
from pathlib import Path

import numpy as np


class PixelError(Exception):
    """A pixel baseline that cannot run as configured; the message names the file or setting."""


def mask_path(video: str | Path) -> Path:
    """videos/x.mp4 -> videos/x.mask.npz"""
    video = Path(video)
    return video.with_name(f"{video.stem}.mask.npz")


def write_masks(path: str | Path, masks: np.ndarray) -> None:
    """(T, H, W) bool masks, bit-packed and compressed."""
    assert masks.ndim == 3 and masks.dtype == bool, f"expected (T, H, W) bool masks, got {masks.shape} {masks.dtype}"
    path = Path(path)
    tmp = path.with_name(f".{path.name}.part")
    with open(tmp, "wb") as f:
        np.savez_compressed(f, packed=np.packbits(masks, axis=-1), shape=np.array(masks.shape))
    os.replace(tmp, path)


def read_masks(path: str | Path) -> np.ndarray:
    """(T, H, W) bool masks written by write_masks (never unpickles)."""
    with np.load(path, allow_pickle=False) as z:
        T, H, W = (int(v) for v in z["shape"])
        return np.unpackbits(z["packed"], axis=-1, count=W).astype(bool).reshape(T, H, W)
