"""The documentation: generated references match the code, the mkdocs site builds strictly, the README stays short,
every relative link resolves, every test or benchmark a page names exists, only history and the generated results
pages carry commits, issue numbers or dates, and results.md is rendered from the report it is given."""
import importlib.util
import json
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"


def _gen():
    spec = importlib.util.spec_from_file_location("gen_reference", DOCS / "gen_reference.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_generated_references_match_the_code(capsys):
    gen = _gen()
    rc = gen.main(["--check", "--only", "cli", "configuration", "catalog", "report-fields"])
    assert rc == 0, capsys.readouterr().err  # regenerate with: python docs/gen_reference.py
    cli = (DOCS / "cli.md").read_text()
    from pipeline.cli import build_parser
    sub = next(a for a in build_parser()._actions if hasattr(a, "choices") and isinstance(a.choices, dict))
    for name in sub.choices:
        assert f"## `splavu {name}`" in cli
    from splavu_core.settings import SETTINGS_FIELDS
    config = (DOCS / "configuration.md").read_text()
    for env in SETTINGS_FIELDS:
        assert f"## {env}\n" in config


def test_check_notices_a_stale_page(tmp_path, monkeypatch, capsys):
    gen = _gen()
    (tmp_path / "cli.md").write_text("stale\n")
    monkeypatch.setattr(gen, "DOCS", tmp_path)
    monkeypatch.setattr(gen, "ROOT", tmp_path)
    assert gen.main(["--check", "--only", "cli"]) == 1
    assert (tmp_path / "cli.md").read_text() == "stale\n"  # --check writes nothing
    assert "out of date" in capsys.readouterr().err


def test_mkdocs_build_strict(tmp_path):
    site = tmp_path / "site"
    proc = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert (site / "index.html").is_file()
    for page in ("tutorial", "forget", "reanonymize", "scale-out", "privacy-budget", "report", "cli", "configuration",
                 "store-layout", "catalog", "report-fields", "concepts", "method", "evaluation", "threat-model",
                 "limitations", "history", "results"):
        assert (site / page / "index.html").is_file(), page


LINK = re.compile(r"\]\(([^)\s]+)\)")


def _relative_links(path: Path) -> list[str]:
    text = re.sub(r"```.*?```", "", path.read_text(), flags=re.S)  # code blocks hold no links
    return [m for m in LINK.findall(text) if not re.match(r"[a-z]+:|#", m)]


def test_readme_is_short_and_every_relative_link_resolves():
    readme = ROOT / "README.md"
    text = readme.read_text()
    assert len(text.splitlines()) < 150 and "make demo" in text and "make test" in text
    pages = [readme, *sorted(DOCS.glob("*.md"))]
    broken = []
    for page in pages:
        for link in _relative_links(page):
            target = (page.parent / link.split("#")[0]).resolve()
            if not target.exists():
                broken.append(f"{page.relative_to(ROOT)}: {link}")
    assert not broken, broken
    assert _relative_links(readme), "the README links to the docs pages"


# Only history.md and the generated results pages (which name the commit they came from) may carry a commit id, an
# issue number or a date-stamped finding; every other page says what is true today.
RECORDS = {"history.md", "results.md", "results_action.md"}
COMMIT = re.compile(r"(?<![\w./-])(?=[0-9a-f]*[0-9])(?=[0-9a-f]*[a-f])[0-9a-f]{7,40}(?![\w-])")
ISSUE = re.compile(r"(?i)\bissues?\s*#?\d+|(?<![\w/&])#\d+\b")
DATE = re.compile(r"\b20\d\d-[01]\d-[0-3]\d\b")


def dated(text: str) -> list[str]:
    return [m.group(0) for pattern in (COMMIT, ISSUE, DATE) for m in pattern.finditer(text)]


def test_the_record_finder_sees_commits_issues_and_dates():
    assert dated("fixed at ae9ab98 (issue 29, see #21418), measured 2026-12-05") == \
        ["ae9ab98", "issue 29", "#21418", "2026-12-05"]
    assert not dated("k = 11 of 192, seeds 0-7, videomae-a1f4d9db0b9b8a13, issues/21418, `# comment`, 0.605 [0.511]")


def test_only_history_and_results_pages_carry_commits_issues_or_dates():
    found = {f"{page.name}: {hit}" for page in [ROOT / "README.md", *DOCS.glob("*.md")] if page.name not in RECORDS
             for hit in dated(page.read_text())}
    assert not found, sorted(found)


NAMED = re.compile(r"((?<![\w/])(?:tests|benchmarks)/[\w/]+\.py)?(?:::(\w+))?")  # a file, a ::test, or both


def test_every_test_and_benchmark_a_page_names_exists():
    """Threat model, limitations and the how-tos back their claims with `tests/...py::test_name` and benchmark
    scripts: each named file exists, each named test is defined in it (a `::name` after an earlier full name of
    the same file counts too)."""
    missing = []
    for page in [ROOT / "README.md", *DOCS.glob("*.md")]:
        if page.name in RECORDS:
            continue
        text, last = page.read_text(), None
        for m in NAMED.finditer(text):
            path, name = m.group(1), m.group(2)
            if not path and not name:
                continue
            last = path or last
            target = ROOT / (path or last or "")
            if not target.is_file():
                missing.append(f"{page.name}: {path}")
            elif name and not re.search(rf"^def {name}\(", target.read_text(), re.M):
                missing.append(f"{page.name}: {target.relative_to(ROOT)}::{name}")
    assert not missing, missing


def test_the_store_layout_lists_every_path_the_code_declares():
    declared = {m.group(1).rstrip(",.;:") for f in (ROOT / "splavu_core").rglob("*.py")
                for m in re.finditer(r"(?m)^\s*(<root>/\S+)", f.read_text())}
    assert len(declared) > 20, declared  # the reader finds the module docstrings' layouts
    page = (DOCS / "store-layout.md").read_text()
    assert not sorted(p for p in declared if f"`{p}`" not in page)


def _bash_block(text: str, heading: str) -> str:
    return re.search(r"```bash\n(.*?)```", text[text.index(heading):], re.S).group(1)


def test_the_readme_walkthrough_is_the_tutorials():
    """tests/test_walkthrough.py runs the tutorial's lines; the README shows the same lines."""
    assert _bash_block((ROOT / "README.md").read_text(), "## Your own videos") == \
        _bash_block((DOCS / "tutorial.md").read_text(), "## 3. Your own videos")


def test_the_readme_figures_are_the_results_pages():
    """The README's one table of figures quotes results.md's test split: regenerate one, update the other."""
    results = (DOCS / "results.md").read_text()
    table = results[results.index("## Leakage removed and retention"):].split("\n## ")[0]
    rows = {r.split("|")[1].strip(): [c.split()[0] for c in r.split("|")[2:-1]] for r in table.splitlines()
            if r.startswith("| splavu ") or r.startswith("| pca_")}
    pca = next(k for k in rows if k.startswith("pca_"))
    readme = (ROOT / "README.md").read_text()
    for label, column in (("close-up attribute leakage removed", 0), ("action-clip attribute leakage removed", 1),
                          ("re-identification across videos removed", 2), ("action recognition: share of utility "
                                                                           "kept", 3)):
        cells = [f"{round(100 * float(rows[name][column]))}%" for name in ("splavu", pca)]
        assert f"| {label} | {cells[0]} | {cells[1]} |" in readme, (label, cells)


def _interval(value, low, high, chance=None):
    return {"value": value, "sd": 0.0, "ci_low": low, "ci_high": high, "chance": chance, "n_seeds": 5}


def _small_report() -> dict:
    """The real report's keys (store/reports/privacy_utility.json), with made-up numbers."""
    raw_iv = {"privacy_cmap": _interval(0.912, 0.901, 0.923, 0.481), "ar_top1": _interval(0.654, 0.611, 0.697, 0.0667),
              "clip_privacy_cmap": _interval(0.833, 0.812, 0.854, 0.481), "reid_rank1": _interval(0.707, 0.66, 0.75, 0.02)}
    anon_iv = {"privacy_cmap": _interval(0.611, 0.587, 0.635, 0.481), "ar_top1": _interval(0.642, 0.600, 0.684, 0.0667),
               "clip_privacy_cmap": _interval(0.555, 0.53, 0.58, 0.481), "reid_rank1": _interval(0.05, 0.03, 0.07, 0.02)}
    attackers = lambda v: {"privacy": {"mlp": {"score": _interval(v, v - 0.01, v + 0.01, 0.481)},
                                       "linear": {"score": _interval(v - 0.02, v - 0.03, v - 0.01, 0.481)}},
                           "reid": {"lda": {"score": _interval(0.707, 0.66, 0.75, 0.02)}}}
    base = {k: None for k in ("privacy_f1", "privacy_chance_cmap", "clip_privacy_chance_cmap", "tad_map", "ad_auc",
                              "bias_f_gap", "bias_m_gap", "gait_top1", "reid_map")}
    raw = {"name": "raw", **base, **{k: iv["value"] for k, iv in raw_iv.items()}, "attackers": attackers(0.912),
           "intervals": raw_iv}
    anon = {"name": "splavu", **base, **{k: iv["value"] for k, iv in anon_iv.items()}, "attackers": attackers(0.611),
            "intervals": anon_iv,
            "changes": {"privacy_cmap": _interval(-0.301, -0.322, -0.280), "ar_top1": _interval(-0.012, -0.04, 0.016)},
            "derived_intervals": {"leakage_removed": _interval(0.7088, 0.6571, 0.7606),
                                  "ar_retention": _interval(0.9789, 0.91, 1.04)},
            "leakage_removed": 0.7088, "clip_leakage_removed": 0.7716, "linkage_removed": 0.9259,
            "relative_change": {"privacy_cmap": -0.33}}
    return {"encoder_fingerprint": "videomae-0123456789abcdef", "aam_version": "feedfacecafebeef", "rows": [raw, anon],
            "aam_version_is_current": True, "probe_seeds": [0, 1, 2, 3, 4],
            "costs": {"demo": {"stages": {"synth": 12.5, "extract": 34.3}, "recorded_at": "2026-01-02T03:04:05"}}}


def test_results_are_rendered_from_the_report(tmp_path):
    gen = _gen()
    report = tmp_path / "reports" / "privacy_utility.json"
    report.parent.mkdir()
    report.write_text(json.dumps(_small_report()))
    (report.parent / "gates").mkdir()
    (report.parent / "gates" / "feedfacecafebeef.json").write_text(json.dumps({"measure": {
        "split": "val", "seen_tasks": ["ar"],
        "privacy": {"closeups": {"dataset": "privacy", "raw_cmap": 0.9, "anonymized_cmap": 0.6, "leakage_removed": 0.6543,
                                 "leakage_removed_ci_low": 0.5432, "leakage_removed_ci_high": 0.7654,
                                 "strongest_raw": "mlp", "strongest_anonymized": "linear"}},
        "utility": {"ar": {"metric": "top1", "raw": 0.7, "anon": 0.69, "retention": 0.9876,
                           "retention_ci_low": 0.9123, "retention_ci_high": 1.0321}}}}))
    text = gen.render_results(report, commit="abc1234", machine="test machine, 3 CPU cores")
    for expected in ("feedfacecafebeef", "(current)", "videomae-0123456789abcdef", "`abc1234`",
                     "test machine, 3 CPU cores", "0.912 [0.901, 0.923]", "0.611 [0.587, 0.635]", "0.481",
                     "-0.301 [-0.322, -0.280]", "no change (-0.012 [-0.040, +0.016])",
                     "0.709 [0.657, 0.761]", "0.772", "0.926", "0.979 [0.910, 1.040]",
                     "0.654 [0.543, 0.765]", "0.988 [0.912, 1.032]", "| 12.5 | 34.3 |"):
        assert expected in text, expected
    # the report's rows become table rows, in the report's order
    assert text.index("| raw | 0.912") < text.index("| splavu | 0.611")

    assert "operating point" not in text  # no rule's record in that store
    fig = lambda v, w: [v, v - w, v + w]  # noqa: E731
    (report.parent / "operating_point.json").write_text(json.dumps({
        "seeds": [0, 1], "budget": 0.5, "floor": 0.95, "chosen": "k14", "why": "the most private of those safe",
        "seconds": 12.0,
        "members": [{"name": n, "changes": {}, "figures": {"privacy": fig(p, 0.04), "ar": fig(r, 0.03)},
                     "scored": ["privacy", "ar"], "assessment": {"z_min": z, "weakest": "close-ups"}}
                    for n, p, r, z in (("default", 0.6, 0.99, 1.9), ("k14", 0.62, 0.97, 2.4))]}))
    (report.parent / "operating_point.png").write_bytes(b"\x89PNG fake")
    text = gen.render_results(report, commit="abc1234", machine="m")
    assert "picked **k14**: the most private of those safe" in text and "| default | 0.60 [0.56, 0.64] |" in text
    assert "| **k14 (picked)** | 0.62 [0.58, 0.66] | 0.97 [0.94, 1.00] | 2.40 (close-ups) |" in text
    assert gen.outputs(report, ("results",))[gen.CURVE_PNG["results"]] == b"\x89PNG fake"
    action = gen.outputs(tmp_path / "nowhere.json", ("results_action",), action_report=report)  # the second encoder's
    assert action[gen.CURVE_PNG["results_action"]] == b"\x89PNG fake"
    page = action[gen.DOCS / "results_action.md"]
    assert page.count("# Results on the second encoder") == 1 and "results_action_operating_point.png" in page

    assert "beside other anonymizers" not in text  # no ablations run on that store
    variant = lambda name, removed: {"name": name, "leakage_removed": removed,  # noqa: E731
                                     "derived_intervals": {"leakage_removed": _interval(removed, removed - 0.05,
                                                                                        removed + 0.05)}}
    (report.parent / "ablations.json").write_text(json.dumps({"rows": [
        {"name": "raw"}, variant("default", 0.6111), variant("recentre_classes", 0.6543), variant("keep_k8", 0.5)]}))
    text = gen.render_results(report, commit="abc1234", machine="m")
    compared = text[text.index("## The default beside other anonymizers"):text.index("## Gates")]
    assert "| the default (clip clusters, k = 11) | 0.611 [0.561, 0.661] |" in compared
    assert "| the previous default (recentring on classes) | 0.654 [0.604, 0.704] |" in compared
    assert "keep_k8" not in compared and "Not run on this store: keep alone (k = 11), k = 14 + a centroid drawn per clip" in compared

    missing = gen.render_results(tmp_path / "nowhere.json")
    assert "make demo" in missing and "python docs/gen_reference.py" in missing
    assert not re.search(r"\d\.\d{3}", missing)  # no numbers without a report
