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


def test_extract_learns_shards_an_instance_never_saw(tiny_bench, tiny_videomae, tmp_path, monkeypatch):
    """`splavu extract` after `ingest` recorded the shards in another Dagster instance (DAGSTER_HOME exported only
    afterwards): the store's registration is the truth, so extract adds the partitions it lacks instead of failing
    with DagsterUnknownPartitionError."""
    monkeypatch.delenv("DAGSTER_HOME", raising=False)
    root, _ = tiny_bench
    store = str(tmp_path / "store")
    assert main(["--store", store, "ingest", "gait", str(root / "gait" / "manifest.csv")]) == 0
    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path / "exported_later"))
    assert main(["--store", store, "extract", "--dataset", "gait", "--checkpoint", str(tiny_videomae)]) == 0
    assert (tmp_path / "store" / "latents" / "gait-000" / "_COMMIT.json").is_file()


def test_fresh_shells_without_dagster_home_share_one_instance(tiny_bench, tiny_videomae, tmp_path):
    """Each README line in its own shell, $DAGSTER_HOME unset: `extract` knows the shards `ingest` added, the folder
    is announced once, and `dagster dev` on it would list the runs (they are in its run storage)."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    import dagster as dg

    root, _ = tiny_bench
    home = tmp_path / "instance"
    env = {k: v for k, v in os.environ.items() if k != "DAGSTER_HOME"}
    env.update(SPLAVU_DAGSTER_HOME=str(home), PATH=f"{Path(sys.executable).parent}:{env.get('PATH', '')}")
    store = tmp_path / "my_store"
    errs = []
    for line in (f"splavu --store {store} ingest walks {root / 'gait' / 'manifest.csv'} --roles gait",
                 f"splavu --store {store} extract --checkpoint {tiny_videomae}"):
        p = subprocess.run(["bash", "-c", line], env=env, capture_output=True, text=True, cwd=tmp_path)
        assert p.returncode == 0 and "Traceback" not in p.stderr, p.stderr
        errs.append(p.stderr)
    assert f"note: Dagster runs are recorded in {home}" in errs[0] and f"DAGSTER_HOME={home} dagster dev" in errs[0]
    assert "note: Dagster runs are recorded" not in errs[1]  # once per folder
    assert (store / "latents" / "walks-000" / "_COMMIT.json").is_file()
    inst = dg.DagsterInstance.from_config(str(home))
    assert inst.get_dynamic_partitions("shards") == ["walks-000"]
    assert {r.job_name for r in inst.get_runs()} == {"extract_latents"}


def test_the_default_instance_folder_is_the_checkouts(monkeypatch):
    """With neither $DAGSTER_HOME nor $SPLAVU_DAGSTER_HOME, the CLI uses the checkout's .dagster_home: the folder the
    Makefile exports, which `make ui` shows, and the one the docs' `dagster dev` line names."""
    from pipeline import runner

    monkeypatch.delenv("SPLAVU_DAGSTER_HOME")
    assert runner.instance_dir() == runner.PROJECT / ".dagster_home"
    assert "export DAGSTER_HOME := $(CURDIR)/.dagster_home" in (runner.PROJECT / "Makefile").read_text()
    assert "make ui" in (runner.PROJECT / "README.md").read_text()
    assert "DAGSTER_HOME=$PWD/.dagster_home" in (runner.PROJECT / "docs" / "dagster.md").read_text()


def test_an_unexpected_error_is_one_line_too(tmp_path, capsys, monkeypatch):
    from pipeline import cli

    def broken(args):
        raise KeyError("clip_latents")

    monkeypatch.setattr(cli, "cmd_synth", broken)
    assert cli.main(["synth", "--out", str(tmp_path)]) == 1
    err = capsys.readouterr().err
    assert err.strip() == ("splavu: error: unexpected KeyError: 'clip_latents' (a bug in splavu; SPLAVU_TRACEBACK=1 "
                           "prints the traceback)")
    monkeypatch.setenv("SPLAVU_TRACEBACK", "1")
    with pytest.raises(KeyError):
        cli.main(["synth", "--out", str(tmp_path)])


def test_evaluate_says_each_skipped_task_once(tmp_path):
    """The skipped tasks of a store with no data, as the evaluation (scoring.score_sets, what `evaluate` runs)
    reports them for raw and splavu: one line for every task without a dataset (not one per task and feature set)."""
    from pipeline.messages import skip_lines
    from splavu_core.evaluation.scoring import score_sets
    from splavu_core.evaluation.suite import TASKS
    from splavu_core.ingest.datasets import task_datasets
    from splavu_core.store.feature_store import FeatureStore

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

    from pipeline.messages import pair_matching_line
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
    """The default demo runs ar, privacy, tad, ad and gait; --with bias / --full add the Bias-F/M sets. What was left
    out, and each stage's wall time, land in the report's cost section (not omitted silently)."""
    from pipeline.demo import demo_datasets
    from splavu_core.evaluation.report import costs_markdown
    from splavu_core.store import costs
    from splavu_core.store.feature_store import FeatureStore, StoreError

    names, left = demo_datasets(None)
    assert names == ["ar", "privacy", "tad", "ad", "gait"] and set(left) == {"bias"}
    names, left = demo_datasets("bias")
    assert names == ["ar", "privacy", "tad", "ad", "bias_f", "bias_m", "gait"] and left == {}
    assert demo_datasets("gait") == demo_datasets(None)                    # already in: older scripts still run
    assert demo_datasets(None, full=True) == (["ar", "privacy", "tad", "ad", "bias_f", "bias_m", "gait"], {})
    with pytest.raises(StoreError, match="unknown group"):
        demo_datasets("bias,faces")

    store = FeatureStore(tmp_path / "store")
    costs.record_demo(store, {"install": None, "synth": 61.2, "extract": 120.0, "fit": 3.0, "publish": 20.0,
                              "gates": 9.0, "evaluate": 50.0}, demo_datasets(None)[1])
    c = costs.compare(store, "v0", [], {})
    md = "\n".join(costs_markdown(c))
    assert "| install | synth | extract | fit | publish | gates | evaluate | total |" in md
    assert "| — | 61 | 120 | 3 | 20 | 9 | 50 | 263 |" in md
    assert "**Not run in this demo: bias**" in md and "Not run in this demo: gait" not in md
    assert "install: not measured" in md


def test_the_demo_cost_section_says_what_each_stage_scored_and_reused(tmp_path, monkeypatch):
    """StageClock counts, per stage, the measurements scoring ran and those it took from the run's caches (the
    gates' share moved out of publishing with their seconds); the report's cost section prints them."""
    from pipeline.demo import StageClock
    from splavu_core.evaluation import score_cache, scoring
    from splavu_core.evaluation.report import costs_markdown
    from splavu_core.store import costs
    from splavu_core.store.feature_store import FeatureStore

    monkeypatch.setattr(scoring, "MEASUREMENTS", {"scored": 5, "reused": 1})  # an earlier run in this process
    monkeypatch.setattr(score_cache, "COUNTS", {"hit": 3, "miss": 2})
    clock = StageClock()
    clock.lap("fit")
    scoring.MEASUREMENTS.update(scored=17, reused=1)
    clock.lap("publish")
    clock.split_gates({"run_seconds": {"a": {"seconds": 30.0, "gates": True}, "b": {"seconds": 2.0, "gates": False}}})
    scoring.MEASUREMENTS.update(scored=40, reused=9)
    score_cache.COUNTS.update(hit=10)
    clock.lap("evaluate")
    assert clock.measurements == {"gates": {"scored": 12, "reused": 0, "read_back": 0},
                                  "evaluate": {"scored": 23, "reused": 8, "read_back": 7}}
    assert clock.stages["gates"] == 28.0

    store = FeatureStore(tmp_path / "store")
    costs.record_demo(store, {**clock.stages, "install": None}, {}, measurements=clock.measurements)
    md = "\n".join(costs_markdown(costs.compare(store, "v0", [], {})))
    assert "Measurements (a task's protocol on one feature set): gates 12 scored, 0 reused; evaluate 23 scored, " \
           "8 reused (7 reader or attacker runs read back from the store's score cache)." in md


def test_the_analysts_commands_load_neither_dagster_nor_torch(tmp_path):
    """`splavu sql` and `splavu neighbors` answer in a fraction of a second: the CLI reaches Dagster, torch and the
    assets only through `launch` (and the commands that need them), which these never call."""
    import subprocess
    import sys

    from splavu_core.serve.catalog import build_catalog
    from splavu_core.store.feature_store import FeatureStore

    (tmp_path / "store").mkdir()
    build_catalog(FeatureStore(tmp_path / "store"))
    store = str(tmp_path / "store")
    code = ("import sys; from pipeline.cli import main; "
            f"rcs = [main(['--store', {store!r}, 'sql', 'SELECT count(*) AS n FROM videos']), "
            f"main(['--store', {store!r}, 'neighbors', 'ar_00003'])]; "
            "print(rcs, [m for m in ('torch', 'dagster', 'pipeline.runner', 'assets') if m in sys.modules])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip().splitlines()[-1] == "[0, 2] []", out.stdout + out.stderr
    assert "no AAM version" in out.stderr  # neighbors ran as far as the store, not just the parser
