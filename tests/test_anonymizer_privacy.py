"""What the anonymizer removes, measured label-free (diagnostics) and by attackers; the oracle's quarantine;
the appearance projection stage; the guarantee that training never reads a private-attribute label."""
import shutil

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from splavu_core.aam.appearance_projection import apply_projection, fit_projection
from splavu_core.aam.diagnostics import heldout_split, pair_matching_report
from splavu_core.store import ledger
from splavu_core.store.feature_store import FeatureStore

SMALL = dict(epochs=3, batch=64, pretrain_head_epochs=2, lr=3e-3, tasks=("ar",),
             adapter={"layers": 1, "heads": 2, "sub_tokens": 4, "token_width": 16, "projection_rank": 4},
             privacy="critic", pairs="both", diagnose_points=2, diagnose_steps=60)


def toy_videos(n=96, K=6, D=24, n_app=6, seed=0):
    """Appearance lives in the first n_app dims (per video, in static AND moving clips); actions elsewhere."""
    rng = np.random.default_rng(seed)
    app = np.zeros((n, D))
    app[:, :n_app] = rng.normal(0, 2, (n, n_app))
    labels = rng.integers(3, size=n)
    act = np.zeros((3, D))
    act[:, n_app:n_app + 3] = 3 * np.eye(3)
    static = app[:, None] + 0.2 * rng.normal(0, 1, (n, K, D))
    actions = [app[i] + act[labels[i]] + 0.2 * rng.normal(0, 1, (4, D)) for i in range(n)]
    return static.astype(np.float32), [a.astype(np.float32) for a in actions], labels


def test_projection_removes_what_static_clips_share_and_keeps_actions():
    static, actions, labels = toy_videos()
    clips, clip_labels = np.concatenate(actions), np.repeat(labels, 4)
    fit = fit_projection(static, rank=6, action_clips=clips, action_labels=clip_labels)
    projected = apply_projection(fit, clips)
    between = lambda x: np.cov(x.reshape(len(static), -1, x.shape[-1]).mean(1), rowvar=False).trace()  # noqa: E731
    assert between(apply_projection(fit, static.reshape(-1, static.shape[-1]))) < 0.05 * between(static)
    centres = np.stack([projected[clip_labels == c].mean(0) for c in range(3)])
    raw_centres = np.stack([clips[clip_labels == c].mean(0) for c in range(3)])
    # action separation survives (the appearance dims carried none of it)
    assert np.linalg.norm(centres[0] - centres[1]) == pytest.approx(np.linalg.norm(raw_centres[0] - raw_centres[1]), rel=0.15)
    with pytest.raises(AssertionError, match="rank"):
        fit_projection(static, rank=0)


def test_pair_matching_sees_identity_and_its_removal():
    static, actions, labels = toy_videos()
    fit_idx, held_idx = heldout_split(len(static), 0.4, minimum=32)
    assert not set(fit_idx) & set(held_idx) and len(held_idx) == 38
    raw = pair_matching_report(static, actions, fit_idx, held_idx, steps=150)
    clips = np.concatenate(actions)
    projection = fit_projection(static, 6, clips, np.repeat(labels, 4))
    after = pair_matching_report(static, actions, fit_idx, held_idx,
                                 transform=lambda x: apply_projection(projection, x), steps=150)
    assert raw["static_static"] > 0.9 and raw["static_action"] > 0.9      # one video's clips are easy to match
    assert after["static_static"] < 0.3 and after["static_action"] < 0.3   # chance 1/32 ~ 0.03


def _train(store, **over):
    from splavu_core.aam.io import adapter_version
    from splavu_core.aam.config import TrainConfig
    from splavu_core.aam.train import train_aam
    from splavu_core.aam.training_data import load_training_data

    adapter, acfg, summary = train_aam(load_training_data(store, tad=None, ad=None), TrainConfig.from_flat({**SMALL, **over}),
                                       log=None)
    return adapter, acfg, summary, adapter_version(adapter, acfg, store.encoder_fingerprint())


@pytest.fixture(scope="module")
def store_copy(tiny_store, tmp_path_factory):
    dst = tmp_path_factory.mktemp("label_free") / "store"
    shutil.copytree(tiny_store, dst)
    return FeatureStore(dst)


def flip_private_labels(root) -> int:
    """Flip every attr_* label of the store's manifests (a trainer that read any would train differently);
    returns how many manifests had such labels."""
    changed = 0
    for path in sorted((root / "labels").glob("*.parquet")):  # attr_* live in labels/ (issue 20)
        t = pq.read_table(path)
        cols = [c for c in t.column_names if c.startswith("attr_")]
        for c in cols:
            flipped = pa.array([None if x is None else 1 - x for x in t.column(c).to_pylist()], t.schema.field(c).type)
            t = t.set_column(t.schema.get_field_index(c), c, flipped)
        changed += bool(cols)
        pq.write_table(t, path)
    return changed


def test_training_never_reads_private_attribute_labels(store_copy):
    store = store_copy
    _, _, summary, v1 = _train(store)
    changed = flip_private_labels(store.root)
    assert changed >= 2, "the training datasets must carry attr_* labels for this test to mean anything"
    _, _, summary2, v2 = _train(store)
    assert v1 == v2, "the AAM version changed when only private-attribute labels changed"
    # the diagnostics ran and are in the summary
    d = summary["diagnostics"]
    assert set(d["raw"]) == {"chance", "group", "heldout", "static_static", "static_action"} and len(d["during"]) == 2
    assert summary["heldout_videos"] >= 6 and summary["projection"]["rank"] == 4


def test_oracle_is_refused_by_publish_and_promotion(store_copy):
    from splavu_core.aam.io import save_adapter
    from splavu_core.aam.config import TrainConfig
    from splavu_core.aam.train import train_aam
    from splavu_core.aam.training_data import TrainingDataError, load_oracle_labels, load_training_data
    from splavu_core.publish.anonymized_tables import anonymize_shard
    from splavu_core.store.ledger import PublishError, record_version

    store = store_copy
    data = load_training_data(store, tad=None, ad=None)
    assert data.attributes is None and all(not k.startswith("attr_") for v in data.ar_train for k in v.meta)
    oracle = TrainConfig.from_flat({**SMALL, "oracle": True})
    with pytest.raises(TrainingDataError, match="oracle"):
        train_aam(data, oracle, log=None)
    adapter, acfg, _ = train_aam(load_oracle_labels(store, data), oracle, log=None)
    assert acfg.oracle
    from splavu_core.aam.io import adapter_version

    fp = store.encoder_fingerprint()
    version = adapter_version(adapter, acfg, fp)
    save_adapter(adapter, acfg, store.root / "aam" / version, fp)
    record_version(store, version, {"encoder_fingerprint": fp, "config": acfg.to_dict()}, make_current=False)
    with pytest.raises(PublishError, match="oracle"):
        anonymize_shard(store, "ar-000", store.root / "aam" / version)
    from splavu_core.evaluation.gates import evaluate_gates

    ok, why = evaluate_gates(store, version, privacy_threshold=-1.0, record=False)["privacy"]
    assert not ok and "oracle" in why


def test_budget_gates_on_the_weaker_of_closeups_and_action_clips():
    closeups = {"leakage_removed": 0.8, "raw_cmap": 0.9, "anonymized_cmap": 0.58, "chance_cmap": 0.5}
    clips = {"leakage_removed": 0.3, "raw_cmap": 0.8, "anonymized_cmap": 0.71, "chance_cmap": 0.5}
    ok, why = ledger.budget_verdict({**clips, "closeups": closeups, "clips": clips}, 0.5)
    assert not ok and "closeups: leakage removed 0.800 >= budget 0.5" in why and "clips: leakage removed 0.300 < " in why
    ok, why = ledger.budget_verdict({**closeups, "closeups": closeups, "clips": {"skipped": "no attr_* labels"}}, 0.5)
    assert ok and "action clips not measured (no attr_* labels)" in why


def test_adapter_with_projection_is_batch_invariant_and_exactly_identity_unfitted():
    from splavu_core.aam.model import AAMConfig, AnonymizingAdapter

    cfg = AAMConfig(dim=16, layers=1, heads=2, sub_tokens=4, token_width=8, projection_rank=3)
    a = AnonymizingAdapter(cfg)
    x = torch.randn(10, 16)
    assert torch.equal(a(x), x)  # zero buffers: the projection is the identity until fitted
    with torch.no_grad():
        a.projection.read.normal_(), a.projection.write.normal_()
    assert not torch.allclose(a(x), x)
    assert torch.allclose(a(x[:3]), a(x)[:3], atol=1e-6)
    assert "projection_rank" not in AAMConfig(dim=16, sub_tokens=4).to_dict()  # old adapters keep their version hash
