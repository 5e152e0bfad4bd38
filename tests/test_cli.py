"""The `splavu` command line, run as a user would (in-process main())."""

import pytest

from pipeline.cli import main


def test_synth_prints_counts(tmp_path, capsys):
    assert main(["synth", "--scale", "tiny", "--out", str(tmp_path / "b"), "--datasets", "gait", "privacy", "--quiet"]) == 0
    out = capsys.readouterr().out
    assert "gait" in out and "privacy" in out and (tmp_path / "b" / "gait" / "manifest.csv").is_file()
    line = next(l for l in out.splitlines() if l.startswith("privacy"))
    assert line.split()[1] == "80"  # tiny: 48 train + 32 test


def test_ingest_registers_shards_and_reports_bad_manifest(tiny_bench, tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("DAGSTER_HOME", raising=False)
    root, _ = tiny_bench
    store = str(tmp_path / "store")
    assert main(["--store", store, "ingest", "ar", str(root / "ar" / "manifest.csv"), "--shard-size", "25"]) == 0
    assert "ar: 3 shard(s): ar-000 ar-001 ar-002" in capsys.readouterr().out
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "manifest.csv").write_text("video_id,path,split\nx,../x.mp4,train\n")
    assert main(["--store", store, "ingest", "bad", str(bad / "manifest.csv")]) == 2
    err = capsys.readouterr().err
    assert "row 1 (video_id 'x'), column 'path'" in err and "refused" in err


def test_unknown_dataset_is_a_clear_error(tmp_path, capsys):
    assert main(["--store", str(tmp_path), "extract", "--dataset", "nope"]) == 2
    assert "not registered" in capsys.readouterr().err


def test_ingest_then_extract_in_one_command_without_dagster_home(tiny_bench, tiny_videomae, tmp_path, monkeypatch):
    """`splavu extract` after `ingest` in the same process (as `splavu demo` does) with no $DAGSTER_HOME:
    both must see the same instance, or the new shard partitions are unknown to extract."""
    monkeypatch.delenv("DAGSTER_HOME", raising=False)
    root, _ = tiny_bench
    store = str(tmp_path / "store")
    assert main(["--store", store, "ingest", "gait", str(root / "gait" / "manifest.csv")]) == 0
    assert main(["--store", store, "extract", "--dataset", "gait", "--checkpoint", str(tiny_videomae)]) == 0
    assert (tmp_path / "store" / "latents" / "gait-000" / "_COMMIT.json").is_file()


def test_evaluate_says_each_skipped_task_once(tmp_path):
    """The skipped tasks of a store with no data, as the evaluation (scoring.score_sets, what `evaluate` runs)
    reports them for raw and splavu: one line for every task without a dataset (not one per task and feature set)."""
    from pipeline.cli import skip_lines
    from splavu_core.evaluation.scoring import score_sets
    from splavu_core.evaluation.suite import TASKS
    from splavu_core.datasets import task_datasets
    from splavu_core.store import FeatureStore

    datasets = task_datasets(FeatureStore(tmp_path))  # nothing registered: every task lacks its dataset
    res = score_sets({"raw": {}, "splavu": {}}, TASKS, datasets)
    assert list(res) == [] and set(res.skipped) == set(TASKS) | {f"splavu:{t}" for t in TASKS}
    lines = skip_lines(res.skipped)
    assert lines == [f"skipped {', '.join(sorted(TASKS))}: no dataset is registered with those roles "
                     f"(splavu ingest NAME MANIFEST --roles ROLE)"]
    assert skip_lines({"gait": "dataset 'walks': one walk per subject", "splavu:gait": "dataset 'walks': one walk "
                       "per subject"}) == ["skipped gait (raw, splavu): dataset 'walks': one walk per subject"]


def test_pair_matching_line_names_its_chance_level():
    """Chance is 1 / the group each top-1 is taken among, stated with the number of held-out videos (it used to
    print a bare "chance 0.031" whatever the held-out set)."""
    import numpy as np

    from pipeline.cli import pair_matching_line
    from splavu_core.aam.diagnostics import heldout_split, pair_matching_report

    static = np.random.default_rng(0).standard_normal((90, 2, 8)).astype(np.float32)
    fit, held = heldout_split(90)
    raw = pair_matching_report(static, None, fit, held, steps=3)
    from assets.aam import _diagnostic_metadata

    md = {k: v.value for k, v in _diagnostic_metadata({"raw": raw, "selected": raw, "during": []}).items()}
    line = pair_matching_line(md)
    assert f"top-1 among 32 of {len(held)} held-out videos (chance 1/32 = 0.031): static↔static" in line


def test_version_metrics_name_losses_as_losses():
    from assets.aam import version_metrics

    summary = {"selected_epoch": 3, "final": {"epoch": 3, "lc": 0.1, "ar": 1.2, "total": 2.0, "val_ar_top1": 0.6,
                                              "pm_static_static": 0.2}}
    assert version_metrics(summary) == {"selected_epoch": 3, "lc_loss": 0.1, "ar_loss": 1.2, "total_loss": 2.0,
                                        "val_ar_top1": 0.6, "pm_static_static": 0.2}


def test_demo_leaves_out_bias_and_gait_by_default_and_the_report_says_so(tmp_path):
    """The default demo runs ar, privacy, tad, ad; --with / --full add the Bias-F/M and gait sets. What was left
    out, and each stage's wall time, land in the report's cost section (not omitted silently)."""
    from pipeline.cli import demo_datasets
    from splavu_core import costs
    from splavu_core.evaluation.report import costs_markdown
    from splavu_core.store import FeatureStore, StoreError

    names, left = demo_datasets(None)
    assert names == ["ar", "privacy", "tad", "ad"] and set(left) == {"bias", "gait"}
    names, left = demo_datasets("bias")
    assert names == ["ar", "privacy", "tad", "ad", "bias_f", "bias_m"] and set(left) == {"gait"}
    assert demo_datasets(None, full=True) == (["ar", "privacy", "tad", "ad", "bias_f", "bias_m", "gait"], {})
    with pytest.raises(StoreError, match="unknown group"):
        demo_datasets("bias,faces")

    store = FeatureStore(tmp_path / "store")
    costs.record_demo(store, {"install": None, "synth": 61.2, "extract": 120.0, "fit": 3.0, "publish": 20.0,
                              "gates": 9.0, "evaluate": 50.0, "curve": 14.0}, demo_datasets(None)[1])
    c = costs.compare(store, "v0", [], {})
    md = "\n".join(costs_markdown(c))
    assert "| install | synth | extract | fit | publish | gates | evaluate | curve | total |" in md
    assert "| — | 61 | 120 | 3 | 20 | 9 | 50 | 14 | 277 |" in md
    assert "**Not run in this demo: bias**" in md and "**Not run in this demo: gait**" in md
    assert "install: not measured" in md
