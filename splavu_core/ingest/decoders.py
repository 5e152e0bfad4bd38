"""Video decoder backends by name, as pytorchvideo's EncodedVideo picks one: one reader interface (video.py),
swappable backends. decord: CPU, numpy frames, the default; nvdec: NVIDIA's NVDEC, torch frames on the GPU."""
from __future__ import annotations

import os

from splavu_core.ingest.video import DecordVideo

BACKENDS = ("decord", "nvdec")


def open_video(path: str | os.PathLike, backend: str = "decord", **options):
    """`path` through the named backend; `options` go to its reader (decord: num_threads; nvdec: gpu)."""
    if backend == "decord":
        return DecordVideo(path, **options)
    if backend == "nvdec":
        from splavu_core.ingest.nvdec import NvdecVideo  # here: only GPU decoding loads it (and torch)

        return NvdecVideo(path, **options)
    raise ValueError(f"unknown video decoder backend {backend!r}: choose from {BACKENDS}")
