"""The research frontier's learned stage (benchmarks/frontier.py): seeded, resumable from its safetensors checkpoint,
and label-free: flipping every private label leaves it unchanged, while the oracle, which reads them, changes."""
import importlib.util
import shutil
import sys
from pathlib import Path

import pytest
import torch

from splavu_core.store.feature_store import FeatureStore
from test_anonymizer_privacy import flip_private_labels

REPO = Path(__file__).resolve().parents[1]
TASKS = ("ar", "tad")


@pytest.fixture(scope="module")
def frontier():
    spec = importlib.util.spec_from_file_location("frontier", REPO / "benchmarks" / "frontier.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules["frontier"] = mod  # dataclasses look their module up while the file runs
    spec.loader.exec_module(mod)
    return mod


def _fit(frontier, root, adversary="subjects", checkpoint=None, log=None, **kw):
    from splavu_core.aam.closed_form import fit_utility_keep
    from splavu_core.aam.config import TrainConfig
    from splavu_core.aam.training_data import load_oracle_labels, load_training_data

    store = FeatureStore(root)
    data = load_training_data(store, ad=None)
    keep = fit_utility_keep(data, TASKS, 4, TrainConfig())
    if adversary.startswith("attributes") or adversary == "subjects+attributes":
        data = load_oracle_labels(store, data)
    cfg = frontier.StageConfig(adversary=adversary, epochs=kw.pop("epochs", 4), batch=64, save_every=10, **kw)
    return frontier.fit_stage(data, TASKS, keep, cfg, checkpoint, log=log)


def _same(a, b) -> bool:
    sa, sb = a.state_dict(), b.state_dict()
    return sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)


def test_the_learned_stage_is_seeded_and_resumes_from_its_safetensors_checkpoint(frontier, tiny_store, tmp_path):
    whole = _fit(frontier, tiny_store, epochs=20)
    assert _same(whole, _fit(frontier, tiny_store, epochs=20))
    assert not _same(whole, _fit(frontier, tiny_store, epochs=20, seed=1))

    class Stop(Exception):
        pass

    def stop_at_10(msg):
        if "epoch 10/" in msg:
            raise Stop
    ckpt = tmp_path / "stage.safetensors"
    with pytest.raises(Stop):
        _fit(frontier, tiny_store, checkpoint=ckpt, log=stop_at_10, epochs=20)
    from safetensors import safe_open
    with safe_open(str(ckpt), "pt") as f:
        assert f.metadata()["epoch"] == "10"
    resumed = _fit(frontier, tiny_store, checkpoint=ckpt, epochs=20)
    assert _same(whole, resumed), "a fit resumed at epoch 10 differs from one that ran through"
    with safe_open(str(ckpt), "pt") as f:
        assert f.metadata()["epoch"] == "20"
    # a checkpoint of another configuration is not resumed from: the fit starts over
    assert _same(_fit(frontier, tiny_store, epochs=20, lam=2.0),
                 _fit(frontier, tiny_store, checkpoint=ckpt, epochs=20, lam=2.0))


def test_the_learned_stage_never_reads_private_attribute_labels(frontier, tiny_store, tmp_path):
    root = tmp_path / "store"
    shutil.copytree(tiny_store, root)
    learned, oracle = _fit(frontier, root), _fit(frontier, root, adversary="attributes")
    assert flip_private_labels(root) >= 2, "the training datasets must carry attr_* labels for this to mean anything"
    assert _same(learned, _fit(frontier, root)), "the label-free stage changed when only private labels changed"
    assert not _same(oracle, _fit(frontier, root, adversary="attributes")), \
        "the oracle reads the private labels: flipping them must change it (else this test could not fail)"
