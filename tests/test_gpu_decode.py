"""GPU decoding (issue 61): the nvdec backend (splavu_core/ingest/nvdec.py, NVIDIA's PyNvVideoCodec).

Without a GPU the backend runs with PyNvVideoCodec faked by decord and the CUDA probe answered yes (the GPU boundary,
nothing else): its frames are then decord's, so extraction through it must give decord's latents bit for bit. Where
NVDEC is there (benchmarks/extract_gpu.sh runs this module), its frames are compared with decord's for real.
"""
import shutil
import sys
import types
from pathlib import Path

import numpy as np
import pytest
import torch

from splavu_core.extract.encoders.vfm import load_encoder
from splavu_core.extract.sampling import ClipSampling
from splavu_core.extract.shards import extract_shard
from splavu_core.ingest import nvdec
from splavu_core.ingest.manifest import load_manifest
from splavu_core.ingest.decoders import open_video
from splavu_core.ingest.video import write_mp4

REPO = Path(__file__).resolve().parents[1]
# NVDEC converts YUV to RGB itself, libswscale does for decord: the frames may differ by rounding. The bound each
# frame must keep, in levels of 255 (mean absolute difference, and its 99th percentile). Unmeasured on a GPU when
# written (issue 61): the first GPU session prints the figures (-s) and tightens these.
MEAN_ABS_TOLERANCE = 2.0
P99_ABS_TOLERANCE = 12


def fake_pynvvideocodec():
    """PyNvVideoCodec's SimpleDecoder as splavu calls it, decoding with decord on the CPU (numpy frames: DLPack)."""
    import decord

    class SimpleDecoder:
        def __init__(self, path, gpu_id=0, use_device_memory=True, cuda_stream=0, output_color_type=None):
            assert use_device_memory and output_color_type == "RGB"
            self.vr = decord.VideoReader(path, num_threads=1)  # raises for what it cannot open, as NVDEC does

        def get_stream_metadata(self):
            h, w = self.vr[0].shape[:2]
            return types.SimpleNamespace(width=w, height=h, num_frames=len(self.vr), average_fps=self.vr.get_avg_fps())

        def __len__(self):
            return len(self.vr)

        def get_batch_frames_by_index(self, indices):
            frames = self.vr.get_batch(list(indices)).asnumpy()
            return [frames[i] for i in range(len(frames))]

    return types.SimpleNamespace(SimpleDecoder=SimpleDecoder, OutputColorType=types.SimpleNamespace(RGB="RGB"))


@pytest.fixture
def faked_gpu(monkeypatch):
    monkeypatch.setitem(sys.modules, "PyNvVideoCodec", fake_pynvvideocodec())
    monkeypatch.setattr(nvdec, "unavailable", lambda: None)
    nvdec._codec.cache_clear()
    yield
    nvdec._codec.cache_clear()


def test_the_nvdec_backend_extracts_what_decord_does(faked_gpu, tiny_bench, tiny_videomae, tmp_path):
    """Through the nvdec path (decode threads, frames as torch tensors, preparation on the device): decord's
    latents bit for bit, clips and static clips, and the same videos quarantined, each reason naming its file."""
    root, _ = tiny_bench
    ds = tmp_path / "ds"
    shutil.copytree(root / "ar", ds)
    rows = load_manifest(ds / "manifest.csv").rows[:4]
    (ds / "broken.mp4").write_bytes(np.random.default_rng(4000).bytes(4000))
    rows.append({**rows[0], "video_id": "broken", "path": "broken.mp4"})
    enc, s = load_encoder(tiny_videomae, device="cpu"), ClipSampling(static_k=2)
    outs = {d: extract_shard("n-000", rows, ds, enc, s, decoder=d, static_splits=("train", "val", "test"))
            for d in ("decord", "nvdec")}
    assert np.array_equal(outs["nvdec"].clips, outs["decord"].clips) and len(outs["decord"].clips) > 4
    assert np.array_equal(outs["nvdec"].static, outs["decord"].static)
    assert outs["nvdec"].index.equals(outs["decord"].index)
    (q,) = outs["nvdec"].quarantine.to_pylist()
    assert q["video_id"] == "broken" and "broken.mp4: cannot open video with NVDEC" in q["error"]
    assert open_video(ds / rows[0]["path"], "nvdec").frames([0, 3]).shape == (2, 112, 112, 3)
    assert nvdec.compare_with_decord(ds / rows[0]["path"])["max_abs"] == 0


def test_auto_decodes_on_the_gpu_only_for_an_encoder_there(faked_gpu):
    from splavu_core.extract.shards import choose_decoder

    assert choose_decoder("auto", torch.device("cpu")) == "decord"
    assert choose_decoder("auto", torch.device("cuda")) == "nvdec"
    assert choose_decoder("nvdec", torch.device("cpu")) == "nvdec" and choose_decoder("decord", torch.device("cuda")) == "decord"


needs_nvdec = pytest.mark.skipif(nvdec.unavailable() is not None, reason=f"no GPU decoding here: {nvdec.unavailable()}")


@needs_nvdec
def test_nvdec_frames_match_decords_within_the_tolerance(tmp_path):
    """The real-video fixture (576x768 H.264) and, where PyAV is, a synthetic 112 px H.264 render like the demo's:
    the same frame count, rate and size, and pixels within the stated tolerance."""
    paths = [REPO / "tests" / "data" / "vtest_people.mp4"]
    try:
        from splavu_core.ingest.synth.figure import random_actor
        from splavu_core.ingest.synth.render import render

        rng = np.random.default_rng(0)
        write_mp4(tmp_path / "render.mp4", render(random_actor(rng), [("wave", 0, 48)], 48, rng), fps=16)
        paths.append(tmp_path / "render.mp4")
    except ImportError:  # a GPU machine without PyAV: the fixture only
        pass
    for path in paths:
        got = nvdec.compare_with_decord(path)
        print(got)
        assert got["nvdec"][0] == got["decord"][0] and got["nvdec"][2:] == got["decord"][2:]
        assert got["nvdec"][1] == pytest.approx(got["decord"][1])
        assert got["mean_abs_worst_frame"] <= MEAN_ABS_TOLERANCE and got["p99_abs_worst_frame"] <= P99_ABS_TOLERANCE
