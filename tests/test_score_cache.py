"""The score cache (splavu_core/evaluation/score_cache.py): a re-run scores nothing it scored before and writes the
same rows; any changed input is a new measurement; a damaged entry is scored again."""
import dataclasses
import json
import shutil

import numpy as np
import pytest

from splavu_core.evaluation import score_cache, scoring
from splavu_core.evaluation.suite import load_feature_sets
from splavu_core.ingest.datasets import task_datasets
from splavu_core.store.feature_store import FeatureStore

TASKS = ["ar", "tad", "ad", "privacy"]
PROBES = {"tad": {"epochs": 5}, "privacy": {"epochs": 5}}  # short: the cache, not the readers, is tested


@pytest.fixture
def store(tiny_store, tmp_path):
    shutil.copytree(tiny_store, tmp_path / "store")
    for lock in (tmp_path / "store").glob(".*.lock"):
        lock.unlink()
    shutil.rmtree(tmp_path / "store" / score_cache.ROOT, ignore_errors=True)  # other tests score the shared store
    return FeatureStore(tmp_path / "store")


def _rows(store, sets, keep_in=True) -> str:
    scoring._SCORES.clear()                                   # as a new process: nothing remembered in memory
    res = scoring.score_sets(sets, TASKS, task_datasets(store, {}), split="val", seeds=[0, 1], probe_kwargs=PROBES,
                             store=store if keep_in else None, created_at="t")
    assert not [k for k in res.skipped if ":" not in k], res.skipped
    return json.dumps(list(res), sort_keys=True, default=str)


def _sets(store):
    ds = task_datasets(store, {})
    raw = load_feature_sets(store, TASKS, "raw", datasets=ds)
    q = np.linalg.qr(np.random.default_rng(0).normal(size=(raw[ds["ar"]][0].dim, 4)))[0]
    return {"raw": raw, "proj": {d: scoring.apply_features(v, lambda x: x @ q) for d, v in raw.items()}}


def _counts(fn):
    before = dict(score_cache.COUNTS)
    out = fn()
    return out, {k: score_cache.COUNTS[k] - before[k] for k in before}


def test_a_rerun_reads_every_output_back_and_writes_the_same_rows(store):
    sets = _sets(store)
    fresh = _rows(store, sets, keep_in=False)
    assert not store.files.exists(score_cache.ROOT)           # no store named: nothing kept
    first, c1 = _counts(lambda: _rows(store, sets))
    assert c1["hit"] == 0 and c1["miss"] > 0
    n_files = len(store.files.walk(score_cache.ROOT))
    assert n_files == c1["miss"]
    again, c2 = _counts(lambda: _rows(store, sets))
    assert c2 == {"hit": c1["miss"], "miss": 0}
    assert fresh == first == again                            # byte for byte: values, intervals, strongest reader


def test_a_changed_input_is_a_new_measurement(store):
    sets = _sets(store)
    _rows(store, sets)
    ds = task_datasets(store, {})

    def rerun(changed):
        return _counts(lambda: _rows(store, changed))[1]

    # one feature of one training AR video, by one ulp: the AR readers and the clip attackers miss, the rest hit
    ar = list(sets["raw"][ds["ar"]])
    i = next(j for j, v in enumerate(ar) if v.split == "train")
    feats = ar[i].feats.copy()
    feats[0, 0] = np.nextafter(feats[0, 0], np.float32(np.inf))
    ar[i] = dataclasses.replace(ar[i], feats=feats)
    c = rerun({"raw": {**sets["raw"], ds["ar"]: ar}, "proj": sets["proj"]})
    assert c["miss"] == 2 and c["hit"] > 0                    # AR's two readers on raw; nothing else read it
    # a label: an AD video's anomaly intervals
    ad = list(sets["raw"][ds["ad"]])
    j = next(k for k, v in enumerate(ad) if v.meta.get("anomaly") == 1 and v.split == "train")
    meta = {**ad[j].meta, "anomaly_intervals": [[0.0, 0.1]]}
    ad[j] = dataclasses.replace(ad[j], meta=meta)
    c = rerun({"raw": {**sets["raw"], ds["ad"]: ad}, "proj": sets["proj"]})
    assert c["miss"] == 2                                     # AD's two readers on raw
    # other seeds: every measurement again
    scoring._SCORES.clear()
    _, c = _counts(lambda: scoring.score_sets(sets, ["ar"], ds, split="val", seeds=[0, 2], probe_kwargs=PROBES,
                                              store=store))
    assert c == {"hit": 0, "miss": 4}                        # two readers on raw and on the projection


def test_a_damaged_entry_is_scored_again_not_trusted(store):
    sets = _sets(store)
    first = _rows(store, sets)
    keys = [k for k, _ in store.files.walk(score_cache.ROOT)]
    store.files.put_atomic(keys[0], b"not an npz")
    before = dict(score_cache.COUNTS)
    assert _rows(store, sets) == first
    assert score_cache.COUNTS["miss"] - before["miss"] == 1


def test_encoding_keeps_shared_outputs_shared_and_refuses_pickles():
    one = [np.arange(3.0), np.ones(2, np.float32)]
    dets = [[(0.5, 1.5, "wave", 0.25)], []]
    obj = ("x", {"per_seed": [one] * 3, "dets": [dets] * 2, "tious": [0.3, 0.5], "n": 100, "nan": float("nan")})
    back = score_cache.decode(score_cache.encode(obj))
    kind, o = back
    assert kind == "x" and o["per_seed"][0] is o["per_seed"][2] and o["dets"][0] is o["dets"][1]
    assert o["dets"][0] == dets and o["tious"] == [0.3, 0.5] and o["n"] == 100 and np.isnan(o["nan"])
    np.testing.assert_array_equal(o["per_seed"][1][1], one[1])
    assert o["per_seed"][1][1].dtype == np.float32
    with pytest.raises(TypeError, match="object arrays"):
        score_cache.encode(np.array([{"a": 1}], dtype=object))
