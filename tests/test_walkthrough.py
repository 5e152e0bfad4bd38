"""The tutorial's "Your own videos" walk-through (docs/tutorial.md; the README shows the same lines), line by line, through the CLI's main(): datasets under
non-default names with roles, training with AR data only, evaluation, no config file, no traceback."""
import re
import shlex
from pathlib import Path

import pytest

from pipeline import runner
from pipeline.cli import main
from splavu_core.extract.sampling import ClipSampling
from splavu_core.store.feature_store import FeatureStore

TUTORIAL = Path(__file__).resolve().parents[1] / "docs" / "tutorial.md"


def walkthrough_lines() -> list[list[str]]:
    text = TUTORIAL.read_text()
    section = text[text.index("## 3. Your own videos, start to finish"):]
    block = re.search(r"```bash\n(.*?)```", section, re.S).group(1)
    lines = [shlex.split(line) for line in block.splitlines() if line.strip()]
    assert lines[0] == ["source", ".venv/bin/activate"]  # `make setup` leaves splavu in .venv/bin, off the PATH
    return lines[1:]


def test_readme_walkthrough(tiny_bench, tiny_videomae, tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("DAGSTER_HOME", raising=False)
    monkeypatch.setenv("SPLAVU_PRIVACY_BUDGET", "2")  # unreachable: the version is refused, as in the demo
    monkeypatch.setenv("SPLAVU_UTILITY_GATE", "1e9")  # unreachable even by a wide interval: the warning must reach the terminal
    bench, _ = tiny_bench
    store = str(tmp_path / "my_store")
    outputs, version = [], None
    for argv in walkthrough_lines():
        assert argv[0] == "splavu"
        argv = [a.replace("my_store", store).replace("my_data", str(bench)) for a in argv[1:]]
        if argv[0] == "synth":
            # the session's tiny benchmark is this command's output (same scale and seed): not rendered twice
            assert argv[argv.index("--scale") + 1] == "tiny" and "--seed" not in argv
            continue
        if argv[2] == "extract":
            argv += ["--checkpoint", str(tiny_videomae)]
        argv = [version if a == "VERSION" else a for a in argv]
        runner._instance_at.cache_clear()  # each line opens the instance from its folder, as a new shell would
        rc = main(argv)
        out, err = capsys.readouterr()
        outputs.append((argv[2:], rc, out, err))
        assert "Traceback" not in out + err
        if argv[2] == "train":
            version = re.search(r"AAM ([0-9a-f]{16})", out).group(1)

    by_cmd = {"neighbors --version" if "--version" in a and a[0] == "neighbors" else a[0]: (rc, out, err)
              for a, rc, out, err in outputs}
    for cmd in ("ingest", "extract", "train", "publish", "evaluate", "sql"):
        assert by_cmd[cmd][0] == 0, (cmd, by_cmd[cmd][2])
    ingests = [o for a, rc, o, e in outputs if a[0] == "ingest"]
    assert "roles: ar (action recognition); static clips" in ingests[0]
    assert "roles: privacy (privacy evaluation); no static clips" in ingests[1]
    static_clips = int(re.search(r"kitchen_actions-000 .* clips +\d+ \+ static +(\d+) ", by_cmd["extract"][1]).group(1))
    assert static_clips == ClipSampling.static_k * len(FeatureStore(store).read_shard("kitchen_actions-000").static) > 0
    assert re.search(r"staff_portraits-000 .* \+ static +0 ", by_cmd["extract"][1])
    train_line = by_cmd["train"][1].splitlines()[0]
    assert train_line.startswith("training on ar (kitchen_actions); without tad, ad")
    # the closed-form default says what it fitted, not "0 parameters, selected epoch 0"
    assert "operating point: " in by_cmd["train"][1]  # the publish rule picked the width among its candidates
    assert re.search(rf"AAM {version}: closed-form keep fit, k = \d+ of \d+ directions, each video recentred on its "
                     r"clips' expected clusters among \d+, no training loop, \d+ s",
                     by_cmd["train"][1])
    assert "not made current" in by_cmd["publish"][1] or "none" in by_cmd["publish"][1]
    evaluate = by_cmd["evaluate"][1]
    assert "| raw |" in evaluate
    skipped = [line for line in evaluate.splitlines() if line.startswith("skipped ")]  # one line for all tasks without data
    assert len(skipped) == 1 and re.match(r"skipped (\w+, )*tad(, \w+)*: no dataset is registered with those roles",
                                          skipped[0]) and "gait" in skipped[0], skipped
    assert f"scored AAM version {version} (NOT current" in evaluate and "| chance |" in evaluate
    assert "gate privacy budget: FAILED on validation" in by_cmd["publish"][1]
    curve = by_cmd["curve"]
    assert curve[0] == 0, curve[2]
    # the publish rule's candidates on the selection split, its pick, and that nothing current is that pick
    assert re.search(r"^\| (\*\*)?default", curve[1], re.M) and "operating point: " in curve[1], curve[1]
    assert "reports/operating_point.json (+ .png)" in curve[1]
    assert "check current_is_the_rules_pick warns: no version is current; the rule picks" in curve[1]
    assert re.search(r"warning: check utility_retention failed: ar_top1 \(seen\): keeps -?[0-9.]+ \[[-0-9., ]+\] of raw's "
                     r"above-chance utility < 1e\+09", evaluate), evaluate

    rows = [line.split() for line in by_cmd["sql"][1].splitlines()[2:-1]]
    static = {(r[0], r[2]): r[3] for r in rows}  # (dataset, split) -> static_clips
    assert static[("kitchen_actions", "train")] == "True" and static[("kitchen_actions", "test")] == "False"
    assert {v for (d, _), v in static.items() if d == "staff_portraits"} == {"False"}
    assert {r[1] for r in rows if r[0] == "staff_portraits"} == {"privacy"}

    rc, out, err = by_cmd["neighbors"]
    assert rc == 2 and len(err.strip().splitlines()) == 1
    assert "no AAM version is current" in err and f"{version} (" in err and "refused by the privacy budget" in err
    assert "a refused version's table is not for analysts" in err
    rc, out, err = by_cmd["neighbors --version"]  # the refused table stays out of analysts' reach, as in the catalog
    assert rc == 2 and len(err.strip().splitlines()) == 1 and not out
    assert f"AAM version {version} was refused by the privacy budget" in err and "not for analysts" in err


@pytest.mark.parametrize("argv, message", [
    (["ingest", "x", "MANIFEST", "--shard-size", "0"], "--shard-size must be >= 1"),
    (["ingest", "x", "MANIFEST", "--roles", "ar,pose"], "unknown role 'pose'"),
    (["ingest", "x", "MANIFEST", "--roles", "tad"], "role 'tad' needs column(s) ['segments']"),
    (["sql", ""], "empty query"),
    (["train"], "nothing to train on"),
    (["train", "--tasks", "tad"], "task 'tad' has no labelled data"),
    (["evaluate"], "no AAM version in"),
])
def test_expected_failures_are_one_line(tiny_bench, tmp_path, capsys, monkeypatch, argv, message):
    monkeypatch.delenv("DAGSTER_HOME", raising=False)
    store = tmp_path / "store"
    store.mkdir()
    manifest = str(tiny_bench[0] / "privacy" / "manifest.csv")
    rc = main(["--store", str(store), *[manifest if a == "MANIFEST" else a for a in argv]])
    err = capsys.readouterr().err
    assert rc == 2 and err.startswith("splavu: error: ") and message in err, err
    assert len(err.strip().splitlines()) == 1


def test_missing_store_is_one_line(tmp_path, capsys):
    for argv in (["sql", "SELECT 1"], ["neighbors", "v"], ["train"], ["extract"], ["evaluate"]):
        rc = main(["--store", str(tmp_path / "nowhere"), *argv])
        err = capsys.readouterr().err
        assert rc == 2 and err.strip() == (f"splavu: error: no store at {tmp_path / 'nowhere'}: register a dataset "
                                           f"first (splavu ingest NAME MANIFEST), or point --store / $SPLAVU_STORE "
                                           f"at an existing store")
