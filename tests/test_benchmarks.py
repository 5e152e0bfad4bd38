"""Every script in benchmarks/ runs, at tiny sizes, and prints the JSON its README figures come from.

Each runs as `python benchmarks/<name>.py` in a subprocess (as a user runs it), on the session's tiny benchmark and
store (tiny random VideoMAE) where it reads one; only its exit status and the keys of its JSON are checked: the
figures themselves mean nothing at these sizes. A benchmark that breaks (benchmarks/publish.py once crashed on a
renamed helper and nobody saw) fails here.
"""
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[1]


def last_json(stdout: str):
    """The JSON objects a benchmark printed (indented or one per line), after any plain lines: the last one, or
    the list of them when it printed several."""
    dec, found, pos = json.JSONDecoder(), [], 0
    for m in re.finditer(r"(?m)^\{", stdout):
        if m.start() < pos:
            continue
        obj, pos = dec.raw_decode(stdout, m.start())
        found.append(obj)
    assert found, f"no JSON in the output:\n{stdout[-2000:]}"
    return found[-1] if len(found) == 1 else found


def run_bench(name: str, *args, timeout: int = 240):
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    p = subprocess.run([sys.executable, str(REPO / "benchmarks" / f"{name}.py"), *map(str, args)], cwd=REPO, env=env,
                       capture_output=True, text=True, timeout=timeout)
    assert p.returncode == 0, f"{name} failed (rc {p.returncode}):\n{p.stderr[-3000:]}"
    return last_json(p.stdout)


@pytest.fixture(scope="module")
def store_copy(tiny_store, tmp_path_factory):
    """A copy of the session's tiny store: some benchmarks write reports into the store they read."""
    import shutil

    dst = tmp_path_factory.mktemp("bench_store") / "store"
    shutil.copytree(tiny_store, dst)
    return dst


def test_extract(tiny_bench, tiny_videomae):
    root, _ = tiny_bench
    out = run_bench("extract", "--data", root / "tad", "--videos", 3, "--checkpoint", tiny_videomae, "--static-k", 2,
                    "--rounds", 2, "--decoders", 2)
    assert set(out["clips_per_s"]) == {"bare_forward", "bare_forward_workers", "prepare_only", "encoder_only",
                                       "decode_only_1", "decode_only_2", "end_to_end_threads", "end_to_end_1",
                                       "end_to_end_2", "naive"}
    rates = out["clips_per_s"]  # on CPU decode and forward share the cores: the ceiling is a harmonic sum
    assert out["decode_ceiling_clips_per_s"] == rates["decode_only_2"]
    assert out["forward_ceiling_clips_per_s"] == rates["bare_forward_workers"]
    assert out["decode_inclusive_ceiling_clips_per_s"] == pytest.approx(
        1 / (1 / rates["bare_forward_workers"] + 1 / rates["decode_only_2"]), abs=0.2)  # rates rounded to 0.1
    assert out["ratio_end_to_end_vs_min_ceiling"] == pytest.approx(
        rates["end_to_end_2"] / min(rates["decode_only_2"], rates["bare_forward_workers"]), rel=0.02)
    assert out["decode_workers_speedup"] == pytest.approx(rates["decode_only_2"] / rates["decode_only_1"], rel=0.02)
    assert out["zarr_bytes_identical"] is True  # decoder processes write the threads path's bytes
    assert out["clips"] > 0 and out["clips_end_to_end"] > out["clips"] and out["static_k"] == 2
    assert [w["decoders"] for w in out["workers"]] == [1, 2]
    for w in out["workers"]:  # where the time goes, per stage, for 1..N decoders
        assert set(w["busy_s"]) == {"decode", "copy", "prepare", "forward", "write"} and w["wall_s"] > 0
        assert all(w["busy_s"][k] > 0 for k in ("decode", "prepare", "forward", "write"))
    for k in ("ratio_end_to_end_vs_threads", "cpu_ratio_end_to_end_vs_threads", "ratio_end_to_end_vs_naive",
              "ratio_end_to_end_vs_decode_inclusive_ceiling"):
        assert out[k] > 0
    assert all(len(r) == 2 for r in out["clips_per_s_each_round"].values())


def test_extract_int8(tiny_bench, tiny_videomae):
    root, _ = tiny_bench
    out = run_bench("extract_int8", "--data", root / "tad", "--videos", 2, "--checkpoint", tiny_videomae, "--rounds", 1)
    assert set(out["clips_per_s"]) == {"fp32", "int8_dynamic"} and out["clips"] > 1
    assert -1.0 <= out["cosine"]["min"] <= out["cosine"]["p01"] <= out["cosine"]["mean"] <= 1.0
    assert out["relative_l2"]["mean"] >= 0 and 0.0 <= out["same_nearest_clip"] <= 1.0


def test_cluster_seeds(store_copy):
    out = run_bench("cluster_seeds", "--store", store_copy, "--seeds", 2, "--probe-seeds", 2,
                    "--config", '{"tasks": ["ar"]}')
    seeds, summary = out[:-1], out[-1]
    assert [s["seed"] for s in seeds] == [0, 1] and summary["seeds"] == 2 and summary["summary"] == "closeups"
    for s in seeds:
        low, high = s["closeups"][1], s["closeups"][2]
        assert low <= s["closeups"][0] <= high and s["ar"] is not None
    assert 0 <= summary["passing_at_lower_end"] <= 2 and summary["publishing"] == sum(s["publishes"] for s in seeds)
    for s in seeds:  # publishing needs both gates: the privacy parts' lower ends, and AR not refused by the gate's rule
        assert s["publishes"] == (s["privacy_passes"] and not s["ar_refused"])
        assert s["privacy_passes"] == all(s[p][1] >= 0.5 for p in ("closeups", "clips", "linking") if s[p])
        assert s["ar_refused"] == (s["ar"][0] < 0.95 and s["ar"][2] < 1.0)


def test_cluster_seeds_forget(store_copy):
    """--forget: each drawn training subject erased from the fit and the scored sets, the default refitted."""
    out = run_bench("cluster_seeds", "--store", store_copy, "--forget", 2, "--probe-seeds", 2,
                    "--config", '{"tasks": ["ar"]}')
    runs, summary = out[:-1], out[-1]
    assert len({r["subject"] for r in runs}) == 2 and summary["subjects"] == 2
    assert all(isinstance(r["publishes"], bool) and r["closeups"][1] <= r["closeups"][0] for r in runs)


def test_publish_rule(store_copy, tmp_path):
    """Per k-means seed: the rule picks among the candidates on selection, the pick alone is judged on validation by
    the gates' rules and read on test; the record holds the runs and the rate."""
    record = tmp_path / "rate.json"
    out = run_bench("publish_rule", "--store", store_copy, "--seeds", 0, 1, "--candidates", "default", "k14",
                    "--probe-seeds", 2, "--config", '{"tasks": ["ar"]}', "--test", "--record", record,
                    "--label", "smoke")
    runs, summary = out[:-1], out[-1]
    assert [r["seed"] for r in runs] == [0, 1] and summary["runs"] == 2
    for r in runs:
        assert r["chosen"] in ("default", "k14") and set(r["candidates"]) == {"default", "k14"}
        picked = r["candidates"][r["chosen"]]
        assert picked["val"] and all(c["val"] is None for n, c in r["candidates"].items() if n != r["chosen"])
        val = picked["val"]
        assert val["privacy"][1] <= val["privacy"][0] <= val["privacy"][2]
        assert r["privacy_passes"] == all(val.get(t) is not None and val[t][1] >= summary["budget"]
                                          for t in ("privacy", "clip_privacy", "reid") if t in val or t == "privacy")
        assert r["publishes"] == (r["privacy_passes"] and not r["utility_refused"]) and "privacy" in r["test"]
    assert summary["publishing"] == sum(r["publishes"] for r in runs) and sum(summary["chosen"].values()) == 2
    lo, hi = summary["rate_ci95"]
    assert lo <= summary["rate"] <= hi
    saved = json.loads(record.read_text())
    assert saved[0]["label"] == "smoke" and saved[0]["summary"] == summary and len(saved[0]["runs"]) == 2


def test_frontier(store_copy, tmp_path):
    """Members of the three frontiers and a baseline, scored on validation into the record; the plot drawn from it."""
    record, png = tmp_path / "frontier.json", tmp_path / "frontier.png"
    out = run_bench("frontier", "--store", store_copy, "--split", "val", "--members", "closed", "oracle-keep",
                    "learned", "baselines", "--k-closed", 4, "--w", 1, "--k", 4, "--lam", 1, "--stage-seeds", 0,
                    "--epochs", 2, "--seeds", 0, 1, "--record", record)
    names = [m["name"] for m in out]
    assert {"closed k=4", "closed k20-within", "oracle keep k=4 w=1", "learned k=4 l=1 epochs=2 s=0",
            "pca_4", "randproj_4"} <= set(names)
    for m in out:
        assert m["privacy"][1] <= m["privacy"][0] <= m["privacy"][2] and m["ar"][1] <= m["ar"][0] <= m["ar"][2]
    saved = json.loads(record.read_text())
    assert len(saved) == 1 and saved[0]["split"] == "val" and len(saved[0]["members"]) == len(out)
    only = run_bench("frontier", "--store", store_copy, "--split", "val", "--members", "closed", "--k-closed", 4,
                     "--only", "closed k=4", "--seeds", 0, 1, "--record", tmp_path / "only.json")
    assert only["name"] == "closed k=4" and only["privacy"] == out[names.index("closed k=4")]["privacy"]
    run_bench("frontier", "--plot", record, "--split", "val", "--png", png)
    assert png.read_bytes()[:4] == b"\x89PNG"


def test_recentre_members(store_copy):
    names = ["default", "sample-tau4", "clusters200", "vid-poe-sample-tau4", "sample-tau4-split3", "wappw1-blindw1"]
    out = run_bench("recentre_members", "--store", store_copy, "--members", *names,
                    "--cluster-seeds", 0, "--probe-seeds", 2, "--which", "privacy,ar", "--pca", "--unseen")
    assert [(o["member"], o["cluster_seed"]) for o in out[1:]] == [(n, 0) for n in names]
    assert out[0]["member"].startswith("pca_") and out[0]["cluster_seed"] is None
    for o in out:
        value, low, high = o["privacy"]
        assert low <= value <= high and o["ar"] is not None
    assert all("ar_unseen" in o for o in out[1:])  # AR refitted without its labels, per member


def test_recentre_members_draws_the_adapters_rows(store_copy):
    """The harness's drawn members key each clip as the adapter does (keep.clip_uniforms): its rows are the closed
    form's (which tests/test_keep.py ties to the torch adapter), so its figures are the adapter's."""
    import importlib.util

    from splavu_core.aam.closed_form import fit_closed_form
    from splavu_core.aam.config import TrainConfig
    from splavu_core.aam.training_data import load_training_data
    from splavu_core.store.feature_store import FeatureStore

    spec = importlib.util.spec_from_file_location("recentre_members", REPO / "benchmarks" / "recentre_members.py")
    members = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(members)
    data = load_training_data(FeatureStore(store_copy))
    videos = (data.ar_val or data.ar_train)[:12]
    cfg, closed = TrainConfig().replace(recentre_min_people=1), {}  # the harness has no pooling of few people
    for name, adapter, fields in (
            ("k14-sample-tau4", {"keep": 14, "recentre_draw": 4.0}, {}),
            ("k14-sample-tau4-top2", {"keep": 14, "recentre_draw": 4.0, "recentre_top": 2}, {}),
            ("k9-sample-tau2", {"keep": 9, "recentre_draw": 2.0}, {}),
            ("k14-wappw3-sample-tau4-top2", {"keep": 14, "recentre_draw": 4.0, "recentre_top": 2},
             {"keep_w_app": 3.0, "keep_app_within": True})):
        harness = members.member_map(members.parse(name), data, data, cfg)
        closed[name] = fit_closed_form(data, cfg.tasks, adapter["keep"],
                                       cfg.replace(**adapter, **fields))[True]
        for v in videos:
            np.testing.assert_allclose(harness(v.feats, v.feats), closed[name](v.feats), atol=1e-4, err_msg=name)
    salted = members.member_map(members.parse("k14-sample-tau4-salt1"), data, data, cfg)  # another draw: other rows
    assert any(not np.allclose(salted(v.feats, v.feats), closed["k14-sample-tau4"](v.feats), atol=1e-4)
               for v in videos)


def test_gbdt_stability(store_copy):
    out = run_bench("gbdt_stability", "--store", store_copy, "--draws", 1, "--seeds", 2)
    draws, summary = out[:-1], out[-1]
    assert [d["draw"] for d in draws] == [-1, 0] and summary["summary"] == "cmap over draws"
    for name in ("gbdt", "gbdt_seeded", "linear"):
        assert all(0.0 <= d[name] <= 1.0 for d in draws)
        assert summary[name]["min"] <= summary[name]["max"] and summary[name]["sd"] >= 0


def test_publish():
    out = run_bench("publish", "--clips", 800, "--rows-meta", 2000, "--repeats", 1, "--query-runs", 1)
    assert out["ratio_anonymize_vs_parquet_only"] > 0 and set(out["clips_per_s"]) == {"anonymize", "parquet_only"}
    assert {"metadata_aggregate", "cosine_top10", "neighbors"} <= set(out["duckdb_ms"])
    assert "warm_connection_ms" in out["duckdb_ms"]["metadata_aggregate"]


def test_neighbors():
    out = run_bench("neighbors", "--clips", 4000, "--dim", 16, "--shards", 2, "--runs", 2, "--queries", 2,
                    "--nprobe", 2, "--nlist", 8)
    assert out["same_answer"] is True and out["clips"] == 4000
    assert [a["nprobe"] for a in out["approximate"]] == [2] and "exact_warm_ms" in out


def test_train_aam(store_copy):
    out = run_bench("train_aam", "--store", store_copy, "--epochs", 1, "--clips", 24)
    assert out["cached"]["seconds_end_to_end"] > 0 and out["encoder_in_loop"]["subset_adapter_step_s"] > 0
    assert out["ratio_encoder_in_loop_vs_cached_epoch"] > 0 and out["data"]["static_per_video"] >= 2
    # the default's pass is its closed-form fit: every task video and static clip, no sampled clip
    reads = out["encoder_in_loop"]["clips_per_epoch"]
    assert out["adapter_is_closed_form"] and reads["clips"] == 0 and reads["videos"] > 0 and reads["static"] > 0
    trained = run_bench("train_aam", "--store", store_copy, "--epochs", 1, "--clips", 24,
                        "--config", json.dumps({"adapter": {"keep": 14, "layers": 1, "mixer": "mlp"}}))
    assert not trained["adapter_is_closed_form"] and trained["cached"]["epochs_run"] == 1
    assert trained["encoder_in_loop"]["clips_per_epoch"]["clips"] >= 128  # one step's AR batch (TrainConfig.batch)


def test_encoder_quality(tiny_bench, tiny_videomae, store_copy):
    root, _ = tiny_bench
    out = run_bench("encoder_quality", "--data", root, "--checkpoint", tiny_videomae, "--store", store_copy)
    for k in ("ar_top1", "ar_chance", "privacy_cmap", "privacy_chance_cmap", "gait_top1"):
        assert isinstance(out[k], float), k


def test_attribute_visibility(tiny_bench):
    root, _ = tiny_bench
    out = run_bench("attribute_visibility", "--data", root / "privacy", "--epochs", 1)
    assert 0 <= out["cmap"] <= 1 and isinstance(out["all_visible"], bool) and out["attributes"]


@pytest.fixture(scope="module")
def tiny_v2_ar(tmp_path_factory):
    """action_visibility reads v2's interaction classes (the session's tiny benchmark is v1), with the masks."""
    from splavu_core.ingest.synth.datasets import generate

    out = tmp_path_factory.mktemp("bench_v2")
    generate(out, "tiny", seed=0, workers=2, datasets=("ar",))
    return out / "ar"


def test_action_visibility(tiny_v2_ar):
    out = run_bench("action_visibility", "--data", tiny_v2_ar, "--epochs", 1, "--side", 16)
    assert {"raw", "pixel_blacken"} <= set(out) and out["n_test"] > 0 and out["epochs"] == 1


def test_pixel_baselines(tiny_bench, tiny_videomae):
    root, _ = tiny_bench
    out = run_bench("pixel_baselines", "--data", root / "ar", "--videos", 2, "--checkpoint", tiny_videomae,
                    "--baselines", "blur", "--repeats", 1)
    assert {"raw", "raw_clips_only", "pixel_blur", "anonymize"} <= set(out["clips_per_s"])
    assert out["raw"]["clips"] > 0 and "pixel_blur" in out["change_ratio"]


def test_projection_sweep(store_copy):
    out = run_bench("projection_sweep", "--store", store_copy, "--ranks", 8, "--tasks", "ar", "--seeds", 0)  # cheapest
    assert {"raw", "raw_pair_matching", "projected"} <= set(out)
    assert [e["rank"] for e in out["projected"]] == [8] and out["projected"][0]["ar"] is not None


def test_keep_sweep(store_copy):
    out = run_bench("keep_sweep", "--store", store_copy, "--k", 4, "--seeds", 0)
    members, summary = out[:-1], out[-1]
    assert summary["split"] == "select" and [m["k"] for m in members] == [4]  # selection, never the gates' videos
    assert "privacy" in members[0] and "ar" in members[0]
    assert (Path(store_copy) / "reports" / "keep_family_select.json").is_file()


def test_anchor_sweep(store_copy, tiny_videomae):
    out = run_bench("anchor_sweep", "--store", store_copy, "--checkpoint", tiny_videomae, "--k", 4, "--seeds", 0,
                    "--baselines")
    members, summary = out[:-1], out[-1]
    assert summary["split"] == "val" and summary["videos_anchored"] > 0
    assert [m["name"] for m in members] == ["anchored keep k=4", "keep k=4", "pca_4", "randproj_4", "anchored pca_4"]
    assert [m["anchored"] for m in members] == [True, False, False, False, True]
    assert all("privacy" in m and "clip_privacy" in m for m in members)


def test_reuse_sweep(store_copy):
    out = run_bench("reuse_sweep", "--store", store_copy, "--k", 4, "--seeds", 0, "--fits", "ar", "--codebooks", 2,
                    "--ranks", 2, "--quantiles", 0.9, "--pca", "--clip-codebooks", 0, "--strengths", 0, 0.5)
    fits, members, summary = out[:1], out[1:-1], out[-1]
    assert fits[0]["fit"] == ["ar"] and 0 <= fits[0]["appearance_r2"] <= 1
    names = [m["name"] for m in members]
    assert names[:6] == ["keep | fit ar", "recentre | fit ar", "app 2 | fit ar", "codebook 2 | fit ar",
                         "codebook 2 q0.9 | fit ar", "codebook 2 app 2 | fit ar"] and names[-1] == "pca_4"
    clipwise = names[6:-1]  # 0 clusters asked: the config's own count; strength 0 and 0.5 at both quantiles
    assert len(clipwise) == 4 and all(re.fullmatch(r"clipwise \d+ q0\.(95|9) a0(\.5)? \| fit ar", n) for n in clipwise)
    assert all("privacy" in m and "ar" in m for m in members) and summary["split"] == "val"
    keep, moved_none = members[0], next(m for m in members if m["name"].endswith("a0 | fit ar"))
    assert all(keep[t] == moved_none[t] for t in ("privacy", "ar"))  # strength 0: the frontier's keep-alone end


def test_probe_stability(store_copy):
    out = run_bench("probe_stability", "--store", store_copy, "--tasks", "ar", "--seeds", 2)
    assert list(out["tasks"]) == ["ar"] and len(out["tasks"]["ar"]["per_seed"]) == 2
    ar = out["tasks"]["ar"]  # the interval is the bootstrap's (convex probe: the seeds agree), over the test people
    assert ar["ci_high"] - ar["ci_low"] > 0 and ar["sd"] < 1e-3 and ar["people"] and ar["people"] < ar["n_test"]


def test_metric_speed():
    out = run_bench("metric_speed", "--videos", 40, "--attributes", 2, "--boot", 10, "--frames", 20, "--repeats", 1,
                    "--fit-scale", 0.05)
    for k in ("cmap_resamples", "macro_f1_resamples", "auc_resamples", "auc_one_set"):
        assert out[k]["splavu_s"] > 0 and out[k]["sklearn_over_splavu"] > 0
    assert set(out["fit_logistic"]) == {"ar", "tad", "ad"}
    assert all(f["max_abs_prob_diff"] < 1e-2 for f in out["fit_logistic"].values())  # the same optimum


def test_concurrency(tiny_store):
    """Readers querying while a version is published, promoted and a training subject forgotten (the refit
    included): at 2 readers for about a second each, no raw error, no half-published version, nothing stale or
    erased after an operation returned. About a minute: three real operations, two of them through both gates."""
    out = run_bench("concurrency", "--store", tiny_store, "--readers", 2, "--seconds", 1, "--pause", 0.05, timeout=400)
    assert list(out["operations"]) == ["reanonymize", "promote", "forget"]
    for name, op in out["operations"].items():
        assert sum(op["queries"].values()) > 0 and op["version_after"], name
        assert op["errors"]["raw"] == 0 and op["multiline_errors"] == 0, (name, op["raw_examples"])
        for key in ("half_published", "mixed_versions", "stale_after", "erased_seen_after"):
            assert op[key] == 0, (name, key, op)
    assert out["operations"]["forget"]["version_after"] not in (out["operations"]["forget"]["version_before"], None)


def test_every_benchmark_has_a_smoke_test():
    """A new script in benchmarks/ needs its test here (dask_workers: tests/test_cluster.py, it starts a cluster;
    forget: tests/test_forget.py, beside the erasure it measures)."""
    names = {p.stem for p in (REPO / "benchmarks").glob("*.py")}
    here = {n[len("test_"):] for n in globals() if n.startswith("test_")} | {"dask_workers", "forget"}
    assert names <= here, f"benchmarks without a smoke test: {sorted(names - here)}"


def test_benchmarks_import_the_installed_library():
    """Benchmarks import splavu as any user of the installed package does (`pip install -e .`), not through a
    patched sys.path that could pick up another checkout."""
    patched = sorted(p.stem for p in (REPO / "benchmarks").glob("*.py") if "sys.path" in p.read_text())
    assert not patched, f"benchmarks that patch sys.path: {patched}"
