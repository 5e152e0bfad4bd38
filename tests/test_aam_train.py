"""Training the AAM from cached latents: objectives, refusals, determinism, the Dagster asset."""
import json
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from splavu_core.aam.train import TrainConfig, TrainingData, TrainingDataError, check_data, train_aam
from splavu_core.features import VideoFeatures

REPO = Path(__file__).resolve().parents[1]


def video(vid, split, feats, **meta):
    T = len(feats)
    return VideoFeatures(vid, split, feats.astype(np.float32), np.arange(T) * 1.0, np.arange(T) + 1.0, 16 * T, 16.0, meta)


def toy_data(D=32, seed=0) -> TrainingData:
    """Actions live in a temporal direction, identity in a static one (per video)."""
    rng = np.random.default_rng(seed)
    classes = ["a", "b", "c"]
    act = rng.normal(0, 1, (3, D))
    ids = lambda: rng.normal(0, 1, D)  # noqa: E731
    def ar(split, n):
        out = []
        for i in range(n):
            c = i % 3
            ident = ids()
            out.append(video(f"{split}{i}", split, act[c] + ident + 0.3 * rng.normal(0, 1, (3, D)), action=classes[c]))
        return out
    tad = []
    for i in range(8):
        f = rng.normal(0, 0.3, (10, D)) + ids()
        f[3:6] += act[i % 3]
        tad.append(video(f"tad{i}", "train", f, segments=[[3.0, 6.0, classes[i % 3]]]))
    ad = []
    for i in range(8):
        f = rng.normal(0, 0.3, (12, D)) + ids()
        if i % 2:
            f[4:7] += 2 * act[0]
        ad.append(video(f"ad{i}", "train", f, anomaly=i % 2))
    static = np.stack([ids()[None] + 0.05 * rng.normal(0, 1, (4, D)) for _ in range(24)]).astype(np.float32)
    return TrainingData(ar_train=ar("train", 30), ar_val=ar("val", 9), tad_train=tad, ad_train=ad, static=static,
                        classes=classes, tad_classes=classes, dim=D)


def small_cfg(**kw):
    base = dict(epochs=3, batch=32, pretrain_head_epochs=2, heldout_fraction=0.0,
                adapter={"layers": 1, "heads": 2, "sub_tokens": 4, "token_width": 16})
    return TrainConfig(**{**base, **kw})


def test_joint_step_moves_adapter_and_is_deterministic():
    data = toy_data()
    a1, cfg1, s1 = train_aam(data, small_cfg(), log=None)
    x = torch.from_numpy(data.ar_val[0].feats)
    assert not torch.allclose(a1(x), x), "training must move the adapter away from the identity"
    a2, _, s2 = train_aam(data, small_cfg(), log=None)
    assert all(torch.equal(p, q) for p, q in zip(a1.state_dict().values(), a2.state_dict().values()))
    assert {"lc", "ar", "tad", "ad", "privacy", "total"} <= set(s1["history"][0])
    assert s1["history"] == s2["history"]


def test_paper_privacy_term_is_maximised():
    """The paper's objective: with only the privacy term, the fixed-cosine NT-Xent of static pairs rises.
    (A rising NT-Xent is not privacy: tests/test_anonymizer_privacy.py measures what a fresh critic still matches.)"""
    data = toy_data()
    _, _, s = train_aam(data, small_cfg(tasks=(), w_lc=0.0, epochs=15, lr=3e-3, selection="last", privacy="ntxent",
                                        erase_fraction=0.0, adapter={"layers": 1, "heads": 2, "sub_tokens": 4,
                                                                     "token_width": 16, "mixer": "attention"}),
                        log=None)
    h = s["history"]
    assert h[-1]["privacy"] > 3 * h[0]["privacy"], [e["privacy"] for e in h]


def test_each_task_subset_trains_only_its_losses():
    data = toy_data()
    _, _, s = train_aam(data, small_cfg(tasks=("tad",), selection="last"), log=None)
    assert "tad" in s["history"][0] and "ar" not in s["history"][0] and "ad" not in s["history"][0]


def test_refusals_before_training():
    data = toy_data()
    for v in data.tad_train:
        v.meta["segments"] = None
    with pytest.raises(TrainingDataError, match="task 'tad' needs training videos with 'segments'"):
        check_data(data, small_cfg())
    data = toy_data()
    for v in data.ad_train:
        v.meta["anomaly"] = 0
    with pytest.raises(TrainingDataError, match="task 'ad' needs .* both anomaly labels"):
        train_aam(data, small_cfg(), log=None)
    data = toy_data()
    data.static = data.static[:, :1]
    with pytest.raises(TrainingDataError, match="static clips"):
        train_aam(data, small_cfg(), log=None)
    with pytest.raises(ValueError, match="unknown task"):
        TrainConfig(tasks=("pose",))


def test_missing_shards_and_unknown_datasets_are_refused(tiny_store, tmp_path):
    import shutil

    from splavu_core.aam.train import load_training_data
    from splavu_core.store import FeatureStore

    copy = tmp_path / "store"
    shutil.copytree(tiny_store, copy)
    with pytest.raises(TrainingDataError, match="not registered"):
        load_training_data(FeatureStore(copy), ar="nope")
    shutil.rmtree(copy / "latents" / "tad-000")
    with pytest.raises(TrainingDataError, match=r"missing the latents of shard\(s\) \['tad-000'\]"):
        load_training_data(FeatureStore(copy))


def test_other_encoder_latents_are_refused(tiny_store, tmp_path):
    import shutil

    from splavu_core.aam.train import load_training_data
    from splavu_core.store import FeatureStore, StoreError

    copy = tmp_path / "store"
    shutil.copytree(tiny_store, copy)
    meta = json.loads((copy / "store.json").read_text())
    meta["encoder_fingerprint"] = "videomae-someoneelse"
    (copy / "store.json").write_text(json.dumps(meta))
    with pytest.raises(StoreError, match="was written by encoder"):
        load_training_data(FeatureStore(copy))


ASSET_SCRIPT = """
import sys, json, dagster as dg
import splavu_core.encoders.vfm as vfm
def refuse(*a, **k):
    raise AssertionError("the encoder must never be loaded to train the AAM")
vfm.load_encoder = refuse
from assets.aam import aam_model
from assets.resources import StoreResource
res = dg.materialize([aam_model], resources={"store": StoreResource(root=sys.argv[1])}, run_config={"ops": {"aam_model": {"config": {
    "epochs": 2, "batch": 64, "layers": 1, "heads": 2, "sub_tokens": 4, "token_width": 16, "diagnose_steps": 50}}}})
md = res.asset_materializations_for_node("aam_model")[0].metadata
print(json.dumps({"version": md["version"].value, "parameters": md["parameters"].value,
                  "pm_keys": sorted(k for k in md if k.startswith("pair_matching")),
                  "pm": {k: v.value for k, v in md.items() if k.startswith("pair_matching_")},
                  "pm_table": [r.data for r in md["pair_matching"].records], "path_type": type(md["path"]).__name__,
                  "floats": sorted(k for k, v in md.items() if type(v).__name__ == "FloatMetadataValue"),
                  "png": md["loss_curves"].value[:40], "fit": md["fit"].value,
                  "transformers_imported": "transformers" in sys.modules}))
"""


def test_asset_trains_from_cached_latents_only(tiny_store, tmp_path):
    import shutil

    from splavu_core.aam.io import load_adapter

    copy = tmp_path / "store"
    shutil.copytree(tiny_store, copy)
    out = subprocess.run([sys.executable, "-c", ASSET_SCRIPT, str(copy)], cwd=REPO, capture_output=True, text=True,
                         env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin", "OMP_NUM_THREADS": "1"})
    assert out.returncode == 0, out.stderr[-3000:]
    md = json.loads(out.stdout.strip().splitlines()[-1])
    assert md["transformers_imported"] is False
    # the label-free diagnostics: what a fresh critic still matches, before and after, beside the objective
    assert {"pair_matching_static_static_raw", "pair_matching_static_static_after", "pair_matching_static_action_raw",
            "pair_matching_static_action_after", "pair_matching_chance"} <= set(md["pm_keys"])
    assert md["pm"]["pair_matching_static_static_raw"] > md["pm"]["pair_matching_chance"]  # the tiny encoder's clips match
    # the UI's truth: numbers as float metadata (charted across versions), tables as tables, paths as paths
    assert {"ar_loss", "lc_loss", "pair_matching_static_static_after", "train_seconds"} <= set(md["floats"])
    assert [r["pairs"] for r in md["pm_table"]] == ["static↔static", "static↔action"] and md["path_type"] == "PathMetadataValue"
    assert md["png"].startswith("![loss curves](data:image/png;base64,")
    assert re.fullmatch(r"keep fit, k = 14 of \d+ directions, each video recentred on its expected class among \d+, "
                        r"then \d+ parameters trained, selected epoch [12]", md["fit"]), md["fit"]
    d = copy / "aam" / md["version"]
    assert (d / "adapter.safetensors").is_file() and (d / "loss_curves.png").read_bytes()[:4] == b"\x89PNG"
    adapter, cfg, meta = load_adapter(d)
    assert meta["version"] == md["version"] and meta["encoder_fingerprint"] == json.loads((copy / "store.json").read_text())["encoder_fingerprint"]
    assert sum(p.numel() for p in adapter.parameters()) == md["parameters"]


def test_closed_form_asset_shows_its_fit_not_empty_losses(tiny_store, tmp_path):
    """The default (closed-form keep) adapter has no epochs: its metadata says what was fitted (width, the ranked
    utility ratios, fresh-critic pair matching before/after) and carries no loss table, loss plot or epoch."""
    import shutil

    import dagster as dg

    from assets.aam import aam_model
    from assets.resources import StoreResource

    copy = tmp_path / "store"
    shutil.copytree(tiny_store, copy)
    res = dg.materialize([aam_model], resources={"store": StoreResource(root=str(copy))},
                         run_config={"ops": {"aam_model": {"config": {"diagnose_steps": 50}}}})
    md = res.asset_materializations_for_node("aam_model")[0].metadata
    dim = md["input_width"].value
    assert re.fullmatch(rf"closed-form keep fit, k = 14 of {dim} directions, each video recentred on its expected "
                        r"class among \d+, no training loop", md["fit"].value), md["fit"].value
    assert not {"final_losses", "loss_curves", "loss_curves_path", "selected_epoch", "parameters", "train_seconds",
                "lc_loss"} & set(md)
    assert isinstance(md["fit_seconds"], dg.FloatMetadataValue) and md["fit_seconds"].value > 0
    assert md["published_width"].value == 14 and md["keep_tasks"].value == "ar, tad, ad"
    spectrum = [r.data for r in md["keep_spectrum"].records]
    assert [r["kept"] for r in spectrum] == [True] * 14 + [False] * 15  # k kept, then the k + 1 largest dropped
    ratios = [r["utility_ratio"] for r in spectrum]
    assert ratios == sorted(ratios, reverse=True)
    assert md["keep_smallest_kept_ratio"].value == ratios[13] and md["keep_largest_dropped_ratio"].value == ratios[14]
    pm = {r.data["pairs"]: r.data for r in md["pair_matching"].records}
    assert set(pm) == {"static↔static", "static↔action"}
    assert md["pair_matching_static_static_raw"].value > md["pair_matching_chance"].value  # measured, not a stub
    assert not (copy / "aam" / md["version"].value / "loss_curves.png").exists()


def test_default_adapter_fit_reads_no_static_clip_beyond_the_diagnostics(tiny_store):
    """Why the demo extracts K = 4 static clips per training video, not 10: the default (keep) adapter is fitted
    from utility labels; its weights are the same whether it sees 10 static clips per video, 4, or 2 (only the
    pair-matching diagnostics, which draw 2 of K, read them). So the headline figures cannot depend on K."""
    from splavu_core.aam.train import load_training_data
    from splavu_core.store import FeatureStore

    data = load_training_data(FeatureStore(tiny_store))
    K = data.static.shape[1]
    assert K >= 4
    cfg = TrainConfig(diagnose_steps=5)  # the default adapter and fit; short diagnostics (not what is compared)
    weights = []
    for k in (K, 4, 2):
        sub = TrainingData(**{**data.__dict__, "static": np.ascontiguousarray(data.static[:, :k])})
        adapter, _, summary = train_aam(sub, cfg, log=None)
        assert summary["keep"] is not None  # the default is the closed-form keep adapter
        weights.append({n: t.clone() for n, t in adapter.state_dict().items()})
    for w in weights[1:]:
        assert w.keys() == weights[0].keys() and all(torch.equal(w[n], weights[0][n]) for n in w)
