"""The `splavu` command line, run as a user would (in-process main())."""

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
