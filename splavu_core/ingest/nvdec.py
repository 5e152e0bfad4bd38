"""GPU decoding (NVDEC) with NVIDIA's PyNvVideoCodec, behind DecordVideo's interface; the frames stay on the GPU.

Why PyNvVideoCodec and not torchcodec: its wheel on PyPI is self-contained (it bundles its demuxer and reaches NVDEC
through the NVIDIA driver) and talks to torch through DLPack only, so it does not depend on torch's version. torchcodec
is built for one torch release at a time and needs the system's FFmpeg libraries; its 0.17 wheel on PyPI is a
CUDA 13 build that does not import beside the CPU torch (libnvrtc.so.13), and this project's GPU machines are offline,
so no FFmpeg can be installed there. PyNvVideoCodec is in both locks (the `nvdec` extra); it imports only where
NVIDIA's driver and its video libraries are.

The colour conversion is NVDEC's, not libswscale's: frames differ from decord's by rounding
(tests/test_gpu_decode.py states the tolerance; it runs where a GPU is).
"""
from __future__ import annotations

import functools
import os
from contextlib import nullcontext

import numpy as np

from splavu_core.ingest.video import VideoError, VideoInfo, check_file, first_line


@functools.cache
def _codec():
    import PyNvVideoCodec  # here: only GPU decoding needs it (it fails to import without NVIDIA's driver)

    return PyNvVideoCodec


def unavailable() -> str | None:
    """Why NVDEC decoding cannot run in this process (None: it can)."""
    import torch

    if not torch.cuda.is_available():
        return "no CUDA device is available to this process"
    try:
        _codec()
    except ImportError:
        return "PyNvVideoCodec is not installed (pip install pynvvideocodec)"
    except Exception as e:  # its import checks the driver and raises RuntimeError with a long troubleshooting text
        return f"PyNvVideoCodec does not load ({first_line(e)})"
    return None


class NvdecVideo:
    """A video file decoded on GPU `gpu`. Frames come back as (T, H, W, 3) uint8 torch tensors on that GPU, ready:
    the reader decodes on the CUDA stream current when it is opened and waits for that stream in frames() (a decode
    thread gives each video a stream of its own, so it waits for its own work only)."""

    def __init__(self, path: str | os.PathLike, gpu: int = 0):
        import torch

        self.path = str(path)
        check_file(self.path)
        nvc = _codec()
        self.stream = torch.cuda.current_stream(gpu) if torch.cuda.is_available() else None
        try:
            self._dec = nvc.SimpleDecoder(self.path, gpu_id=gpu, use_device_memory=True,
                                          cuda_stream=self.stream.cuda_stream if self.stream is not None else 0,
                                          output_color_type=nvc.OutputColorType.RGB)
            meta = self._dec.get_stream_metadata()
            n = len(self._dec)
        except Exception as e:  # PyNvVideoCodec raises plain Exception / RuntimeError for unusable input
            raise VideoError(f"{self.path}: cannot open video with NVDEC ({first_line(e)})") from None
        if n == 0:
            raise VideoError(f"{self.path}: no decodable frames")
        self.info = VideoInfo(n_frames=int(n), fps=float(meta.average_fps), height=int(meta.height),
                              width=int(meta.width))

    def frames(self, indices):
        import torch

        idx = np.asarray(indices, dtype=np.int64)
        try:
            got = self._dec.get_batch_frames_by_index(idx.tolist())
        except Exception as e:
            raise VideoError(f"{self.path}: failed decoding frames {idx.min()}..{idx.max()} with NVDEC "
                             f"({first_line(e)})") from None
        if len(got) != len(idx):  # it skips out-of-range and repeated indices (with a warning)
            raise VideoError(f"{self.path}: asked NVDEC for {len(idx)} frames, decoded {len(got)}")
        with torch.cuda.stream(self.stream) if self.stream is not None else nullcontext():
            out = torch.stack([torch.from_dlpack(f) for f in got])  # (T, H, W, 3): a copy, out of its frame cache
        if self.stream is not None:
            self.stream.synchronize()  # ready for any stream; the decoder may reuse its cache on the next call
        return out

    def all_frames(self):
        return self.frames(np.arange(self.info.n_frames))



def compare_with_decord(path: str | os.PathLike) -> dict:
    """NVDEC's frames of `path` against decord's: frame count, rate and size of each, and the absolute pixel
    difference per frame in levels of 255 (the worst frame's mean, the worst 99th percentile, the maximum)."""
    from splavu_core.ingest.video import DecordVideo

    cpu, gpu = DecordVideo(path), NvdecVideo(path)
    out = {"video": str(path), "decord": [cpu.info.n_frames, cpu.info.fps, cpu.info.height, cpu.info.width],
           "nvdec": [gpu.info.n_frames, gpu.info.fps, gpu.info.height, gpu.info.width]}
    shape = (cpu.info.n_frames, cpu.info.height, cpu.info.width)
    if (gpu.info.n_frames, gpu.info.height, gpu.info.width) != shape:
        return out  # another count or size: no pixel comparison
    idx = np.arange(cpu.info.n_frames)
    diff = np.abs(gpu.frames(idx).cpu().numpy().astype(np.int16) - cpu.frames(idx).astype(np.int16))
    per_frame = diff.reshape(len(idx), -1)
    return {**out, "mean_abs_worst_frame": round(float(per_frame.mean(1).max()), 3),
            "mean_abs": round(float(per_frame.mean()), 3),
            "p99_abs_worst_frame": float(np.percentile(per_frame, 99, axis=1).max()), "max_abs": int(diff.max())}
