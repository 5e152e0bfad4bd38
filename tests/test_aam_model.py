"""AAM: exact identity at init, batch invariance, non-linearity, losses, safe content-addressed persistence."""
from __future__ import annotations

import ast
import json
import math
from pathlib import Path

import pytest
import torch

import splavu_core.aam.io as aam_io
from splavu_core.aam import (AAMConfig, AnonymizingAdapter, adapter_version, latent_consistency, load_adapter,
                             nt_xent, save_adapter)

torch.set_num_threads(1)

SMALL = dict(dim=48, layers=2, heads=4, sub_tokens=8, token_width=16)  # fast, same code paths as the default
VARIANTS = [dict(), dict(ffn=True), dict(clip_context=True), dict(ffn=True, clip_context=True)]
FP = "encoder-sha256:0123abcd"
PINNED_VERSION = "5d6fd6a884e4292e"  # computed once; see test_version_hash_is_pinned


def randomised(cfg: AAMConfig, seed: int = 0) -> AnonymizingAdapter:
    """A 'trained-looking' adapter: every Linear (the zero-initialised projections included) gets
    PyTorch's default random init and the LayerNorms are perturbed, so the identity at init cannot
    make a test pass vacuously."""
    torch.manual_seed(seed)
    m = AnonymizingAdapter(cfg)
    with torch.no_grad():
        for mod in m.modules():
            if isinstance(mod, torch.nn.Linear):
                mod.reset_parameters()
            elif isinstance(mod, torch.nn.LayerNorm):
                mod.weight.add_(0.1 * torch.randn_like(mod.weight))
                mod.bias.add_(0.1 * torch.randn_like(mod.bias))
    return m


def assert_close(got: torch.Tensor, want: torch.Tensor, atol: float):
    # not torch.testing.assert_close: its first call imports torch._dynamo (>1 s)
    assert got.shape == want.shape, f"shape {tuple(got.shape)} != {tuple(want.shape)}"
    err = (got - want).abs().max().item()
    assert err <= atol, f"max abs difference {err:.3g} > {atol}"


def padded_batch(video: torch.Tensor, at: int, lengths: list[int], t_max: int, seed: int, fill=float("nan")):
    """Put `video` (T, D) at batch index `at` among random videos of the given lengths; padding = `fill`."""
    g = torch.Generator().manual_seed(seed)
    x = torch.full((len(lengths), t_max, video.shape[1]), fill)
    mask = torch.zeros(len(lengths), t_max, dtype=torch.bool)
    for i, n in enumerate(lengths):
        x[i, :n] = video if i == at else torch.randn(n, video.shape[1], generator=g) * 3
        mask[i, :n] = True
    assert lengths[at] == len(video)
    return x, mask


# ---------------------------------------------------------------- config

def test_config_validation_and_roundtrip():
    cfg = AAMConfig(dim=192)
    assert (cfg.layers, cfg.heads, cfg.sub_tokens, cfg.token_width, cfg.ffn, cfg.clip_context) == (3, 8, 8, 64, False, False)
    assert AAMConfig.from_dict(json.loads(json.dumps(cfg.to_dict()))) == cfg
    with pytest.raises(ValueError, match=r"sub_tokens=8 must divide dim=190"):
        AAMConfig(dim=190)
    with pytest.raises(ValueError, match=r"heads=6 must divide token_width=64"):
        AAMConfig(dim=192, heads=6)
    with pytest.raises(TypeError, match="ffn"):
        AAMConfig(dim=192, ffn=1)
    with pytest.raises(ValueError, match="unknown keys"):
        AAMConfig.from_dict({**cfg.to_dict(), "dropout": 0.1})



def test_centroids_read_from_adapters_stored_as_classes_and_their_version_is_unchanged():
    """AAMConfig.classes was renamed centroids: adapter.json files written before hold "classes". Reading accepts both
    names, writing uses the new one, and the content hash reads the name before, so no version id changes."""
    cfg = AAMConfig(dim=32, keep=8, layers=0, mixer="mlp", recentre=True, centroids=5)
    stored_before = {**{k: v for k, v in cfg.to_dict().items() if k != "centroids"}, "classes": 5}
    assert "centroids" in cfg.to_dict() and "classes" not in cfg.to_dict()
    assert AAMConfig.from_dict(stored_before) == cfg
    assert cfg.to_dict(names_before=True) == stored_before
    with pytest.raises(ValueError, match="both"):
        AAMConfig.from_dict({**stored_before, "centroids": 5})
    adapter = AnonymizingAdapter(cfg)

    class StoredBefore:  # the config as an adapter.json written before the rename holds it
        def to_dict(self, names_before=False):
            return stored_before

    tensors = aam_io._state_tensors(adapter, cfg)
    assert adapter_version(adapter, cfg, "fp") == aam_io._content_hash(tensors, StoredBefore(), "fp")


BEFORE_RENAME = Path(__file__).parent / "data" / "adapter_before_rename"  # tests/data/README.md says how it was made


def test_an_adapter_saved_before_the_projection_was_renamed_loads_unchanged(tmp_path):
    """The appearance projection was called erasure (AAMConfig.erase_rank, the stage `erase.*`, TrainConfig erase_*, the
    summary key "erasure"); erasure now means only `splavu forget`. An adapter the code before the rename saved still
    loads under its recorded version and gives the same output; its training record reads under the names now (the
    unseen-task refit and the refit after `splavu forget` read it); saved again, it keeps its version."""
    from assets.aam import check_training_config
    from splavu_core.aam.config import TrainConfig
    from splavu_core.evaluation.unseen import closed_form_why_not, version_config
    from splavu_core.forget import _refit_config
    from splavu_core.store.feature_store import FeatureStore

    meta = json.loads((BEFORE_RENAME / "adapter.json").read_text())
    assert "erase_rank" in meta["config"] and "erase_fraction" in meta["extra"]["train_config"]  # the fixture is old
    adapter, cfg, loaded = load_adapter(BEFORE_RENAME)  # the content hash is checked against the recorded version
    assert cfg.projection_rank == 3 and adapter.projection is not None and loaded["version"] == meta["version"]
    expected = json.loads((BEFORE_RENAME / "expected_output.json").read_text())
    x = torch.linspace(-1, 1, 32).reshape(2, 16)
    with torch.no_grad():
        assert torch.allclose(adapter(x), torch.tensor(expected["output"]), atol=1e-6)
    assert "projection_rank" in cfg.to_dict() and "erase_rank" not in cfg.to_dict()  # written under the name now
    assert save_adapter(adapter, cfg, tmp_path / "again", meta["encoder_fingerprint"]) == meta["version"]
    assert "projection.read" in load_adapter(tmp_path / "again")[0].state_dict()

    tc = TrainConfig.from_flat(meta["extra"]["train_config"])
    assert (tc.projection.projection_fraction, tc.projection.projection_w_temporal) == (0.2, 0.5)
    assert tc.adapter["projection_rank"] == 3 and "erase_rank" not in tc.adapter
    store = FeatureStore(tmp_path / "store")
    store.files.write_json(f"aam/{meta['version']}/adapter.json", meta)
    refit = _refit_config(store, meta["version"])  # the run config `forget` hands aam_model
    assert refit["projection_fraction"] == 0.2 and refit["projection_rank"] == 3 and "erase_rank" not in refit
    check_training_config(refit)
    assert version_config(store, meta["version"]).adapter["projection_rank"] == 3
    assert "projection_rank=3" in closed_form_why_not(store, meta["version"])

def test_bad_inputs_are_refused_at_the_boundary():
    m = AnonymizingAdapter(AAMConfig(**SMALL))
    with pytest.raises(AssertionError, match="D=48"):
        m(torch.randn(4, 40))
    with pytest.raises(AssertionError, match="mask must be bool"):
        m(torch.randn(2, 3, 48), torch.ones(2, 3))
    with pytest.raises(AssertionError, match="at least one real"):
        m(torch.randn(2, 3, 48), torch.tensor([[True, False, False], [False, False, False]]))


# ---------------------------------------------------------------- (a) identity at init

@pytest.mark.parametrize("variant", VARIANTS)
def test_fresh_adapter_is_exact_identity(variant):
    torch.manual_seed(1)
    m = AnonymizingAdapter(AAMConfig(dim=192, **variant))  # the shipped default size
    x = torch.randn(3, 5, 192) * 4
    mask = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 0, 0, 0], [1, 0, 0, 0, 0]], dtype=torch.bool)
    assert_close(m(x), x, atol=1e-6)
    assert_close(m(x, mask), x, atol=1e-6)
    lone = torch.randn(7, 192)
    assert_close(m(lone), lone, atol=1e-6)
    # ...and it is the zero-initialised projections that make it so: the randomised one moves x
    assert (randomised(AAMConfig(dim=192, **variant))(lone) - lone).abs().max() > 0.1


# ---------------------------------------------------------------- (b) batch invariance

@pytest.mark.parametrize("variant", VARIANTS)
def test_video_output_is_batch_invariant(variant):
    cfg = AAMConfig(**SMALL, **variant)
    m = randomised(cfg)
    video = torch.randn(5, cfg.dim) * 2
    with torch.no_grad():
        alone = m(video[None])[0]  # (5, D), no mask
        assert (alone - video).abs().max() > 0.1, "randomised adapter must not be the identity"
        for at, lengths, t_max, seed in [(1, [3, 5, 9], 9, 0), (0, [5, 1], 7, 1), (3, [8, 2, 6, 5, 4], 12, 2)]:
            x, mask = padded_batch(video, at, lengths, t_max, seed)
            y = m(x, mask)
            assert_close(y[at, :5], alone, atol=1e-5)
            # padding comes back untouched (here NaN) and never leaks into real clips
            assert torch.isnan(y[~mask]).all() and torch.isfinite(y[mask]).all()


@pytest.mark.parametrize("variant", VARIANTS)
def test_lone_clip_output_is_batch_invariant(variant):
    cfg = AAMConfig(**SMALL, **variant)
    m = randomised(cfg, seed=3)
    clips = torch.randn(4, cfg.dim)
    others = torch.randn(60, cfg.dim) * 5
    with torch.no_grad():
        alone = m(clips)
        mixed = m(torch.cat([others[:17], clips[:2], others[17:], clips[2:]]))
        assert_close(mixed[17:19], alone[:2], atol=1e-5)
        assert_close(mixed[-2:], alone[2:], atol=1e-5)
        assert_close(m(clips[:, None])[:, 0], alone, atol=1e-5)  # (N, D) == (N, 1, D)


def test_clip_context_uses_own_video_only_when_enabled():
    video = torch.randn(6, 48)
    other = video.clone()
    other[3:] = torch.randn(3, 48)  # same first 3 clips, different rest of the video
    with torch.no_grad():
        per_clip = randomised(AAMConfig(**SMALL))
        assert_close(per_clip(video[None])[0, :3], per_clip(other[None])[0, :3], atol=1e-5)
        ctx = randomised(AAMConfig(**SMALL, clip_context=True))
        assert (ctx(video[None])[0, :3] - ctx(other[None])[0, :3]).abs().max() > 1e-2


# ---------------------------------------------------------------- (c) non-linear for lone clips

def _nonlinearity(m, a, b):
    """|d(a+b) - d(a) - d(b) + d(0)| / |d(a+b)| per clip, d(x) = f(x) - x: 0 for an affine adapter."""
    with torch.no_grad():
        d = lambda x: m(x) - x  # noqa: E731
        gap = d(a + b) - d(a) - d(b) + d(torch.zeros_like(a))
        return (gap.norm(dim=1) / d(a + b).norm(dim=1).clamp(min=1e-12)).min().item(), gap.abs().max().item()


def test_nonlinear_for_lone_clips():
    torch.manual_seed(5)
    a, b = torch.randn(16, 48), torch.randn(16, 48)
    assert _nonlinearity(AnonymizingAdapter(AAMConfig(**SMALL)), a, b)[1] < 1e-6  # identity is linear: measure is sound
    assert _nonlinearity(randomised(AAMConfig(**SMALL)), a, b)[0] > 0.05
    a, b = torch.randn(16, 192), torch.randn(16, 192)
    assert _nonlinearity(randomised(AAMConfig(dim=192)), a, b)[0] > 0.05


@pytest.mark.parametrize("variant", [dict(), dict(ffn=True, clip_context=True)])
def test_gradients_reach_every_parameter(variant):
    cfg = AAMConfig(**SMALL, **variant)
    m = randomised(cfg)
    x = torch.randn(4, 3, cfg.dim)
    mask = torch.tensor([[1, 1, 1], [1, 1, 0], [1, 0, 0], [1, 1, 1]], dtype=torch.bool)
    (-nt_xent(m(x, mask)[:, 0], m(x, mask)[:, 1] + 0.1) + latent_consistency(x, m(x, mask), mask)).backward()
    dead = [n for n, p in m.named_parameters() if p.grad is None or not torch.isfinite(p.grad).all() or p.grad.abs().max() == 0]
    assert not dead, f"no (finite) gradient for {dead}"


def test_fresh_adapter_leaves_identity_after_one_step():
    m = AnonymizingAdapter(AAMConfig(**SMALL))
    s1, s2 = torch.randn(8, 48), torch.randn(8, 48)
    (-nt_xent(m(s1), m(s2))).backward()
    assert m.out.weight.grad.abs().max() > 0  # the zero-init projection still receives gradient
    with torch.no_grad():  # one plain SGD step (torch.optim's first step imports torch._dynamo: slow)
        for p in m.parameters():
            p -= 0.1 * p.grad
    assert (m(s1) - s1).abs().max() > 1e-4


# ---------------------------------------------------------------- losses

def test_nt_xent_hand_computed_n2_2d():
    tau = 0.5
    z1 = torch.tensor([[1.0, 0.0], [0.0, 1.0]])
    z2 = torch.tensor([[3.0, 4.0], [0.0, -2.0]])  # unit: (0.6, 0.8), (0, -1)
    e = math.exp
    anchors = [  # -pos/tau + log(sum over the 3 others of exp(cos/tau)); cosines worked out by hand
        -0.6 / tau + math.log(e(0.6 / tau) + e(0.0) + e(0.0)),          # z1[0]: pos z2[0]; negs z1[1], z2[1]
        1.0 / tau + math.log(e(-1.0 / tau) + e(0.0) + e(0.8 / tau)),    # z1[1]: pos z2[1]; negs z1[0], z2[0]
        -0.6 / tau + math.log(e(0.6 / tau) + e(0.8 / tau) + e(-0.8 / tau)),  # z2[0]: pos z1[0]; negs z1[1], z2[1]
        1.0 / tau + math.log(e(-1.0 / tau) + e(0.0) + e(-0.8 / tau)),   # z2[1]: pos z1[1]; negs z1[0], z2[0]
    ]
    got = nt_xent(z1, z2, temperature=tau)
    assert abs(got.item() - sum(anchors) / 4) < 1e-5
    assert abs(nt_xent(z2, z1, temperature=tau).item() - got.item()) < 1e-5  # symmetric
    assert abs(nt_xent(7 * z1, z2, temperature=tau).item() - got.item()) < 1e-5  # cosine: scale-free


def test_nt_xent_orders_and_differentiates():
    e = torch.eye(4)
    assert nt_xent(e[:2], e[:2].clone()) < nt_xent(e[:2], e[2:])  # identical vs exactly orthogonal pairs
    torch.manual_seed(0)
    z = torch.randn(16, 32)
    assert nt_xent(z, z + 0.01 * torch.randn(16, 32)) < nt_xent(z, torch.randn(16, 32))
    z1 = z.clone().requires_grad_()
    nt_xent(z1, torch.randn(16, 32)).backward()
    assert torch.isfinite(z1.grad).all() and z1.grad.abs().max() > 0


def test_latent_consistency():
    torch.manual_seed(0)
    h, h2 = torch.randn(3, 4, 8), torch.randn(3, 4, 8)
    assert torch.isclose(latent_consistency(h, h2), ((h - h2) ** 2).mean())
    mask = torch.tensor([[1, 1, 0, 0], [1, 0, 0, 0], [1, 1, 1, 1]], dtype=torch.bool)
    h2n = h2.clone().requires_grad_()
    hn = torch.where(mask[..., None], h, float("nan"))  # padding holds NaN
    loss = latent_consistency(hn, h2n, mask)
    assert torch.isclose(loss, ((h - h2)[mask] ** 2).mean())
    loss.backward()
    assert torch.isfinite(h2n.grad).all() and (h2n.grad[~mask] == 0).all()


# ---------------------------------------------------------------- persistence

def test_save_load_roundtrip_same_outputs_and_version(tmp_path):
    cfg = AAMConfig(**SMALL, clip_context=True)
    m = randomised(cfg)
    v = save_adapter(m, cfg, tmp_path / "aam", FP, extra={"val_acc": 0.91})
    assert len(v) == 16 and v == adapter_version(m, cfg, FP)
    m2, cfg2, meta = load_adapter(tmp_path / "aam")
    assert cfg2 == cfg and meta["version"] == v and meta["extra"] == {"val_acc": 0.91} and meta["encoder_fingerprint"] == FP
    assert adapter_version(m2, cfg2, FP) == v
    x = torch.randn(3, 4, cfg.dim)
    with torch.no_grad():
        assert torch.equal(m(x), m2(x))
    assert sorted(p.name for p in (tmp_path).iterdir()) == ["aam"]  # no temp dirs left behind
    # extra metadata is outside the hash; overwriting in place keeps the directory loadable
    assert save_adapter(m, cfg, tmp_path / "aam", FP, extra={"val_acc": 0.5, "note": "re-saved"}) == v
    assert load_adapter(tmp_path / "aam")[2]["extra"]["note"] == "re-saved"
    assert sorted(p.name for p in (tmp_path / "aam").iterdir()) == ["adapter.json", "adapter.safetensors"]


def test_version_tracks_weights_config_and_encoder():
    cfg = AAMConfig(**SMALL)
    m = randomised(cfg)
    v = adapter_version(m, cfg, FP)
    assert adapter_version(m, cfg, "other-encoder") != v
    with torch.no_grad():
        m.blocks[1].sub_attn.qkv.weight[3, 5] += 1e-3
    assert adapter_version(m, cfg, FP) != v
    fresh = AnonymizingAdapter(AAMConfig(**SMALL, ffn=True))
    with pytest.raises(ValueError, match="built with"):
        adapter_version(fresh, cfg, FP)


def test_version_hash_is_pinned():
    """The hashing scheme is part of the store's format: every process (random PYTHONHASHSEED, any
    run) must give this exact value, or all stored adapters would silently change version."""
    tensors = {"b.weight": torch.arange(6, dtype=torch.float32).reshape(2, 3), "a.bias": torch.tensor([0.5, -1.0])}
    cfg = AAMConfig(dim=16, sub_tokens=4)
    v = aam_io._content_hash(tensors, cfg, FP)
    assert v == aam_io._content_hash(dict(reversed(list(tensors.items()))), cfg, FP)  # insertion order is irrelevant
    assert v == PINNED_VERSION, f"hash scheme changed: {v}"


def test_tampered_or_corrupted_adapter_is_refused(tmp_path):
    cfg = AAMConfig(**SMALL)
    d = tmp_path / "aam"
    save_adapter(randomised(cfg), cfg, d, FP)
    w, j = d / "adapter.safetensors", d / "adapter.json"
    good_w, good_j = w.read_bytes(), j.read_text()

    raw = bytearray(good_w)
    raw[-5] ^= 0x40  # flip one bit of the last tensor's data
    w.write_bytes(bytes(raw))
    with pytest.raises(ValueError, match=r"does not match the recorded version.*corrupted or was edited"):
        load_adapter(d)
    w.write_bytes(good_w[: len(good_w) // 2])  # truncated
    with pytest.raises(ValueError, match=r"adapter\.safetensors: unreadable safetensors file"):
        load_adapter(d)
    w.write_bytes(good_w)

    for key, value in [("encoder_fingerprint", "someone-else"), ("config", {**cfg.to_dict(), "token_width": 32})]:
        j.write_text(json.dumps({**json.loads(good_j), key: value}))
        with pytest.raises(ValueError, match="does not match the recorded version"):
            load_adapter(d)
    j.write_text(good_j[:-3])
    with pytest.raises(ValueError, match=r"adapter\.json: not valid JSON"):
        load_adapter(d)
    j.write_text(good_j)
    load_adapter(d)  # restored files load again

    w.unlink()
    with pytest.raises(FileNotFoundError, match=r"missing: .*aam/adapter\.safetensors"):
        load_adapter(d)
    with pytest.raises(FileNotFoundError, match=r"missing: .*nowhere/adapter\.json"):
        load_adapter(tmp_path / "nowhere")


def test_crash_during_save_leaves_nothing(tmp_path, monkeypatch):
    cfg = AAMConfig(**SMALL)

    def crash(path):
        raise OSError("disk gone")

    monkeypatch.setattr(aam_io, "_fsync", crash)  # both files written to the temp dir, then the "crash"
    with pytest.raises(OSError, match="disk gone"):
        save_adapter(randomised(cfg), cfg, tmp_path / "aam", FP)
    assert list(tmp_path.iterdir()) == []
    with pytest.raises(TypeError):  # non-JSON extra fails before anything touches the disk
        save_adapter(randomised(cfg), cfg, tmp_path / "aam2", FP, extra={"x": object()})
    assert list(tmp_path.iterdir()) == []


def test_aam_package_never_unpickles():
    """Adapters may come from anywhere: loading must never run pickle (torch.load, pickle, joblib...)."""
    for src in sorted(Path(aam_io.__file__).parent.glob("*.py")):
        for node in ast.walk(ast.parse(src.read_text())):
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
                assert (node.value.id, node.attr) != ("torch", "load"), f"torch.load in {src}"
            if isinstance(node, ast.ImportFrom):
                assert not (node.module == "torch" and any(a.name == "load" for a in node.names)), f"torch.load in {src}"
            imported = [a.name for a in node.names] + [getattr(node, "module", None) or ""] if isinstance(node, (ast.Import, ast.ImportFrom)) else []
            assert not any(m.split(".")[0] in ("pickle", "cPickle", "dill", "joblib") for m in imported), f"pickle import in {src}"
