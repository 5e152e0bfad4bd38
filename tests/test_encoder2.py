"""The second demo encoder (splavu_core/extract/encoders/train_action_encoder.py): actions + masked-video reconstruction, no
appearance, identity or gait head. A few CPU steps make a folder splavu's own loader reads; a resumed run is the
uninterrupted run, bit for bit; rendering in worker processes changes no clip; the shipped checkpoint is a bare
VideoMAEModel of another shape than the first encoder."""
import json

import numpy as np
import pytest
import torch

from splavu_core.extract.encoders import train_action_encoder as tae
from splavu_core.extract.encoders.vfm import DEMO_CHECKPOINT, load_encoder

TINY = ["--batch", "4", "--pool", "8", "--held", "6", "--refresh", "2", "--warmup", "2", "--log-every", "2",
        "--threads", "1", "--device", "cpu", "--save-every", "1000"]


def _state(out):
    from safetensors.torch import load_file

    return load_file(str(out / tae.STATE_DIR / "state.safetensors")), json.loads(
        (out / tae.STATE_DIR / "state.json").read_text())


def test_few_cpu_steps_make_an_encoder_splavu_loads(tmp_path):
    out = tmp_path / "enc"
    tae.main(["--out", str(out), "--steps", "2", "--eval-every", "2", *TINY])
    for name in ("config.json", "model.safetensors", "preprocessor_config.json", "training_log.json"):
        assert (out / name).is_file(), name
    log = json.loads((out / "training_log.json").read_text())
    assert log["selected"]["step"] == 2 and 0 <= log["selected"]["heldout_action_top1"] <= 1
    assert not any("appearance" in k or "gait" in k for e in log["log"] for k in e)  # nothing about the people
    enc = load_encoder(out, device="cpu")
    assert enc.family == "videomae" and enc.num_frames == 16 and enc.dim == 192
    assert enc.model.config.tubelet_size == 2 and enc.model.config.num_hidden_layers == 6
    frames, _ = tae._render(tae.clip_key(0, 9, 0))
    emb = enc.embed(frames[None])
    assert emb.shape == (1, 192) and np.isfinite(emb).all()


def test_resumed_run_equals_uninterrupted_run(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    common = ["--steps", "4", "--eval-every", "100", *TINY]
    tae.main(["--out", str(a), *common])
    tae.main(["--out", str(b), *common, "--stop-after", "2"])
    tb, mb = _state(b)
    assert mb["step"] == 2 and mb["total_steps"] == 4
    tae.main(["--out", str(b), *common, "--resume"])
    ta, ma = _state(a)
    tb, mb = _state(b)
    assert mb["step"] == ma["step"] == 4
    assert set(ta) == set(tb)
    assert [k for k in ta if not torch.equal(ta[k], tb[k])] == []  # model, optimizer, generators, pool: all equal
    assert ma["numpy_rng"] == mb["numpy_rng"] and ma["scheduler"] == mb["scheduler"]
    assert [e["loss_action"] for e in ma["train_log"]] == [e["loss_action"] for e in mb["train_log"]]


def test_render_workers_change_no_clip():
    dev = torch.device("cpu")
    pools = []
    for workers in (0, 2):
        r = tae.Renderer(workers, ahead=4)
        try:
            p = tae.RenderPool(5, 3, r, dev)
            p.refresh(2, np.random.default_rng(0))
            p.refresh(2, np.random.default_rng(1))
            pools.append(p)
        finally:
            r.close()
    assert np.array_equal(pools[0].frames, pools[1].frames) and np.array_equal(pools[0].action, pools[1].action)
    assert np.array_equal(pools[0].keys, pools[1].keys) and pools[0].next == pools[1].next == 9


def test_shipped_action_checkpoint_is_a_bare_videomae_of_another_shape():
    ckpt = tae.ACTION_CHECKPOINT
    if not (ckpt / "model.safetensors").is_file():
        pytest.skip("the second encoder is not shipped in this checkout")
    from safetensors import safe_open
    from transformers import VideoMAEModel

    cfg = json.loads((ckpt / "config.json").read_text())
    first = json.loads((DEMO_CHECKPOINT / "config.json").read_text())
    assert cfg["architectures"] == ["VideoMAEModel"]
    assert (cfg["tubelet_size"], cfg["num_hidden_layers"]) != (first["tubelet_size"], first["num_hidden_layers"])
    with safe_open(str(ckpt / "model.safetensors"), "pt") as f:
        keys = list(f.keys())
    assert keys and not [k for k in keys if k.startswith(("decoder", "head", "action", "encoder_to_decoder"))]
    model, info = VideoMAEModel.from_pretrained(ckpt, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"]
    enc = load_encoder(ckpt, device="cpu")
    first_enc = load_encoder(DEMO_CHECKPOINT, device="cpu")
    assert enc.dim == first_enc.dim == 192 and enc.weights_hash != first_enc.weights_hash
    log = json.loads((ckpt / "training_log.json").read_text())
    assert log["selected"]["heldout_action_top1"] == max(e["heldout_action_top1"] for e in log["log"])
