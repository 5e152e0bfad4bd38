"""Tasks nobody fitted for (splavu_core/evaluation/unseen.py): the refit without a task reads none of its labels,
every utility task of the store gets its rows, and a trained (not closed-form) adapter is said to be skipped."""
import dataclasses
import shutil

import numpy as np
import pytest

from splavu_core.aam.config import TrainConfig
from splavu_core.aam.train import train_aam
from splavu_core.aam.training_data import load_training_data
from splavu_core.evaluation import unseen
from splavu_core.evaluation.keep_curve import load_inputs
from splavu_core.store.feature_store import FeatureStore


@pytest.fixture(scope="module")
def default_version(tiny_store, tmp_path_factory):
    """A copy of tiny_store with the default (closed-form keep + recentring) AAM recorded."""
    from splavu_core.aam.io import adapter_version, save_adapter
    from splavu_core.store.ledger import record_version

    root = tmp_path_factory.mktemp("unseen") / "store"
    shutil.copytree(tiny_store, root)
    store = FeatureStore(root)
    adapter, acfg, extra = train_aam(load_training_data(store), TrainConfig(), log=None)
    fp = store.encoder_fingerprint()
    version = adapter_version(adapter, acfg, fp)
    save_adapter(adapter, acfg, store.root / "aam" / version, fp, extra=extra)
    record_version(store, version, {"encoder_fingerprint": fp, "config": acfg.to_dict()}, make_current=False)
    return store, version


def _shuffled(data, task: str, seed: int = 0):
    """The training data with `task`'s labels permuted among its videos (everything else as it was)."""
    rng = np.random.default_rng(seed)
    key, field = {"ar": ("action", "ar_train"), "ad": ("anomaly", "ad_train"), "tad": ("segments", "tad_train")}[task]
    videos = getattr(data, field)
    labels = [v.meta.get(key) for v in videos]
    order = rng.permutation(len(videos))
    return dataclasses.replace(data, **{field: [dataclasses.replace(v, meta={**v.meta, key: labels[j]})
                                                for v, j in zip(videos, order)]})


@pytest.mark.parametrize("task", ["ar", "ad"])
def test_the_refit_without_a_task_reads_none_of_its_labels(default_version, task):
    store, version = default_version
    cfg = unseen.version_config(store, version)
    inp = load_inputs(store, cfg)
    inp = dataclasses.replace(inp, cfg=dataclasses.replace(inp.cfg, tasks=tuple(cfg.tasks)))
    tasks = tuple(t for t in cfg.tasks if t != task)
    k, rc = int(cfg.adapter["keep"]), bool(cfg.adapter["recentre"])
    a = unseen._members(inp, tasks, k, rc, pca={})
    b = unseen._members(dataclasses.replace(inp, data=_shuffled(inp.data, task)), tasks, k, rc, pca={})
    with_task = unseen._members(dataclasses.replace(inp, data=_shuffled(inp.data, task)), tuple(cfg.tasks), k, rc,
                                pca={})
    for member in ("config", "keep"):
        for ds, videos in a[member].items():
            for x, y in zip(videos, b[member][ds]):
                np.testing.assert_array_equal(x.feats, y.feats)
    # the same shuffle changes a fit that does read the task: the check above can fail
    differs = any(not np.array_equal(x.feats, y.feats) for ds, videos in with_task["config"].items()
                  for x, y in zip(videos, a["config"][ds]))
    assert differs


def test_every_utility_task_gets_its_unseen_rows(default_version):
    store, version = default_version
    out = unseen.evaluate(store, version, seeds=[0, 1])
    s = out["summary"]
    assert set(s["fits"]) == {"ar", "tad", "ad"}
    for task, fit in s["fits"].items():
        assert task not in fit["fitted_on"] and fit["reader"]
    heads = {"ar": "retention_top1", "tad": "retention_mAP", "ad": "retention_auc"}
    got = {(r["feature_set"], r["task"], r["metric"]) for r in out["rows"]}
    for task, metric in heads.items():
        for member in unseen.MEMBERS:
            assert (f"unseen_{member}", task, metric) in got
    assert all(r["aam_version"] == version and r["split"] == "test" for r in out["rows"])
    assert (store.root / unseen.REPORT).is_file() and "fitted without" in unseen.markdown(s)


def test_a_trained_adapter_is_skipped_and_said(default_version, tmp_path):
    store, version = default_version
    meta = store.files.read_json(f"aam/{version}/adapter.json")
    meta["config"] = {**meta["config"], "layers": 2}
    store.files.write_json(f"aam/{version}_trained/adapter.json", meta)
    out = unseen.evaluate(store, f"{version}_trained", seeds=[0])
    assert out["rows"] == [] and "not a closed-form keep configuration" in out["summary"]["skipped"]
    assert out["summary"]["skipped"] in unseen.markdown(out["summary"])
