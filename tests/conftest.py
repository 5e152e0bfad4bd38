"""Shared fixtures: a tiny synthetic benchmark and tiny saved checkpoints of each encoder family."""
import json
import os
import random
import tempfile

import numpy as np
import pytest
import torch

torch.set_num_threads(1)
os.environ.setdefault("OMP_NUM_THREADS", "1")
# where the CLI records its runs when a test unsets $DAGSTER_HOME: a folder of this test process (each xdist worker its
# own), not the checkout's .dagster_home (pipeline/runner.py instance_dir)
os.environ["SPLAVU_DAGSTER_HOME"] = tempfile.mkdtemp(prefix=f"splavu-dagster-home-{os.environ.get('PYTEST_XDIST_WORKER', 'main')}-")


@pytest.fixture(autouse=True)
def seeded_global_generators():
    """numpy's, the stdlib's and torch's global generators start from seed 0 in every test: a test drawing from them
    gets the same numbers whatever ran before it in its worker (tests/test_determinism.py checks it)."""
    np.random.seed(0)
    random.seed(0)
    torch.manual_seed(0)


@pytest.fixture(scope="session")
def tiny_bench(tmp_path_factory):
    """The `tiny` synthetic benchmark (real H.264 files), generated once per test session.

    Benchmark v1: the pipeline tests do not depend on what the actions are, and v1's tiny set is a third
    smaller than v2's; v2's own content is tested in test_synth.py."""
    from splavu_core.ingest.synth.datasets import generate

    out = tmp_path_factory.mktemp("bench")
    summary = generate(out, "tiny", seed=0, workers=2, benchmark="v1")
    return out, summary


def save_tiny_videomae(path, seed=0, image_size=32):
    from transformers import VideoMAEConfig, VideoMAEModel

    torch.manual_seed(seed)
    cfg = VideoMAEConfig(image_size=image_size, patch_size=16, num_frames=16, tubelet_size=4, hidden_size=32,
                         num_hidden_layers=1, num_attention_heads=2, intermediate_size=64, use_mean_pooling=False)
    VideoMAEModel(cfg).save_pretrained(path)
    (path / "preprocessor_config.json").write_text(json.dumps({
        "do_resize": True, "size": {"shortest_edge": image_size}, "do_center_crop": True,
        "crop_size": {"height": image_size, "width": image_size}, "do_rescale": True, "rescale_factor": 1 / 255,
        "do_normalize": True, "image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5]}))
    return path


@pytest.fixture(scope="session")
def tiny_videomae(tmp_path_factory):
    return save_tiny_videomae(tmp_path_factory.mktemp("videomae"))


@pytest.fixture(scope="session")
def tiny_vjepa2(tmp_path_factory):
    from transformers import VJEPA2Config, VJEPA2Model

    torch.manual_seed(0)
    cfg = VJEPA2Config(crop_size=32, frames_per_clip=16, tubelet_size=4, patch_size=16, hidden_size=32,
                       num_attention_heads=2, num_hidden_layers=1, mlp_ratio=2.0, pred_hidden_size=16,
                       pred_num_attention_heads=2, pred_num_hidden_layers=1, num_pooler_layers=1)
    path = tmp_path_factory.mktemp("vjepa2")
    VJEPA2Model(cfg).save_pretrained(path)
    return path


@pytest.fixture(scope="session")
def tiny_store(tiny_bench, tiny_videomae, tmp_path_factory):
    """A store with the tiny benchmark's latents (tiny random VideoMAE), extracted through Dagster."""
    import dagster as dg

    from assets.resources import EncoderResource, StoreResource
    from pipeline.runner import ingest, materialize_shard

    bench, _ = tiny_bench
    root = tmp_path_factory.mktemp("store")
    inst = dg.DagsterInstance.ephemeral()
    store, enc = StoreResource(root=str(root)), EncoderResource(checkpoint=str(tiny_videomae))
    for name in ("ar", "tad", "ad", "privacy", "bias_f", "gait"):
        for key in ingest(inst, store, name, str(bench / name / "manifest.csv"), 64):
            assert materialize_shard(inst, key, store, enc).success
    return root


@pytest.fixture(scope="session")
def run_baseline(tiny_videomae):
    """Materialise one pixel baseline's latents (tiny encoder) in a store; returns its metadata values."""
    import dagster as dg

    from assets.resources import EncoderResource, StoreResource
    from pipeline.runner import run_baselines

    def run(root, name, mask_source="none", datasets=()):
        return run_baselines(dg.DagsterInstance.ephemeral(), StoreResource(root=str(root)),
                             EncoderResource(checkpoint=str(tiny_videomae)), [name], mask_source=mask_source,
                             datasets=datasets, log=None)[name]

    return run
