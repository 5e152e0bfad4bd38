"""Frozen encoders: loading each family with from_pretrained, preprocessing, fingerprints, sampling."""
import json
import shutil

import numpy as np
import pytest
import torch
from conftest import save_tiny_videomae

from splavu_core.extract.encoders.preprocess import Preprocess
from splavu_core.extract.encoders.vfm import DEMO_CHECKPOINT, EncoderError, load_encoder
from splavu_core.extract.sampling import ClipSampling


def clips(n=2, t=16, seed=0):
    return np.random.default_rng(seed).integers(0, 256, (n, t, 112, 112, 3), dtype=np.uint8)


def test_videomae_embeds_mean_of_last_hidden_state(tiny_videomae):
    enc = load_encoder(tiny_videomae, device="cpu")
    assert enc.family == "videomae" and enc.dim == 32 and enc.num_frames == 16
    x = clips()
    e = enc.embed(x)
    assert e.shape == (2, 32) and e.dtype == np.float32
    with torch.no_grad():
        ref = enc.model(pixel_values=enc.preprocess(x)).last_hidden_state.mean(1).numpy()
    np.testing.assert_allclose(e, ref, rtol=1e-5, atol=1e-6)


def test_vjepa2_uses_encoder_and_skips_predictor(tiny_vjepa2):
    enc = load_encoder(tiny_vjepa2, device="cpu")
    assert enc.family == "vjepa2" and enc.dim == 32
    # no processor config saved: family default resizes by 256/224 then centre-crops
    assert enc.preprocess.crop == 32 and enc.preprocess.short_side == int(32 * 256 / 224)
    e = enc.embed(clips())
    with torch.no_grad():
        ref = enc.model.encoder(pixel_values_videos=enc.preprocess(clips())).last_hidden_state.mean(1).numpy()
    np.testing.assert_allclose(e, ref, rtol=1e-4, atol=1e-5)


def test_preprocess_follows_processor_config(tiny_videomae):
    pre = Preprocess.for_checkpoint(tiny_videomae, "videomae", 224)
    assert (pre.short_side, pre.crop, pre.mean) == (32, 32, (0.5, 0.5, 0.5))
    frames = np.full((1, 2, 64, 96, 3), 255, np.uint8)
    x = pre(frames)
    assert x.shape == (1, 2, 3, 32, 32)
    assert torch.allclose(x, torch.ones_like(x))  # (1 - 0.5) / 0.5
    default = Preprocess.for_checkpoint(tiny_videomae.parent, "videomae", 224)  # no config there
    assert (default.short_side, default.crop, default.mean) == (224, 224, (0.485, 0.456, 0.406))


def test_fingerprint_is_stable_and_tracks_weights_config_and_sampling(tiny_videomae, tmp_path):
    s = ClipSampling()
    a, b = load_encoder(tiny_videomae, device="cpu"), load_encoder(tiny_videomae, device="cpu")
    assert a.fingerprint(s) == b.fingerprint(s)
    assert a.fingerprint(s) != a.fingerprint(ClipSampling(frame_step=2))
    other = save_tiny_videomae(tmp_path / "other", seed=1)  # same config, other weights
    assert load_encoder(other, device="cpu").fingerprint(s) != a.fingerprint(s)
    cfg_changed = tmp_path / "cfg"
    shutil.copytree(tiny_videomae, cfg_changed)
    pc = json.loads((cfg_changed / "preprocessor_config.json").read_text())
    pc["image_std"] = [0.25, 0.25, 0.25]
    (cfg_changed / "preprocessor_config.json").write_text(json.dumps(pc))
    assert load_encoder(cfg_changed, device="cpu").fingerprint(s) != a.fingerprint(s)


def test_bad_checkpoints_are_named(tmp_path):
    with pytest.raises(EncoderError, match="nope"):
        load_encoder(tmp_path / "nope", device="cpu")
    (tmp_path / "bert").mkdir()
    (tmp_path / "bert" / "config.json").write_text(json.dumps({"model_type": "bert"}))
    with pytest.raises(EncoderError, match="not supported"):
        load_encoder(tmp_path / "bert", device="cpu")


def test_demo_checkpoint_is_shipped_small_and_safetensors():
    files = {p.name: p.stat().st_size for p in DEMO_CHECKPOINT.iterdir()}
    assert "model.safetensors" in files and "config.json" in files and "preprocessor_config.json" in files
    assert not any(n.endswith((".bin", ".pt", ".pkl")) for n in files)
    assert sum(files.values()) < 20 * 2 ** 20
    enc = load_encoder(DEMO_CHECKPOINT, device="cpu")
    assert enc.embed(clips(1)).shape == (1, enc.dim)


@pytest.mark.parametrize("n_frames,fps,sampling,expect", [
    (48, 16, ClipSampling(), [(0, 16), (16, 32), (32, 48)]),
    (47, 16, ClipSampling(), [(0, 16), (16, 32)]),             # a partial clip is dropped
    (15, 16, ClipSampling(), []),
    (64, 16, ClipSampling(frame_step=2), [(0, 32), (32, 64)]),
    (120, 30, ClipSampling(target_fps=15), [(0, 32), (32, 64), (64, 96)]),  # step 2 at 30 fps
])
def test_clip_arithmetic(n_frames, fps, sampling, expect):
    spans = sampling.clips(n_frames, fps)
    assert [(s.start_frame, s.end_frame) for s in spans] == expect
    for s in spans:
        assert len(s.frames) == sampling.clip_len and s.frames[0] == s.start_frame and s.frames[-1] < s.end_frame


def test_static_frames_spread_uniformly():
    s = ClipSampling(static_k=10)
    idx = s.static_frames(100)
    assert len(idx) == 10 and idx[0] == 0 and idx[-1] == 99 and np.all(np.diff(idx) > 0)
    assert len(ClipSampling(static_k=0).static_frames(100)) == 0


def test_demo_encoder_training_resumes_from_a_saved_encoder_and_logs_v2_accuracies(tmp_path):
    """`train_demo --init` loads an encoder with from_pretrained, trains on the v2 world's classes
    (interactions included) and saves safetensors the pipeline can load."""
    import json

    from splavu_core.extract.encoders import train_demo
    from splavu_core.ingest.synth.figure import INTERACTIONS

    init = save_tiny_videomae(tmp_path / "init", image_size=112)
    out = tmp_path / "out"
    train_demo.main(["--out", str(out), "--init", str(init), "--steps", "2", "--batch", "4", "--pool", "8",
                     "--held", "12", "--refresh", "1", "--eval-every", "2", "--threads", "1"])
    assert set(INTERACTIONS) <= set(train_demo.CLASSES)
    log = json.loads((out / "training_log.json").read_text())
    entry = log["log"][-1]
    assert log["args"]["init"] == str(init) and entry["step"] == 2
    for k in ("heldout_action_top1", "heldout_interaction_top1", "heldout_motion_top1", "heldout_gait_abs_err"):
        assert k in entry
    assert (out / "model.safetensors").exists() and not list(out.glob("*.bin"))
    enc = load_encoder(out, device="cpu")
    assert enc.dim == 32 and enc.embed(clips(1)).shape == (1, 32)


def test_int8_extraction_is_opt_in_close_to_fp32_and_fingerprinted_apart(tiny_videomae):
    """`extract --quantize int8` loads the same checkpoint with int8 linear layers: its latents stay close to fp32 but
    are other latents, so the fingerprint (which keys a store's latents) differs; the checkpoint's weight hash does
    not. An unknown mode is refused by name."""
    s = ClipSampling()
    fp32, int8 = load_encoder(tiny_videomae, device="cpu"), load_encoder(tiny_videomae, device="cpu", quantize="int8")
    assert int8.weights_hash == fp32.weights_hash and int8.fingerprint(s) != fp32.fingerprint(s)
    assert int8.provenance(s)["quantize"] == "int8" and "quantize" not in fp32.provenance(s)
    assert any("quantized" in type(m).__module__ for m in int8.model.modules())
    assert not any("quantized" in type(m).__module__ for m in fp32.model.modules())  # the fp32 model is untouched
    a, b = fp32.embed(clips()), int8.embed(clips())
    cos = (a * b).sum(1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))
    assert not np.array_equal(a, b) and cos.min() > 0.98
    with pytest.raises(EncoderError, match="fp16"):
        load_encoder(tiny_videomae, device="cpu", quantize="fp16")
