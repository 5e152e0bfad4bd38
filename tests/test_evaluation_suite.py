"""The evaluation suite, the report, the two gates and the ablation job, on the tiny store.

The tiny benchmark with a tiny random encoder gives noisy numbers: these tests assert structure and
hand-checkable relations, never quality.
"""
import json
import math
import os
import re
import shutil

import dagster as dg
import numpy as np
import pyarrow.parquet as pq
import pytest

from pipeline.runner import instance, run_evaluation
from splavu_core.evaluation import suite
from splavu_core.evaluation.report import fmt_change, report_markdown
from splavu_core.serve.catalog import METRICS_SCHEMA
from splavu_core.store import costs
from splavu_core.store.feature_store import FeatureStore

SMALL_ADAPTER = {"layers": 1, "heads": 2, "sub_tokens": 4, "token_width": 16}
FAST_PROBES = {"ar_epochs": 15, "tad_epochs": 5, "ad_epochs": 10, "privacy_epochs": 25}


# ---------------------------------------------------------------- fixtures: a trained AAM, then its published tables

def _copy(src, dst):
    shutil.copytree(src, dst)
    for lock in dst.glob(".*.lock"):
        lock.unlink()
    return FeatureStore(dst)


@pytest.fixture(scope="module")
def trained(tiny_store, tmp_path_factory):
    """A copy of tiny_store with one (tiny) trained AAM recorded, nothing published."""
    from splavu_core.aam.io import save_adapter
    from splavu_core.aam.config import TrainConfig
    from splavu_core.aam.train import train_aam
    from splavu_core.aam.training_data import load_training_data
    from splavu_core.store.ledger import record_version

    store = _copy(tiny_store, tmp_path_factory.mktemp("trained") / "store")
    cfg = TrainConfig.from_flat(dict(epochs=3, batch=64, pretrain_head_epochs=2, w_lc=1.0, lr=3e-3,
                                     adapter=SMALL_ADAPTER))
    adapter, acfg, _ = train_aam(load_training_data(store), cfg, log=None)
    fp = store.encoder_fingerprint()
    from splavu_core.aam.io import adapter_version

    version = adapter_version(adapter, acfg, fp)
    save_adapter(adapter, acfg, store.root / "aam" / version, fp)
    record_version(store, version, {"encoder_fingerprint": fp, "config": acfg.to_dict()}, make_current=False)
    return store.root, version


@pytest.fixture(scope="module")
def published(trained, tmp_path_factory):
    """The trained store with every shard anonymized and the version current."""
    from splavu_core.publish.anonymized_tables import anonymize_shard
    from splavu_core.store.ledger import set_current

    root, version = trained
    store = _copy(root, tmp_path_factory.mktemp("published") / "store")
    for shard in store.committed_shards():
        anonymize_shard(store, shard, store.root / "aam" / version)
    set_current(store, version)
    return store.root, version


# ---------------------------------------------------------------- pure: rows, derived values, the Markdown

def _rows(feature_set, version, **vals):
    out = []
    for key, value in vals.items():
        task, metric = suite.REPORT_METRICS[key]
        out.append({"feature_set": feature_set, "aam_version": version, "task": task, "metric": metric,
                    "value": value, "split": "test", "created_at": suite._now()})
    return out


def test_report_from_rows_hand_checked():
    raw = _rows("raw", None, privacy_cmap=0.70, privacy_f1=0.6, privacy_chance_cmap=0.35, ar_top1=0.80,
                tad_map=0.50, ad_auc=0.90)
    anon = _rows("splavu", "v1", privacy_cmap=0.50, privacy_f1=0.4, privacy_chance_cmap=0.35, ar_top1=0.80,
                 tad_map=0.51, ad_auc=0.882)
    report = suite.build_report("fp", "v1", raw, {"splavu": anon})
    assert set(report) == {"encoder_fingerprint", "aam_version", "rows"}
    r, s = report["rows"]
    assert tuple(r) == suite.REPORT_KEYS and set(s) == set(suite.REPORT_KEYS) | set(suite.DERIVED_KEYS)
    assert r["bias_f_gap"] is None and r["gait_top1"] is None  # never measured -> null
    assert s["leakage_removed"] == pytest.approx((0.70 - 0.50) / (0.70 - 0.35))
    assert s["relative_change"]["privacy_cmap"] == pytest.approx(-0.2 / 0.7)
    assert s["relative_change"]["ar_top1"] == 0 and s["relative_change"]["gait_top1"] is None
    md = report_markdown(report)
    assert "| splavu | 50.0 (↓28.6%) | 57.1% |" in md
    assert "80.0 (=)" in md and "51.0 (↑2.0%)" in md and "88.2 (↓2.0%)" in md
    assert "Chance cMAP" in md and "35.0" in md and "bias_f_gap" in md  # says what was not measured
    assert fmt_change(-0.292) == "↓29.2%" and fmt_change(None) == ""
    assert s["leakage_removed"] == pytest.approx((0.70 - 0.50) / (0.70 - 0.35))
    assert s["relative_change"]["privacy_cmap"] == pytest.approx((0.50 - 0.70) / 0.70)
    # raw at chance: leakage removed is undefined, not a division by ~0
    at_chance = _rows("raw", None, privacy_cmap=0.35, privacy_chance_cmap=0.35)
    assert suite.build_report("fp", "v1", at_chance, {"splavu": anon})["rows"][1]["leakage_removed"] is None


def test_metric_rows_file_merges_by_task(tmp_path):
    store = FeatureStore(tmp_path)
    first = _rows("raw", None, ar_top1=0.5, tad_map=0.4)
    p, = suite.write_metric_rows(store, first)
    assert p == tmp_path / "metrics" / "raw-raw.parquet"
    t = pq.read_table(p)
    assert t.schema == METRICS_SCHEMA and t.num_rows == 2
    suite.write_metric_rows(store, _rows("raw", None, ar_top1=0.6))  # re-evaluating AR replaces only AR
    got = {(r["task"], r["metric"]): r["value"] for r in suite.read_metric_rows(store, "raw", None)}
    assert got == {("ar", "top1"): 0.6, ("tad", "mAP"): 0.4}
    q, = suite.write_metric_rows(store, _rows("splavu", "abc123", ar_top1=0.55))
    assert q.name == "splavu-abc123.parquet" and suite.read_metric_rows(store, "splavu", "abc123")[0]["value"] == 0.55


def test_missing_dataset_is_skipped_and_said():
    from splavu_core.evaluation.scoring import score_sets

    res = score_sets({"raw": {}}, ("bias_m", "gait"), suite.DEFAULT_DATASETS)
    assert list(res) == [] and set(res.skipped) == {"bias_m", "gait"}
    assert "'bias_m' is not in the store" in res.skipped["bias_m"]


# ---------------------------------------------------------------- in-memory anonymization == published table

def test_anonymize_videos_matches_published_table(published):
    from splavu_core.aam.io import load_adapter
    from splavu_core.publish.anonymized_tables import load_video_features

    root, version = published
    store = FeatureStore(root)
    adapter, _, _ = load_adapter(root / "aam" / version)
    raw = load_video_features(store, "raw", datasets=["tad"])
    mem = suite.anonymize_videos(adapter, raw)
    pub = {v.video_id: v for v in load_video_features(store, "anonymized", version=version, datasets=["tad"])}
    assert [v.video_id for v in mem] == [v.video_id for v in raw]
    for v in mem:
        assert np.array_equal(v.feats, pub[v.video_id].feats) and v.meta["segments"] == pub[v.video_id].meta["segments"]
    assert not np.array_equal(mem[0].feats, raw[0].feats)


# ---------------------------------------------------------------- the evaluation assets, report and utility gate

def test_eval_assets_write_rows_report_and_warn(published, monkeypatch):
    from assets import evaluation as ev
    from assets.resources import StoreResource

    root, version = published
    store = FeatureStore(root)
    monkeypatch.setenv("SPLAVU_UTILITY_GATE", "1e9")  # impossible: the warning must fire
    res = run_evaluation(instance(), StoreResource(root=str(root)), config=FAST_PROBES)
    assert res.success

    # metric rows: both feature sets, the catalog's schema, one file per (feature set, version)
    raw_t = pq.read_table(root / "metrics" / "raw-raw.parquet")
    anon_t = pq.read_table(root / "metrics" / f"splavu-{version}.parquet")
    assert raw_t.schema == METRICS_SCHEMA and anon_t.schema == METRICS_SCHEMA
    raw, anon = raw_t.to_pylist(), anon_t.to_pylist()
    assert {r["feature_set"] for r in raw} == {"raw"} and {r["aam_version"] for r in raw} == {None}
    assert {r["feature_set"] for r in anon} == {"splavu"} and {r["aam_version"] for r in anon} == {version}
    want = {("ar", "top1"), ("tad", "mAP"), ("tad", "mAP@0.5"), ("ad", "auc"), ("gait", "top1"),
            ("privacy", "cmap"), ("privacy", "f1"), ("privacy", "chance_cmap"),
            *(("privacy", f"cmap[{a}]") for a in ("mlp", "linear", "gbdt", "knn", "mlp_width")),
            ("clip_privacy", "cmap"), ("clip_privacy", "chance_cmap")}
    assert want <= {(r["task"], r["metric"]) for r in raw} and want <= {(r["task"], r["metric"]) for r in anon}
    v = lambda rows, t, m: suite.metric_value(rows, t, m)  # noqa: E731
    for rows in (raw, anon):  # the reported attacker is the strongest of the fixed-capacity suite, never mlp_width
        assert v(rows, "privacy", "cmap") == max(v(rows, "privacy", f"cmap[{a}]") for a in ("mlp", "linear", "gbdt", "knn"))
        assert v(rows, "tad", "mAP") == pytest.approx(np.mean([v(rows, "tad", f"mAP@{t:g}") for t in (.3, .4, .5, .6, .7)]))
        per_class = {r["metric"]: r["value"] for r in rows if r["task"] == "ar" and r["metric"].startswith("class_top1[")}
        assert len(per_class) >= 2 and all(0 <= x <= 1 for x in per_class.values())  # one row per test class
        assert min(per_class.values()) <= v(rows, "ar", "top1") <= max(per_class.values())
        # one AP row per attribute, the strongest attacker's: their mean is the cMAP it quotes
        ap = {r["metric"]: r["value"] for r in rows if r["task"] == "privacy" and r["metric"].startswith("ap[")}
        assert len(ap) >= 2 and v(rows, "privacy", "cmap") == pytest.approx(np.mean(list(ap.values())))
    assert v(raw, "privacy", "chance_cmap") == v(anon, "privacy", "chance_cmap")
    for r in (r for r in anon if r["task"] == "privacy" and r["metric"].startswith("removed_ap[")):
        m = r["metric"][len("removed_"):]  # each attribute's share removed, against its own prevalence
        row = next(x for x in anon if x["task"] == "privacy" and x["metric"] == m)
        assert r["value"] == pytest.approx((v(raw, "privacy", m) - row["value"]) / (v(raw, "privacy", m) - row["chance"]))
    raw_c, anon_c, chance = v(raw, "privacy", "cmap"), v(anon, "privacy", "cmap"), v(raw, "privacy", "chance_cmap")
    assert v(anon, "privacy", "leakage_removed") == pytest.approx((raw_c - anon_c) / (raw_c - chance))
    # tiny store: no bias_m dataset -> skipped, and said; bias_f is scored, its gap from the per-group accuracies
    md = res.asset_materializations_for_node("bias_eval")[0].metadata
    skipped = md["skipped"].value
    assert "not in the store" in skipped["bias_m"] and "bias_f" not in skipped
    for rows in (raw, anon):
        assert v(rows, "bias_f", "gap") == pytest.approx(abs(v(rows, "bias_f", "acc_f") - v(rows, "bias_f", "acc_m")))
    pmd = res.asset_materializations_for_node("privacy_attack_eval")[0].metadata
    assert pmd["splavu/privacy/cmap"].value == pytest.approx(anon_c) and pmd["aam_version"].value == version

    # the report: exact schema, numbers from the rows, Markdown with relative changes, PNG
    report = json.loads((root / "reports" / "privacy_utility.json").read_text())
    assert set(report) == {"encoder_fingerprint", "aam_version", "rows", "costs", "aam_version_is_current",
                           "probe_seeds", "commit", "machine", "unseen"}
    # a trained (not closed-form) adapter: the unseen-task protocols say why they refitted nothing
    assert "not a closed-form keep configuration" in report["unseen"]["skipped"]
    for task, readers in (("ar", ("linear", "mlp")), ("tad", ("convex", "head")), ("ad", ("linear", "mlp"))):
        assert set(report["rows"][0]["readers"][task]) == set(readers)  # every reader of the suite is reported
    attrs = report["rows"][1]["attributes"]["privacy"]  # which attribute stays readable, each with its share
    assert len(attrs) >= 2 and all({"score", "removed"} <= set(st) for st in attrs.values())
    assert report["commit"] == costs.provenance()["commit"] and f"{os.cpu_count()} CPU cores" in report["machine"]
    assert report["probe_seeds"] == [0, 1, 2, 3, 4]
    assert report["aam_version_is_current"] is True
    # the fixtures ran no asset, so no step recorded its cost: said, never made up
    assert report["costs"]["splavu"]["produce_seconds"] is None and report["costs"]["splavu"]["missing"]
    assert report["encoder_fingerprint"] == store.encoder_fingerprint() and report["aam_version"] == version
    assert [r["name"] for r in report["rows"]] == ["raw", "splavu"]
    r, s = report["rows"]
    iv_keys = {"intervals", "changes", "derived_intervals", "attackers", "readers", "attributes"}  # every metric with its interval and chance
    # each attacker of the suite has its own row, and each one's removal on the anonymized row
    assert set(r["attackers"]["privacy"]) == {"mlp", "linear", "gbdt", "knn", "mlp_width"}
    assert all("removed" in st for st in s["attackers"]["privacy"].values())
    assert set(suite.REPORT_KEYS) <= set(r) <= set(suite.REPORT_KEYS) | iv_keys
    assert set(s) - iv_keys == set(suite.REPORT_KEYS) | set(suite.DERIVED_KEYS)
    for key, (task, metric) in {"privacy_cmap": ("privacy", "cmap"), "ar_top1": ("ar", "top1"), "tad_map": ("tad", "mAP"),
                                "ad_auc": ("ad", "auc"), "gait_top1": ("gait", "top1")}.items():
        st = r["intervals"][key]
        row = next(x for x in raw if x["task"] == task and x["metric"] == metric)
        # the report quotes the interval scoring computed: wider than the seeds' spread alone (the bootstrap ran),
        # except at a bound (a hit rate of 0 on the tiny gait set: every resample scores 0)
        assert (st["ci_low"], st["ci_high"]) == pytest.approx((row["ci_low"], row["ci_high"]))
        wider = st["ci_high"] - st["ci_low"] > 2 * 1.96 * row["sd"] / np.sqrt(row["n_seeds"])
        assert wider == (0 < row["value"] < 1), (key, st, row["value"])
        assert st["chance"] is not None and st["n_seeds"] >= 1
    assert r["intervals"]["ar_top1"]["n_seeds"] == 5 and r["intervals"]["gait_top1"]["n_seeds"] == 1
    assert r["privacy_cmap"] == raw_c and s["privacy_cmap"] == anon_c and s["ar_top1"] == v(anon, "ar", "top1")
    assert r["bias_f_gap"] == v(raw, "bias_f", "shortcut_gap") and r["bias_m_gap"] is None  # bias_m: not in the store
    assert s["leakage_removed"] == pytest.approx(v(anon, "privacy", "leakage_removed"))
    # the same attack on the published action clips: train actors -> disjoint test actors
    raw_k, anon_k, chance_k = v(raw, "clip_privacy", "cmap"), v(anon, "clip_privacy", "cmap"), v(raw, "clip_privacy", "chance_cmap")
    assert r["clip_privacy_cmap"] == raw_k and r["clip_privacy_chance_cmap"] == chance_k
    judge = max(("mlp", "linear", "gbdt", "knn"), key=lambda n: s["attackers"]["clip_privacy"][n]["score"]["value"])
    raw_j = r["attackers"]["clip_privacy"][judge]["score"]["value"]   # the same attacker on raw
    assert s["clip_leakage_removed"] == pytest.approx((raw_j - anon_k) / (raw_j - chance_k))
    assert v(anon, "clip_privacy", "leakage_removed") == pytest.approx(s["clip_leakage_removed"])
    table = (root / "reports" / "privacy_utility.md").read_text()
    from splavu_core.evaluation.report import fmt_interval

    for key in ("privacy_cmap", "ar_top1", "tad_map", "ad_auc", "gait_top1"):
        assert fmt_interval(s["intervals"][key]) in table, (key, table)   # value [95% interval], never a bare %
        if r["intervals"][key]["signal"] is False:  # raw at chance: said, and no change claimed
            assert fmt_interval(r["intervals"][key]) + " no signal" in table
    assert "| chance |" in table and "paired difference" in table
    assert (root / "reports" / "privacy_utility.png").read_bytes()[:4] == b"\x89PNG"
    rmd = res.asset_materializations_for_node("privacy_utility_report")[0].metadata
    assert "data:image/png;base64," in rmd["tradeoff"].value and "| splavu |" in rmd["table"].value
    assert rmd["path"].value == str(root / "reports" / "privacy_utility.json")

    # utility_retention: a WARN, never an error, and the run still succeeds
    ev_check, = res.get_asset_check_evaluations()
    assert ev_check.check_name == "utility_retention" and ev_check.passed is False
    assert ev_check.severity == dg.AssetCheckSeverity.WARN
    passed, _, _ = ev.retention_verdict(report, 0.0)
    assert passed


def test_pixel_baselines_are_scored_and_costed_beside_splavu(published, run_baseline, tmp_path):
    from assets import evaluation as ev
    from assets.resources import StoreResource
    from splavu_core.store import costs

    src, version = published
    store = _copy(src, tmp_path / "store")
    shards = store.committed_shards()
    for s in shards:  # hand-set ledger of the splavu path, to check the arithmetic
        costs.record(store, "raw", "extract", s, 1.0)
        costs.record(store, "splavu", "anonymize", f"{version}/{s}", 0.5)
    costs.record(store, "splavu", "train", version, 2.0)
    run_baseline(store.root, "down4")  # every evaluation dataset of the store
    assert run_evaluation(instance(), StoreResource(root=str(store.root)), config=FAST_PROBES).success

    report = json.loads((store.root / "reports" / "privacy_utility.json").read_text())
    assert [r["name"] for r in report["rows"]] == ["raw", "splavu", "pixel_down4"]
    rows = pq.read_table(store.root / "metrics" / "pixel_down4-raw.parquet").to_pylist()
    px = report["rows"][2]
    assert px["ar_top1"] == suite.metric_value(rows, "ar", "top1") and px["privacy_cmap"] == suite.metric_value(rows, "privacy", "cmap")
    assert px["leakage_removed"] == pytest.approx(suite.metric_value(rows, "privacy", "leakage_removed"))
    c = report["costs"]
    n = len(shards)
    assert c["splavu"]["produce_seconds"] == pytest.approx(n * 1.0 + 2.0 + n * 0.5) and not c["splavu"]["missing"]
    assert c["splavu"]["change_seconds"] == pytest.approx(2.0 + n * 0.5)
    pixel_secs = sum(e["seconds"] for e in costs.entries(FeatureStore(store.root / "baselines" / "pixel_down4"),
                                                         "pixel_down4", "extract").values())
    assert pixel_secs > 0 and c["pixel_down4"]["produce_seconds"] == pytest.approx(pixel_secs) and c["pixel_down4"]["shards"] == n
    assert c["pixel_down4"]["change_ratio_vs_splavu"] == pytest.approx(pixel_secs / (2.0 + n * 0.5))
    assert c["pixel_down4"]["produce_ratio_vs_splavu"] == pytest.approx(pixel_secs / (n * 1.0 + 2.0 + n * 0.5))
    table = (store.root / "reports" / "privacy_utility.md").read_text()
    assert "| pixel_down4 |" in table and "### Cost" in table


def test_utility_retention_verdict_hand_checked():
    from assets.evaluation import retention_verdict

    # no intervals (an old report): the point share of raw's utility (chance unknown = 0)
    report = suite.build_report("fp", "v", _rows("raw", None, ar_top1=0.8, tad_map=0.5, ad_auc=0.9),
                                {"splavu": _rows("splavu", "v", ar_top1=0.79, tad_map=0.45, ad_auc=0.9)})
    passed, ret, fails = retention_verdict(report, 0.97)
    assert not passed and ret["tad_map"] == pytest.approx(0.9) and len(fails) == 1 and "tad_map" in fails[0]
    assert retention_verdict(report, 0.9)[0]

    # with intervals: the utility gate's rule (ledger.retention_kept)
    def with_retention(value, lo, hi):
        rep = json.loads(json.dumps(report))
        rep["rows"][1]["derived_intervals"] = {"tad_retention": {"value": value, "ci_low": lo, "ci_high": hi}}
        return rep

    passed, ret, fails = retention_verdict(with_retention(0.8, 0.6, 1.02), 0.9, seen=["ar"])
    assert passed and ret["tad_map"] == 0.8  # a point below 0.9 whose interval reaches 1: no loss shown
    passed, ret, fails = retention_verdict(with_retention(0.8, 0.6, 0.95), 0.9, seen=["ar"])
    assert not passed  # below 0.9 and the interval's upper end below 1: a loss beyond the noise
    passed, ret, fails = retention_verdict(with_retention(0.8, 0.7, 0.85), 0.9, seen=["ar"])
    assert not passed and fails == ["tad_map (unseen): keeps 0.800 [0.700, 0.850] of raw's above-chance utility < 0.9"]


# ---------------------------------------------------------------- the blocking publication gate

def test_privacy_budget_blocks_the_catalog_update(trained, tmp_path, monkeypatch):
    from assets import evaluation as ev
    from assets.partitions import shards
    from assets.resources import StoreResource

    root, version = trained
    store = _copy(root, tmp_path / "store")
    from assets.anonymized import anonymized_features
    from assets.catalog import feature_catalog

    inst = dg.DagsterInstance.ephemeral()
    inst.add_dynamic_partitions(shards.name, store.committed_shards())
    assets = [anonymized_features, ev.privacy_budget, feature_catalog]  # the real assets the gate stands between
    check_op = ev.privacy_budget.node_def.name

    def run(**config):
        return dg.materialize(assets, instance=inst, partition_key="privacy-000", raise_on_error=False,
                              resources={"store": StoreResource(root=str(store.root))},
                              run_config={"ops": {check_op: {"config": {"epochs": 25, **config}}}})

    res = run(threshold=1.01)  # impossible: no anonymizer removes more than all the leakage
    (check,) = res.get_asset_check_evaluations()
    assert check.passed is False and check.severity == dg.AssetCheckSeverity.ERROR
    md = check.metadata
    assert md["threshold"].value == 1.01 and md["aam_version"].value == version
    assert "closeup_leakage_removed" in md and md["weaker"].value in ("closeups", "clips")
    # the clip part reads 10 validation videos of 4 people: with the people resampled, raw's cMAP is not above
    # chance beyond its interval there, and the check says so instead of quoting a share of nothing
    assert "clip_leakage_removed" in md or "clips: no signal" in check.description
    assert md["features"].value == "in-memory"  # privacy-001 not yet published: the adapter is applied in memory
    assert md["leakage_removed"].value == pytest.approx(
        (md["raw_cmap"].value - md["anonymized_cmap"].value) / (md["raw_cmap"].value - md["chance_cmap"].value))
    done = {m.asset_key for m in res.get_asset_materialization_events()}
    assert dg.AssetKey("anonymized_features") in done and dg.AssetKey("feature_catalog") not in done
    assert not res.success

    monkeypatch.setenv("SPLAVU_PRIVACY_BUDGET", "-1")  # the environment sets the budget when the config does not
    res = run()
    (check,) = res.get_asset_check_evaluations()
    assert check.passed is True and check.metadata["threshold"].value == -1.0 and check.metadata["cached"].value
    assert dg.AssetKey("feature_catalog") in {m.asset_key for m in res.get_asset_materialization_events()}
    assert res.success


def test_privacy_budget_fails_closed_without_a_privacy_set(trained, tmp_path):
    from assets import evaluation as ev
    from assets.resources import StoreResource

    from assets.anonymized import anonymized_features

    root, _ = trained
    store = _copy(root, tmp_path / "store")
    res = dg.materialize([anonymized_features, ev.privacy_budget], partition_key="ar-000",
                         instance=_instance_with(store), raise_on_error=False,
                         resources={"store": StoreResource(root=str(store.root))},
                         run_config={"ops": {ev.privacy_budget.node_def.name: {"config": {"dataset": "nope", "threshold": -1}}}})
    (check,) = res.get_asset_check_evaluations()
    assert check.passed is False and "could not be measured" in check.description


def _instance_with(store):
    from assets.partitions import shards

    inst = dg.DagsterInstance.ephemeral()
    inst.add_dynamic_partitions(shards.name, store.committed_shards())
    return inst


# ---------------------------------------------------------------- ablations

def test_ablation_partitions_write_rows_and_report(tiny_store, tmp_path):
    from pipeline.ablations import GROUPS, VARIANTS
    from assets.resources import StoreResource
    from pipeline.runner import run_ablations

    store = _copy(tiny_store, tmp_path / "store")
    cfg = {"batch": 64, "pretrain_head_epochs": 2, "lr": 3e-3, **{k: v for k, v in SMALL_ADAPTER.items()},
           **FAST_PROBES}
    report = run_ablations(dg.DagsterInstance.ephemeral(), StoreResource(root=str(store.root)),
                           variants=["default", "tasks_all"], epochs=2, config=cfg, log=None)
    d = store.root / "reports" / "ablations"
    a = json.loads((d / "variants" / "default.json").read_text())
    b = json.loads((d / "variants" / "tasks_all.json").read_text())
    assert a["reused"] is False and b["reused"] is True  # same training config: trained once
    assert a["train_config"]["epochs"] == 2 and SMALL_ADAPTER.items() <= a["train_config"]["adapter"].items()
    assert a["train_config"]["adapter"]["keep"] == 11 and a["train_config"]["adapter"]["recentre"]  # the default: keep + recentre
    assert a["row"]["name"] == "default" and set(suite.REPORT_KEYS) | set(suite.DERIVED_KEYS) <= set(a["row"])
    # scored with intervals (5 probe seeds + bootstrap), every change paired with raw
    assert {r["n_seeds"] for r in a["metric_rows"] if r["task"] not in ("gait", "reid")} == {5}
    assert {"delta_top1", "retention_top1"} <= {r["metric"] for r in a["metric_rows"] if r["task"] == "ar"}
    top1 = next(r for r in a["metric_rows"] if (r["task"], r["metric"]) == ("ar", "top1"))
    iv = a["row"]["intervals"]["ar_top1"]  # the row quotes the metric row's interval: the bootstrap's, not 0 wide
    assert (iv["ci_low"], iv["ci_high"]) == pytest.approx((top1["ci_low"], top1["ci_high"]))
    assert iv["ci_high"] - iv["ci_low"] > 0 and a["row"]["ar_top1"] == pytest.approx(top1["value"])
    assert a["seen_tasks"] == a["train_config"]["tasks"] and a["row"]["seen_tasks"] == a["seen_tasks"]
    assert [r["name"] for r in report["rows"]] == ["raw", "default", "tasks_all"]
    raw, row = report["rows"][0], report["rows"][1]
    assert row["privacy_cmap"] == a["row"]["privacy_cmap"]
    if row["leakage_removed"] is not None:
        # judged by the attacker strongest on the anonymized row, paired with that same attacker on raw
        att = row["attackers"]["privacy"]
        judge = max(("mlp", "linear", "gbdt", "knn"), key=lambda n: att[n]["score"]["value"])
        raw_j = raw["attackers"]["privacy"][judge]["score"]["value"]
        assert row["privacy_cmap"] == pytest.approx(att[judge]["score"]["value"])
        assert row["leakage_removed"] == pytest.approx((raw_j - row["privacy_cmap"])
                                                       / (raw_j - raw["privacy_chance_cmap"]))
    md = (store.root / "reports" / "ablations.md").read_text()
    assert "### The keep family" in md and "### Tasks seen" in md and "| default |" in md and "Not yet run:" in md
    assert "probe seeds [95% interval" in md and re.search(r"\| default \|.* \(seen\)", md)
    assert all(row["seen_tasks"] == a["seen_tasks"] for row in report["rows"][1:]) and report["probe_seeds"] == [0, 1, 2, 3, 4]
    assert set(VARIANTS) >= {n for names in GROUPS.values() for n in names}
    assert {"loss_no_lt", "loss_no_lb", "loss_no_llc", "tasks_ar", "tasks_tad", "tasks_ad", "tasks_ar_tad",
            "tasks_ar_ad", "tasks_tad_ad", "previous_default", "wlc_0", "wlc_1000"} <= set(VARIANTS)


def test_variant_configs():
    from pipeline.ablations import AblationConfig

    base = AblationConfig(epochs=5, w_lc=10.0)
    assert base.variant_train_config("loss_no_lt").tasks == ()
    assert base.variant_train_config("loss_no_lb").loop.w_b == 0.0
    assert base.variant_train_config("loss_no_llc").loop.w_lc == 0.0
    assert base.variant_train_config("tasks_tad").tasks == ("tad",)
    assert base.variant_train_config("wlc_1000").loop.w_lc == 1000.0 and base.variant_train_config("wlc_1000").loop.epochs == 5
    assert base.variant_train_config("loss_all").loop.w_lc == 10.0
    assert base.variant_train_config("default").adapter["keep"] == 11 and base.variant_train_config("default").adapter["recentre"]
    no = base.variant_train_config("no_recentre")
    assert (no.keep, no.layers, no.loop.mixer, no.recentre, no.recentre_draw) == (11, 0, "mlp", False, 0.0)
    drawn = base.variant_train_config("keep14_draw4_top3")  # anonymizer v6's option, a delta on the default
    assert (drawn.keep, drawn.layers, drawn.loop.mixer, drawn.recentre, drawn.recentre_draw, drawn.recentre_top) == \
        (14, 0, "mlp", True, 4.0, 3)
    prev = base.variant_train_config("previous_default")  # a projection of half the dims + 2 MLP blocks + critic
    assert prev.adapter["keep"] == 0 and prev.adapter["layers"] == 2 and prev.projection.projection_fraction == 0.5
    base = AblationConfig(epochs=5, projection_rank=12, layers=2, heads=4)
    paper = base.variant_train_config("paper")  # the paper's objective: fixed-cosine NT-Xent, no appearance projection
    assert paper.loop.privacy == "ntxent" and paper.adapter["projection_rank"] == 0 and \
        paper.adapter["mixer"] == "attention"
    assert paper.adapter["heads"] == 4 and paper.adapter["keep"] == 0  # unnamed fields come from the base config
    assert base.variant_train_config("loss_no_lb").adapter["projection_rank"] == 0
    assert base.variant_train_config("projection_only").adapter["projection_rank"] == 12
    assert base.variant_train_config("oracle").loop.oracle and not base.variant_train_config("loss_all").loop.oracle
    with pytest.raises(ValueError, match="unknown ablation variant"):
        base.variant_train_config("nope")


# ---------------------------------------------------------------- every definition loads together

def test_definitions_load():
    from assets import aam, anonymized, catalog, evaluation, latents, manifest
    from assets.resources import EncoderResource, StoreResource
    from pipeline import ablations

    defs = dg.Definitions(  # the real modules: a broken assets/anonymized.py or catalog.py fails here
        assets=[*dg.load_assets_from_modules([manifest, latents, aam, evaluation, anonymized, catalog]),
                *ablations.ASSETS],
        asset_checks=dg.load_asset_checks_from_modules([evaluation]),
        jobs=[ablations.ablations_job],
        resources={"store": StoreResource(root="/nonexistent"), "encoder": EncoderResource()})
    dg.Definitions.validate_loadable(defs)
    graph = defs.resolve_asset_graph()
    keys = {k.to_user_string() for k in graph.get_all_asset_keys()}
    assert {"action_recognition_eval", "temporal_detection_eval", "anomaly_detection_eval", "privacy_attack_eval",
            "bias_eval", "gait_eval", "privacy_utility_report", "ablation_variant", "ablation_report",
            "anonymized_features", "feature_catalog"} <= keys
    checks = {(c.asset_key.to_user_string(), c.name) for c in graph.asset_check_keys}
    assert checks >= {("anonymized_features", "privacy_budget"), ("privacy_utility_report", "utility_retention")}
    assert defs.resolve_job_def("ablations").partitions_def is ablations.ablation_variants
    assert math.isclose(evaluation.DEFAULT_PRIVACY_BUDGET, 0.5) and math.isclose(evaluation.DEFAULT_UTILITY_GATE, 0.95)


def _ar_videos(seed: int, n: int = 60, dim: int = 6) -> list:
    from splavu_core.tasks.features import VideoFeatures

    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        action = ("a", "b", "c")[i % 3]
        feats = (rng.normal(size=(2, dim)) + 2.0 * np.eye(dim)[i % 3]).astype(np.float32)
        out.append(VideoFeatures(f"v{i:03d}", "test" if i % 4 == 0 else "train", feats, np.array([0.0, 1.0]),
                                 np.array([1.0, 2.0]), 32, 16.0, {"action": action}))
    return out


def test_the_same_measurement_is_scored_once_and_a_changed_input_never_reuses_it(monkeypatch):
    """score_sets keys a measurement by its content: an identical table under another name (a same-width PCA in the
    main table and again in the unseen-task rows) reuses the first one's Scored and gives the same rows; a table
    that differs in one feature byte, one label or the seeds is scored afresh."""
    import dataclasses

    from splavu_core.evaluation import scoring

    scoring._SCORES.clear()
    runs, real = [], scoring.run_task
    monkeypatch.setattr(scoring, "run_task", lambda task, videos, *a: runs.append(videos[0].video_id) or
                        real(task, videos, *a))
    raw, other = _ar_videos(0), _ar_videos(1)
    ds = {"ar": "ar"}
    first = scoring.score_sets({"raw": {"ar": raw}, "pca": {"ar": other}}, ["ar"], ds, seeds=[0, 1])
    assert len(runs) == 2
    again = scoring.score_sets({"raw": {"ar": raw}, "unseen_pca": {"ar": other}}, ["ar"], ds, seeds=[0, 1])
    assert len(runs) == 2  # nothing scored again
    strip = [(r["task"], r["metric"], r["value"], r["ci_low"], r["ci_high"]) for r in first if r["feature_set"] == "pca"]
    assert strip == [(r["task"], r["metric"], r["value"], r["ci_low"], r["ci_high"])
                     for r in again if r["feature_set"] == "unseen_pca"]

    byte = [dataclasses.replace(v, feats=v.feats.copy()) for v in other]
    byte[7].feats[1, 2] = np.nextafter(byte[7].feats[1, 2], np.float32(np.inf))
    label = [dataclasses.replace(v, meta=dict(v.meta)) for v in other]
    label[5].meta["action"] = "a" if label[5].meta["action"] != "a" else "b"
    for changed in (byte, label):
        before = len(runs)
        scoring.score_sets({"raw": {"ar": raw}, "pca": {"ar": changed}}, ["ar"], ds, seeds=[0, 1])
        assert len(runs) == before + 1  # raw reused, the changed table scored
    before = len(runs)
    scoring.score_sets({"raw": {"ar": raw}, "pca": {"ar": other}}, ["ar"], ds, seeds=[0, 1, 2])
    assert len(runs) == before + 2  # other seeds: both scored
