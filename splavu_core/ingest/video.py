"""Video I/O: H.264 writing (PyAV) and decoding (decord), behind a small reader interface.

A reader has `path`, `info` (VideoInfo) and `frames(indices)` → (N, H, W, 3) uint8; DecordVideo is the CPU one,
splavu_core/ingest/nvdec.py the GPU one, and splavu_core/ingest/decoders.py picks one by name."""
from __future__ import annotations

import os
import re
import threading
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path

import numpy as np


class VideoError(Exception):
    """A video that cannot be decoded as asked; the message names the file."""


def write_mp4(path: str | os.PathLike, frames: np.ndarray, fps: int, crf: int = 18) -> None:
    """Encode (T, H, W, 3) uint8 frames as H.264 yuv420p, byte-deterministic.

    libx264's macroblock-tree rate control and threading make an encode depend on process
    state, so both are off and timestamps are set explicitly.
    """
    write_video(path, frames, fps, "libx264", "mp4",
                {"crf": str(crf), "preset": "veryfast", "x264-params": "mbtree=0:threads=1:sliced-threads=0"})


def write_video(path: str | os.PathLike, frames: np.ndarray, fps: int, codec: str, container: str,
                options: dict | None = None) -> None:
    """Encode (T, H, W, 3) uint8 frames with any libav codec and container (e.g. "mpeg4" in "avi")."""
    import av  # here, not at the top: only reading/writing videos needs it

    T, H, W, _ = frames.shape
    assert frames.dtype == np.uint8 and H % 2 == 0 and W % 2 == 0, f"{path}: need uint8 frames of even size"
    tmp = Path(f"{path}.part")
    with av.open(str(tmp), mode="w", format=container) as out:
        stream = out.add_stream(codec, rate=fps)
        stream.width, stream.height, stream.pix_fmt = W, H, "yuv420p"
        stream.time_base = Fraction(1, fps)
        stream.thread_count = 1
        stream.options = options or {}
        for i in range(T):
            frame = av.VideoFrame.from_ndarray(frames[i], format="rgb24")
            frame.pts, frame.time_base = i, Fraction(1, fps)
            for packet in stream.encode(frame):
                out.mux(packet)
        for packet in stream.encode():
            out.mux(packet)
    os.replace(tmp, path)


@dataclass(frozen=True)
class VideoInfo:
    n_frames: int
    fps: float
    height: int
    width: int


def check_file(path: str) -> None:
    """VideoError for what no backend can open: a missing or empty file."""
    if not os.path.isfile(path):
        raise VideoError(f"{path}: no such file")
    if os.path.getsize(path) == 0:
        raise VideoError(f"{path}: empty file")


class DecordVideo:
    """A decoded video file. Frames come back as (T, H, W, 3) uint8 numpy arrays."""

    def __init__(self, path: str | os.PathLike, num_threads: int = 1):
        self.path = str(path)
        check_file(self.path)
        import decord  # here, not at the top: only reading/writing videos needs it

        try:
            self._vr = decord.VideoReader(self.path, ctx=decord.cpu(0), num_threads=num_threads)
        except Exception as e:  # decord raises DECORDError / RuntimeError for unsupported data
            raise VideoError(f"{self.path}: cannot open video ({libav_reason(self.path) or first_line(e)})") from None
        n = len(self._vr)
        if n == 0:
            raise VideoError(f"{self.path}: no decodable frames")
        h, w = self._vr[0].shape[:2] if n else (0, 0)
        self.info = VideoInfo(n_frames=n, fps=float(self._vr.get_avg_fps()), height=h, width=w)

    def frames(self, indices) -> np.ndarray:
        idx = np.asarray(indices, dtype=np.int64)
        try:
            out = self._vr.get_batch(idx.tolist()).asnumpy()
        except Exception as e:
            raise VideoError(f"{self.path}: failed decoding frames {idx.min()}..{idx.max()} ({first_line(e)})") from None
        if out.shape[0] != len(idx):
            raise VideoError(f"{self.path}: asked for {len(idx)} frames, decoded {out.shape[0]}")
        return out

    def all_frames(self) -> np.ndarray:
        return self.frames(np.arange(self.info.n_frames))


_LIBAV_LOG = threading.Lock()  # libav's log level and "last error" are process-wide


def libav_reason(path: str) -> str | None:
    """What libav itself says about a file it cannot open ("moov atom not found", ...): decord only says
    "Error reading <path>..." and prints the real reason on stderr. None if PyAV finds a video stream."""
    import av  # here, not at the top: only reading/writing videos needs it
    import av.logging  # here, not at the top: only reading/writing videos needs it

    with _LIBAV_LOG:
        before = av.logging.get_level()
        av.logging.set_level(av.logging.ERROR)  # PyAV keeps libav's messages only at a set level
        try:
            with av.open(path) as container:
                if not container.streams.video:
                    kinds = sorted({st.type for st in container.streams}) or ["no"]
                    return f"no video stream (the file holds {', '.join(kinds)} streams only)"
            return None
        except av.FFmpegError as e:
            text = str(e).replace(f": '{path}'", "")  # the path is already at the front of our message
            return re.sub(r"^\[Errno -?\d+\] ", "", text)
        finally:
            av.logging.set_level(before)


def first_line(e: Exception) -> str:
    text = str(e).strip().splitlines()
    return text[0][:200] if text else type(e).__name__
