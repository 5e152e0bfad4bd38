"""Issue 19: intervals, validation splits that never touch the test split, the two-sided gate (privacy AND
utility), real blocking Dagster checks, and promotion / rollback from the command line.

The store is built by hand (no video, no encoder): an `ar` dataset whose action and private attributes live in
the first D-1 coordinates of the clip latents (the last one is noise), and a `privacy` set of close-ups. Two
adapters: a small random perturbation ("gentle", keeps actions, removes nothing) and a rank D-1 erasure that
keeps only the noise coordinate ("eraser": removes all leakage AND every action: AR at chance)."""
import json

import dagster as dg
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from splavu_core.evaluation import stats
from splavu_core.evaluation.scoring import carve_validation, score_sets, task_split
from splavu_core.store import ledger
from splavu_core.store.feature_store import QUARANTINE_SCHEMA, FeatureStore, ShardLatents
from splavu_core.tasks.features import VideoFeatures

D = 8
FP = "videomae-gates"
CLASSES = ("wave", "jump", "clap")
INDEX_SCHEMA = pa.schema([("video_id", pa.string()), ("clip_index", pa.int32()), ("start_frame", pa.int32()),
                          ("end_frame", pa.int32()), ("start_s", pa.float64()), ("end_s", pa.float64()),
                          ("split", pa.string())])


def _write(store: FeatureStore, name: str, roles: list[str], rows: list[dict], clips: int, rng) -> None:
    """One shard `<name>-000`: per row (video) `clips` latents = class / attribute signal in coords 0..D-2 + noise."""
    idx = {k: [] for k in INDEX_SCHEMA.names}
    feats = []
    for r in rows:
        mean = np.zeros(D)
        if "action" in r:
            mean[CLASSES.index(r["action"])] += 3.0
        mean[3] += 2.0 * r["attr_skin"]
        mean[4] += 2.0 * r["attr_hat"]
        for c in range(clips):
            feats.append(mean + rng.standard_normal(D))
            idx["video_id"].append(r["video_id"]), idx["clip_index"].append(c), idx["split"].append(r["split"])
            idx["start_frame"].append(16 * c), idx["end_frame"].append(16 * (c + 1))
            idx["start_s"].append(c * 1.0), idx["end_s"].append(c + 1.0)
    shard = f"{name}-000"
    n_v = len(rows)
    data = ShardLatents(clips=np.asarray(feats, np.float32), index=pa.table(idx, schema=INDEX_SCHEMA),
                        static=rng.standard_normal((n_v, 2, D)).astype(np.float32),
                        static_index=pa.table({"video_id": [r["video_id"] for r in rows for _ in range(2)],
                                               "k": pa.array([0, 1] * n_v, pa.int32()),
                                               "frame_index": pa.array([0, 8] * n_v, pa.int32())}),
                        quarantine=QUARANTINE_SCHEMA.empty_table())
    store.write_shard(shard, data, {"encoder_fingerprint": FP}, manifest_hash=f"h-{name}")
    cols = ("video_id", "path", "split", "action", "subject_id", "attr_skin", "attr_hat")
    table = pa.table({c: [r.get(c) for r in rows] for c in cols})
    p = store.shard_manifest_path(shard)
    p.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(table, p)
    store.files.write_json(f"datasets/{name}.json", {"name": name, "manifest": f"/nonexistent/{name}.csv",
                                                   "shard_size": 256, "videos": n_v, "shards": [shard],
                                                   "roles": roles, "static_clips": name == "ar"})


def build_store(root) -> FeatureStore:
    rng = np.random.default_rng(0)
    store = FeatureStore(root)
    ar = []
    for split, n in (("train", 60), ("val", 30), ("test", 30)):
        for i in range(n):
            ar.append({"video_id": f"ar_{split}_{i:03d}", "path": "x.mp4", "split": split, "action": CLASSES[i % 3],
                       "subject_id": f"{split}_{i // 2}", "attr_skin": int(rng.integers(2)),
                       "attr_hat": int(rng.integers(2))})
    _write(store, "ar", ["ar"], ar, 3, rng)
    pr = [{"video_id": f"pr_{split}_{i:03d}", "path": "x.mp4", "split": split, "attr_skin": int(rng.integers(2)),
           "attr_hat": int(rng.integers(2))} for split, n in (("train", 80), ("test", 40)) for i in range(n)]
    _write(store, "privacy", ["privacy"], pr, 1, rng)
    return store


def save_version(store: FeatureStore, kind: str) -> str:
    """A saved adapter: 'gentle' (small random residual) or 'eraser' (keeps only the noise coordinate)."""
    from splavu_core.aam import AAMConfig, AnonymizingAdapter, save_adapter

    torch.manual_seed(0)
    cfg = AAMConfig(dim=D, layers=1, heads=2, sub_tokens=2, token_width=4, projection_rank=D - 1 if kind == "eraser" else 0)
    adapter = AnonymizingAdapter(cfg)
    with torch.no_grad():
        if kind == "eraser":
            adapter.projection.read.copy_(torch.eye(D)[:, : D - 1])
            adapter.projection.write.copy_(torch.eye(D)[:, : D - 1])
        for name, p in adapter.named_parameters():
            if name.endswith("proj.weight") or name.startswith("out."):
                p.normal_(0, 0.01)
    tmp = store.root / "aam" / f"tmp-{kind}"
    version = save_adapter(adapter, cfg, tmp, FP)
    tmp.rename(store.root / "aam" / version)
    meta = json.loads((store.root / "aam" / version / "adapter.json").read_text())
    ledger.record_version(store, version, meta, {}, make_current=False)
    return version


@pytest.fixture
def gated_store(tmp_path, monkeypatch):
    monkeypatch.setenv("SPLAVU_PRIVACY_BUDGET", "-1")  # whatever the privacy budget: the utility side must decide
    store = build_store(tmp_path / "store")
    return store


def _publish(store, version):
    from assets.resources import StoreResource
    from pipeline.runner import run_reanonymize

    inst = dg.DagsterInstance.ephemeral()
    return run_reanonymize(inst, StoreResource(root=str(store.root)), version=version)


# ---------------------------------------------------------------- intervals

def test_interval_and_paired_difference_hand_checked():
    hits = np.array([1, 1, 0, 1, 0, 1, 1, 1, 0, 1], float)   # one seed, 10 test videos, top-1 = 0.7
    f = lambda s, idx: float(hits[np.arange(10) if idx is None else idx].mean())  # noqa: E731
    st = stats.interval(f, 1, 10)
    # the bootstrap of a mean of 10 draws is Binomial(10, 0.7) / 10, whose 2.5% and 97.5% points are 0.4 and 1.0:
    # half-width 0.3, widened for 10 units by small_sample_factor(10) = 1.215 (200 resamples: within 1/10)
    assert (st["ci_high"] - st["ci_low"]) / 2 == pytest.approx(0.3 * stats.small_sample_factor(10), abs=0.1)
    many = np.tile(hits, 40)                                  # 400 videos: 1.96 sqrt(0.21 / 400) = 0.0449
    h = lambda s, idx: float(many[np.arange(400) if idx is None else idx].mean())  # noqa: E731
    wide = stats.interval(h, 1, 400)
    assert (wide["ci_high"] - wide["ci_low"]) / 2 == pytest.approx(0.0449, rel=0.12)
    # bounded: the half-width on the logit scale, so the interval leans away from the bound 1 it is near
    b = stats.interval(h, 1, 400, bounded=True)
    assert b["ci_high"] - 0.7 < 0.7 - b["ci_low"] and (b["ci_high"] - b["ci_low"]) / 2 == pytest.approx(0.0449, rel=0.12)
    # ten videos of five people (two each): the bootstrap draws people; with a person's two videos alike the
    # interval is wider than the videos' (5 independent units, not 10)
    pairs = np.repeat([1, 1, 0, 1, 0], 2).astype(float)
    g = lambda s, idx: float(pairs[np.arange(10) if idx is None else idx].mean())  # noqa: E731
    by_people = stats.interval(g, 1, 10, clusters=stats.cluster_codes(np.repeat(np.arange(5), 2)))
    by_videos = stats.interval(g, 1, 10)
    assert by_people["ci_high"] - by_people["ci_low"] > 1.3 * (by_videos["ci_high"] - by_videos["ci_low"])
    d = stats.paired(f, f, 1, 10)   # the same set against itself: exactly no change, zero-width interval
    assert d["value"] == 0 and d["ci_low"] == 0 and d["ci_high"] == 0 and not stats.change_is_real(d)
    seeds = stats.summarise_values([0.70, 0.72, 0.71, 0.69, 0.73])
    assert seeds["sd"] == pytest.approx(np.std([0.70, 0.72, 0.71, 0.69, 0.73], ddof=1))
    assert seeds["ci_high"] - seeds["ci_low"] == pytest.approx(2 * 1.959964 * seeds["sd"] / np.sqrt(5), rel=1e-4)


def _toy_videos(n=90):
    rng = np.random.default_rng(1)
    out = []
    for i in range(n):
        split = ("train", "train", "test")[(i // 3) % 3]
        f = rng.standard_normal((3, 4)).astype(np.float32)
        f[:, i % 3 % 4] += 2.0
        out.append(VideoFeatures(video_id=f"v{i}", split=split, feats=f, clip_start_s=np.arange(3.0),
                                 clip_end_s=np.arange(3.0) + 1, n_frames=48, fps=16.0,
                                 meta={"action": f"a{i % 3}", "subject_id": f"s{i // 3}"}))
    return out


def test_seeds_option_sets_the_probe_seeds_and_rows_carry_intervals_and_chance():
    videos = _toy_videos()
    res = score_sets({"raw": {"ar": videos}}, ("ar",), {"ar": "ar"}, split="test", seeds=[7, 8, 9, 10, 11])
    top1 = next(r for r in res if r["metric"] == "top1")
    assert top1["n_seeds"] == 5 and top1["chance"] == pytest.approx(1 / 3)
    assert top1["sd"] < 0.01 and top1["ci_low"] > top1["chance"]  # convex probe: seeds agree; a real signal
    # the interval is the bootstrap over the 10 test PEOPLE (3 videos each), as stats computes it from the
    # probe's per-video hits, not over the 30 videos
    sc = res.scored["ar"]["raw"]
    test = [v for v in videos if v.split == "test"]
    assert sc.clusters is not None and len(set(sc.clusters)) == 10 and len(test) == 30
    want = stats.interval(sc.metrics["top1"], 5, 30, same=sc.same_outputs, bounded=True,
                          clusters=stats.cluster_codes(v.meta["subject_id"] for v in test))
    assert (top1["ci_low"], top1["ci_high"]) == pytest.approx((max(0.0, want["ci_low"]), min(1.0, want["ci_high"])))


def test_validation_split_is_carved_from_train_and_never_touches_test():
    videos = _toy_videos()
    train, val = task_split(videos, "val", "ar")
    assert val and train and {v.split for v in val} == {"train"} and {v.split for v in train} == {"train"}
    assert not {v.video_id for v in val} & {v.video_id for v in train}
    assert not {v.meta["subject_id"] for v in val} & {v.meta["subject_id"] for v in train}  # whole subjects
    again, val2 = carve_validation([v for v in videos if v.split == "train"])
    assert [v.video_id for v in val2] == [v.video_id for v in val]                         # deterministic
    res = score_sets({"raw": {"ar": videos}}, ("ar",), {"ar": "ar"}, split="val", seeds=[0])
    scored = set(res.scored["ar"]["raw"].test_ids)
    assert scored == {v.video_id for v in val} and not scored & {v.video_id for v in videos if v.split == "test"}


def test_the_selection_holdout_has_people_of_its_own_and_never_moves_the_validation_split():
    import dataclasses

    videos = _toy_videos()
    probe, val = task_split(videos, "val", "ar")
    probe_s, select = task_split(videos, "select", "ar")
    who = lambda vs: {v.meta["subject_id"] for v in vs}  # noqa: E731
    assert select and val and not who(select) & who(val) and not who(select) & who(probe)
    assert probe == probe_s and not who(probe) & (who(val) | who(select))  # probes never train on a holdout's people
    assert {v.split for v in select} == {"train"} and not who(select) & who(v for v in videos if v.split == "test")
    # the validation carve is where it was before selection existed: the first fifth of the people by hash
    assert [v.video_id for v in val] == [v.video_id for v in carve_validation([v for v in videos
                                                                               if v.split == "train"])[1]]
    # a dataset's own selection videos are used as they are, and then only validation is carved: the first people
    # by hash again (a fifth of the fewer train people left)
    own = [dataclasses.replace(v, split="select") if v.video_id in {x.video_id for x in select} else v for v in videos]
    assert [v.video_id for v in task_split(own, "select", "ar")[1]] == [v.video_id for v in select]
    val_own = task_split(own, "val", "ar")[1]
    assert val_own and {v.video_id for v in val_own} <= {v.video_id for v in val}
    with pytest.raises(ValueError, match="split must be"):
        task_split(videos, "selection", "ar")


# ---------------------------------------------------------------- the two-sided gate

def test_utility_verdict_refuses_a_version_at_chance_whatever_its_retention_interval():
    m = {"ar": {"raw": 0.7, "anon": 0.34, "chance": 1 / 3, "retention": 0.02, "retention_ci_high": 0.95,
                "no_signal": False, "anon_at_chance": True}}
    ok, why = ledger.utility_verdict(m, 0.9)
    assert not ok and "at chance" in why
    m["ar"].update(anon=0.69, retention=0.97, retention_ci_high=1.05, anon_at_chance=False)
    assert ledger.utility_verdict(m, 0.9)[0]
    m["ar"].update(no_signal=True, anon_at_chance=True)   # raw itself at chance: nothing to retain, said so
    ok, why = ledger.utility_verdict(m, 0.9)
    assert ok and "nothing to retain" in why


def test_publish_never_makes_current_a_version_with_ar_at_chance(gated_store):
    store = gated_store
    eraser = save_version(store, "eraser")
    out = _publish(store, eraser)
    assert ledger.current_version(store) is None
    checks = out["checks"]
    assert checks["privacy_budget"]["passed"] is True            # budget -1: the privacy side holds
    assert checks["utility_budget"]["passed"] is False and "ar:" in checks["utility_budget"]["description"]
    v = ledger.read_verdicts(store, eraser)
    assert v["utility"]["passed"] is False and v["utility"]["split"] == "val"
    assert eraser in ledger.refused_versions(store)
    # the gate scored the validation split only: its cached measurement names it, and the report's test split
    # videos never appear among the videos it scored
    m = store.files.read_json(f"reports/gates/{eraser}.json")["measure"]
    assert m["split"] == "val" and {r["split"] for r in m["rows"]} == {"val"}
    test_ids = {r["video_id"] for s in store.committed_shards() for r in store.read_shard_manifest(s).to_pylist()
                if r["split"] == "test"}
    assert set(m["scored_videos"]) == {"ar", "privacy", "clip_privacy", "reid"}
    for task, ids in m["scored_videos"].items():
        assert ids and not set(ids) & test_ids, task     # the gate never scores a video the report scores
    assert {i for i in m["scored_videos"]["ar"]} == {f"ar_val_{i:03d}" for i in range(30)}  # AR's own val split

    gentle = save_version(store, "gentle")
    _publish(store, gentle)
    assert ledger.current_version(store) == gentle
    assert ledger.read_verdicts(store, gentle)["utility"]["passed"] is True


def test_refused_version_shows_a_failed_blocking_check_in_dagster(gated_store):
    from assets.anonymized import anonymized_features
    from assets.evaluation import privacy_budget, utility_budget
    from assets.partitions import shards
    from assets.resources import StoreResource
    from pipeline.reanonymize import anonymize_run_config

    store = gated_store
    eraser = save_version(store, "eraser")
    inst = dg.DagsterInstance.ephemeral()
    inst.add_dynamic_partitions(shards.name, store.committed_shards())
    res = dg.materialize([anonymized_features, privacy_budget, utility_budget], instance=inst, partition_key="ar-000",
                         resources={"store": StoreResource(root=str(store.root))}, raise_on_error=False,
                         run_config=anonymize_run_config(eraser))
    evals = {e.check_name: e for e in res.get_asset_check_evaluations()}
    assert evals["utility_budget"].passed is False and evals["utility_budget"].blocking
    assert evals["utility_budget"].severity == dg.AssetCheckSeverity.ERROR
    assert evals["privacy_budget"].passed is True and not res.success   # a failed blocking check fails the run


# ---------------------------------------------------------------- promotion from the command line

def test_cli_promote_force_reason_and_rollback(gated_store, capsys):
    from pipeline.cli import main

    store = gated_store
    gentle = save_version(store, "gentle")
    _publish(store, gentle)
    eraser = save_version(store, "eraser")
    _publish(store, eraser)
    assert ledger.current_version(store) == gentle
    root = str(store.root)
    assert main(["--store", root, "promote", eraser]) == 2                        # refused by the utility gate
    assert "--force --reason" in capsys.readouterr().err
    assert main(["--store", root, "promote", eraser, "--force"]) == 2             # a reason is required
    assert main(["--store", root, "promote", eraser, "--force", "--reason", "incident 42: need a stopgap"]) == 0
    assert "FORCED" in capsys.readouterr().out and ledger.current_version(store) == eraser
    row = next(r for r in ledger.read_versions(store).to_pylist() if r["version"] == eraser)
    assert row["promotion"] == "forced: incident 42: need a stopgap"
    assert main(["--store", root, "rollback"]) == 0
    assert ledger.current_version(store) == gentle and f"was {eraser}" in capsys.readouterr().out
    assert [e["action"] for e in ledger.ledger_log(store)][-2:] == ["force-promote", "rollback"]


def test_cli_evaluate_scores_the_current_version_with_the_given_seeds(gated_store, capsys):
    from pipeline.cli import main

    store = gated_store
    gentle = save_version(store, "gentle")
    _publish(store, gentle)
    capsys.readouterr()
    assert main(["--store", str(store.root), "evaluate", "--seed", "3"]) == 0
    out = capsys.readouterr().out
    assert f"scoring AAM version {gentle}: the current version; probe seeds 3..7" in out
    report = store.files.read_json("reports/privacy_utility.json")
    assert report["aam_version"] == gentle and report["aam_version_is_current"] and report["probe_seeds"] == [3, 4, 5, 6, 7]
    raw = report["rows"][0]["intervals"]
    assert raw["ar_top1"]["n_seeds"] == 5 and raw["ar_top1"]["chance"] == pytest.approx(1 / 3)
    assert "| chance |" in out and "95% interval" in out


def test_score_features_scores_a_candidate_transform_on_validation(gated_store):
    from splavu_core.evaluation.scoring import score_features

    store = gated_store
    keep_noise = lambda x: np.concatenate([np.zeros_like(x[:, :-1]), x[:, -1:]], axis=1)  # noqa: E731  AR at chance
    rows = score_features(store, keep_noise, split="val", seeds=range(5), which=("ar", "privacy"))
    by = {(r["feature_set"], r["task"], r["metric"]): r for r in rows}
    assert {r["split"] for r in rows} == {"val"} and {r["n_seeds"] for r in rows if r["task"] == "ar"} == {5}
    raw, cand = by[("raw", "ar", "top1")], by[("candidate", "ar", "top1")]
    assert raw["ci_low"] > raw["chance"] and cand["ci_low"] <= cand["chance"]   # the candidate lost every action
    d = by[("candidate", "ar", "delta_top1")]
    assert d["ci_high"] < 0 and d["value"] == pytest.approx(cand["value"] - raw["value"])
    assert by[("candidate", "ar", "retention_top1")]["ci_low"] < 0.5
    lr = by[("candidate", "privacy", "leakage_removed")]
    # consistent with removing it all, on 16 carved validation videos: the interval holds 1 and is wide
    assert lr["ci_low"] < 1.0 < lr["ci_high"] and lr["ci_high"] - lr["ci_low"] > 0.2
