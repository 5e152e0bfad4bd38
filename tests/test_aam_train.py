"""Training the AAM from cached latents: objectives, refusals, determinism, the Dagster asset."""
import dataclasses
import json
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from splavu_core.aam.config import TrainConfig
from splavu_core.aam.train import train_aam
from splavu_core.aam.training_data import TrainingData, TrainingDataError, check_data
from splavu_core.tasks.features import VideoFeatures

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
    return TrainConfig.from_flat({**base, **kw})


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
                                        projection_fraction=0.0, adapter={"layers": 1, "heads": 2, "sub_tokens": 4,
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

    from splavu_core.aam.training_data import load_training_data
    from splavu_core.store.feature_store import FeatureStore

    copy = tmp_path / "store"
    shutil.copytree(tiny_store, copy)
    with pytest.raises(TrainingDataError, match="not registered"):
        load_training_data(FeatureStore(copy), ar="nope")
    shutil.rmtree(copy / "latents" / "tad-000")
    with pytest.raises(TrainingDataError, match=r"missing the latents of shard\(s\) \['tad-000'\]"):
        load_training_data(FeatureStore(copy))


def test_other_encoder_latents_are_refused(tiny_store, tmp_path):
    import shutil

    from splavu_core.aam.training_data import load_training_data
    from splavu_core.store.feature_store import FeatureStore, StoreError

    copy = tmp_path / "store"
    shutil.copytree(tiny_store, copy)
    meta = json.loads((copy / "store.json").read_text())
    meta["encoder_fingerprint"] = "videomae-someoneelse"
    (copy / "store.json").write_text(json.dumps(meta))
    with pytest.raises(StoreError, match="was written by encoder"):
        load_training_data(FeatureStore(copy))


ASSET_SCRIPT = """
import sys, json, dagster as dg
import splavu_core.extract.encoders.vfm as vfm
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
    assert re.fullmatch(r"keep fit, k = 11 of \d+ directions, each video recentred on its clips' expected "
                        r"clusters among \d+, then \d+ parameters trained, selected epoch [12]", md["fit"]), md["fit"]
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
    assert re.fullmatch(rf"closed-form keep fit, k = 11 of {dim} directions, each video recentred on its clips' "
                        r"expected clusters among \d+, no training loop", md["fit"].value), md["fit"].value
    assert not {"final_losses", "loss_curves", "loss_curves_path", "selected_epoch", "parameters", "train_seconds",
                "lc_loss"} & set(md)
    assert isinstance(md["fit_seconds"], dg.FloatMetadataValue) and md["fit_seconds"].value > 0
    assert md["published_width"].value == 11 and md["keep_tasks"].value == "ar, tad, ad"
    spectrum = [r.data for r in md["keep_spectrum"].records]
    assert [r["kept"] for r in spectrum] == [True] * 11 + [False] * 12  # k kept, then the k + 1 largest dropped
    ratios = [r["utility_ratio"] for r in spectrum]
    assert ratios == sorted(ratios, reverse=True)
    assert md["keep_smallest_kept_ratio"].value == ratios[10] and md["keep_largest_dropped_ratio"].value == ratios[11]
    pm = {r.data["pairs"]: r.data for r in md["pair_matching"].records}
    assert set(pm) == {"static↔static", "static↔action"}
    assert md["pair_matching_static_static_raw"].value > md["pair_matching_chance"].value  # measured, not a stub
    assert not (copy / "aam" / md["version"].value / "loss_curves.png").exists()


def test_default_adapter_fit_reads_no_static_clip_beyond_the_diagnostics(tiny_store):
    """Why the demo extracts K = 4 static clips per training video, not 10: the default (keep) adapter is fitted
    from utility labels; its weights are the same whether it sees 10 static clips per video, 4, or 2 (only the
    pair-matching diagnostics, which draw 2 of K, read them). So the headline figures cannot depend on K."""
    from splavu_core.aam.training_data import load_training_data
    from splavu_core.store.feature_store import FeatureStore

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


# ---------------------------------------------------------------- the configuration: sections, flat names, records

# TrainConfig's fields and defaults as stored before the sections and before the appearance projection's fields were
# renamed (adapter.json's extra.train_config, the ablation records and their cache keys): flat(names_before=True) must
# keep writing exactly this, so cache keys still match, and from_flat must read it back
FLAT_RECORD = {
    "tasks": ("ar", "tad", "ad"), "w_lc": 1.0, "w_ar": 1.0, "w_tad": 1.0, "w_ad": 1.0, "w_b": 1.0, "temperature": 0.1,
    "lr": 1e-3, "head_lr": 1e-3, "epochs": 30, "batch": 128, "pretrain_head_epochs": 30, "seed": 0,
    "selection": "val_ar", "adapter": {"keep": 11, "layers": 0, "mixer": "mlp", "recentre": True},
    "privacy": "critic", "pairs": "both", "critic_steps": 2, "critic_hidden": 256, "critic_lr": 1e-3,
    "erase_fraction": 0.0, "erase_w_action": 1.0, "erase_w_temporal": 0.0, "keep_w_motion": 1.0, "keep_w_app": 0.0,
    "keep_app_within": False,
    "keep_tad_phases": 3, "keep_w_dynamic": 0.0, "keep_ridge": 0.3, "recentre_quantile": 0.95,
    "recentre_on": "clips", "recentre_cluster_clips": 50,
    "heldout_fraction": 0.2, "diagnose_points": 4, "diagnose_steps": 300, "oracle": False,
    "operating_point": "rule", "recentre_restarts": 4, "recentre_min_people": 5}


def test_flat_names_route_to_their_section_and_the_record_keeps_its_layout():
    from splavu_core.evaluation.suite import config_key

    cfg = TrainConfig()
    assert cfg.flat(names_before=True) == FLAT_RECORD
    assert config_key(cfg.flat(names_before=True)) == config_key(FLAT_RECORD)
    renamed = {"erase_fraction": "projection_fraction", "erase_w_action": "projection_w_action",
               "erase_w_temporal": "projection_w_temporal"}
    assert cfg.flat() == {renamed.get(k, k): v for k, v in FLAT_RECORD.items()}  # what a new record holds
    assert TrainConfig.from_flat(FLAT_RECORD) == cfg  # a stored record reads back as the config it came from
    assert TrainConfig.from_flat(cfg.flat()) == cfg
    c = TrainConfig.from_flat({"epochs": 5, "w_lc": 10.0, "keep_ridge": 0.1, "projection_fraction": 0.5})
    assert (c.loop.epochs, c.loop.w_lc, c.keep_ridge, c.projection.projection_fraction) == (5, 10.0, 0.1, 0.5)
    with pytest.raises(ValueError, match=r"both \['erase_fraction'\] and their new names \['projection_fraction'\]"):
        TrainConfig.from_flat({"erase_fraction": 0.5, "projection_fraction": 0.5})
    assert c.replace(selection="last").loop == dataclasses.replace(c.loop, selection="last")
    with pytest.raises(ValueError, match=r"unknown training field\(s\) \['epoch'\]; valid: tasks, operating_point, seed"):
        TrainConfig.from_flat({"epoch": 5})


def test_the_dagster_config_shows_the_defaults_fields_first_and_labels_the_rest():
    from assets.aam import AAMTrainingConfig, check_training_config

    fields = AAMTrainingConfig.model_fields
    names = list(fields)
    assert names.index("keep_ridge") < names.index("projection_fraction") < names.index("epochs")
    assert names.index("recentre") < names.index("projection_rank") < names.index("hidden")
    assert fields["keep_ridge"].description.startswith("keep fit: shrinkage")  # the field's doc metadata
    assert fields["epochs"].description.startswith("[trained adapters only] ")
    assert fields["hidden"].description.startswith("adapter: [trained adapters only] ")
    assert fields["projection_w_action"].description.startswith("[appearance projection, off by default] ")
    assert not any(d.startswith("[") for n in names[:names.index("projection_fraction")]
                   if (d := fields[n].description))
    # the CLI's flat JSON, unchanged: each name lands in its section
    cfg = AAMTrainingConfig(epochs=7, w_lc=10.0, keep=11, keep_ridge=0.2, projection_w_temporal=0.5).train_config()
    assert (cfg.loop.epochs, cfg.loop.w_lc, cfg.adapter["keep"], cfg.keep_ridge,
            cfg.projection.projection_w_temporal) == (7, 10.0, 11, 0.2, 0.5)
    with pytest.raises(ValueError, match=r"unknown training field\(s\) \['projection_fraktion'\]"):
        check_training_config({"projection_fraktion": 0.5})
    # a name from before the rename is refused with the name now (stored records still read: test_aam_model.py)
    with pytest.raises(ValueError, match=r"\['erase_fraction', 'erase_rank'\] were renamed: use "
                                         r"\['projection_fraction', 'projection_rank'\]"):
        check_training_config({"erase_rank": 4, "erase_fraction": 0.5, "keep": 11})


def test_every_field_is_defined_once_and_each_consumer_takes_it_from_there():
    """TrainConfig is the one definition: each of its fields (but the diagnostic oracle) is in the Dagster config and
    the CLI's --config with the same default (a planned field unset, for the store's plan), in the stored record, and
    in docs/configuration.md with the same default; the adapter's fields are AAMConfig's, less what training derives."""
    from assets.aam import AAMTrainingConfig, check_training_config, dagster_description
    from splavu_core.aam.config import STORED_ADAPTER_BASE, record_fields, training_fields
    from splavu_core.aam.model import AAMConfig

    docs = (Path(__file__).parents[1] / "docs" / "configuration.md").read_text()
    documented = dict(re.findall(r"^\| `(\w+)` \| `[^`]+` \| ([^|]+) \|", docs.split("## Training configuration")[1], re.M))
    dagster = AAMTrainingConfig.model_fields
    default, record = TrainConfig(), TrainConfig().flat()
    offered = [(s, f) for s, f in training_fields() if not f.metadata.get("diagnostic")]
    for section, f in offered:
        planned = "planned" in f.metadata
        assert dagster[f.name].default == (None if planned else f.default), f.name
        assert dagster[f.name].description == dagster_description(section, f), f.name
        check_training_config({f.name: dagster[f.name].default})  # --config takes it by name, at its default
        value = default.value(f.name)
        if f.metadata.get("adapter"):  # stored in the record's `adapter` unless at AAMConfig's own default
            assert record["adapter"].get(f.name, STORED_ADAPTER_BASE[f.name]) == value, f.name
        else:
            assert record[f.name] == value, f.name
        shown = f"`{json.dumps(list(f.default))}`" if isinstance(f.default, tuple) else \
            "unset" if f.default is None else f"`{f.default}`"
        assert documented.pop(f.name).strip() == shown, f.name
    assert not documented  # the page lists no field the definition lacks
    assert set(dagster) == {f.name for _, f in offered} | {"ar_dataset", "tad_dataset", "ad_dataset"}
    assert TrainConfig.from_flat(record) == default
    derived = {"dim", "centroids", "recentre_clips", "oracle"}  # training sets these (oracle: the diagnostic's)
    assert {f.name for _, f in offered if f.metadata.get("adapter")} == \
        {f.name for f in dataclasses.fields(AAMConfig)} - derived
    assert AAMTrainingConfig().train_config() == default.replace(tasks=())  # tasks unset: planned per store
    # a record read back as a run config (the refit after `splavu forget`) is what was fitted, the adapter's fields it
    # leaves out at AAMConfig's defaults too
    fitted = default.replace(recentre=False, keep=0, mixer="attention", layers=2, projection_rank=0)
    stored = fitted.flat()
    assert {"recentre", "keep", "mixer"}.isdisjoint(stored["adapter"])
    run = {k: v for k, v in record_fields(stored).items() if k != "oracle"}
    check_training_config(run)
    assert AAMTrainingConfig(**run).train_config() == fitted


def test_the_default_adapter_reads_no_loop_or_projection_fit_field():
    """Every field of the projection and loop sections but the projection's switch changed: the default adapter's weights
    and version stay; a field of its own (keep_ridge) changes them."""
    from splavu_core.aam.io import adapter_version
    from splavu_core.aam.config import training_fields

    other = {"selection": "last", "epochs": 1, "batch": 7, "lr": 0.5, "head_lr": 0.5, "pretrain_head_epochs": 1,
             "w_lc": 3.0, "w_ar": 0.0, "w_tad": 0.0, "w_ad": 0.0, "w_b": 0.0, "privacy": "ntxent",
             "pairs": "static_static", "temperature": 1.0, "critic_steps": 1, "critic_hidden": 8, "critic_lr": 0.5,
             "diagnose_points": 1, "projection_w_action": 0.0, "projection_w_temporal": 1.0}
    assert set(other) == {f.name for s, f in training_fields() if s and not f.metadata.get("adapter")} - \
        {"projection_fraction", "oracle"}
    data = toy_data()
    base = TrainConfig.from_flat({"heldout_fraction": 0.0})

    def version(cfg):
        adapter, acfg, summary = train_aam(data, cfg, log=None)
        assert summary["keep"] is not None and not summary["history"]  # the closed-form default
        return adapter_version(adapter, acfg, "fingerprint")

    assert version(base.replace(**other)) == version(base) != version(base.replace(keep_ridge=0.01))


def test_the_default_fits_without_static_clips_and_what_reads_them_says_so():
    """Static clips (one frame repeated) cost an encoder pass each; the closed-form default reads none of them: the
    same weights with 4, 2 or no static clips per video (without them only its held-out diagnostic is skipped).
    A configuration that reads them (the appearance projection, the paper's loop) is refused, naming itself."""
    import dataclasses
    import hashlib

    def digest(adapter):
        h = hashlib.sha256()
        for k, v in sorted(adapter.state_dict().items()):
            h.update(k.encode() + v.detach().numpy().tobytes())
        return h.hexdigest()

    data = toy_data()
    weights = []
    for static in (data.static, data.static[:, :2], data.static[:0]):
        adapter, _, summary = train_aam(dataclasses.replace(data, static=static), TrainConfig(), log=None)
        weights.append(digest(adapter))
    assert weights[0] == weights[1] == weights[2] and summary["diagnostics"] is None
    for cfg, name in ((TrainConfig().replace(projection_fraction=0.25), "appearance projection"),
                      (small_cfg(), "privacy loss")):
        with pytest.raises(TrainingDataError, match=name):
            train_aam(dataclasses.replace(data, static=data.static[:0]), cfg, log=None)
