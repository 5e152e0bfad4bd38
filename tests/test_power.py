"""Power before verdicts (issue 41, item 3): a privacy part whose interval holds the budget is undecidable, said in
words with what would decide it; raw at chance is "no signal"; no NaN reaches the report's JSON or Markdown."""
import json
import math
import re

from splavu_core.evaluation import report
from splavu_core.store import ledger

PART = {"leakage_removed": 0.6, "leakage_removed_ci_low": -0.2, "leakage_removed_ci_high": 1.3, "anonymized_cmap": 0.5,
        "chance_cmap": 0.4, "n_videos": 63, "n_subjects": 12, "strongest_anonymized": "mlp"}


def test_an_interval_holding_the_budget_is_undecidable_and_says_what_would_decide_it():
    ok, why = ledger._verdict_one(PART, 0.5)
    assert not ok and "holds the budget 0.5: undecidable" in why and "on 63 validation videos of 12 people" in why
    more, people = map(int, re.search(r"about (\d+) more validation videos of about (\d+) more people", why).groups())
    # that many more videos narrow the half-width (as 1/sqrt(n)) until the lower end reaches the budget
    half = (PART["leakage_removed"] - PART["leakage_removed_ci_low"]) * math.sqrt(63 / (63 + more))
    assert PART["leakage_removed"] - half >= 0.5 - 1e-9 and people == math.ceil(more * 12 / 63)
    ok, why = ledger._verdict_one({**PART, "leakage_removed": 0.3}, 0.5)  # estimate below: the rule's record says why
    assert not ok and "undecidable" in why and "below the budget" in why and "splavu curve" in why
    ok, why = ledger._verdict_one({**PART, "leakage_removed": 0.3, "leakage_removed_ci_high": 0.45}, 0.5)
    assert not ok and why.endswith("what holds the family back") and ": FAILED; the publish rule's record" in why


def test_raw_at_chance_is_no_signal_and_says_passed_or_failed():
    part = {"leakage_removed": None, "raw_cmap": 0.41, "raw_cmap_ci": [0.38, 0.45], "anonymized_cmap": 0.40,
            "anonymized_cmap_ci": [0.37, 0.43], "chance_cmap": 0.4, "metric": "rank1", "n_videos": 63}
    ok, why = ledger._verdict_one(part, 0.5)
    assert ok and why.startswith("no signal: raw rank-1 0.4100 [0.3800, 0.4500] is not above chance") and ": passed" in why
    ok, why = ledger._verdict_one({**part, "anonymized_cmap_ci": [0.42, 0.5]}, 0.5)
    assert not ok and ": FAILED" in why
    # a budget <= 0 turns the gate off, a part without signal too (it used to judge the anonymized features
    # against chance there, so a few validation people refused a version with the gate off)
    ok, why = ledger._verdict_one({**part, "anonymized_cmap_ci": [0.42, 0.5]}, -1)
    assert ok and why == "privacy budget off (budget -1; linkage removed none measurable (no signal)): passed"


def test_the_gate_line_says_undecidable(tmp_path, monkeypatch):
    from pipeline import messages

    why = ledger.budget_verdict({**PART, "closeups": PART, "clips": {"skipped": "-"}}, 0.5)[1]
    monkeypatch.setattr(messages, "read_verdicts", lambda store, v: {"privacy": {"passed": False, "why": why}})
    line = messages.gate_lines(None, "v")[0]
    assert line.startswith("gate privacy budget: UNDECIDABLE (not made current) on validation: ")


def test_no_nan_in_the_report_json_and_no_signal_in_its_cells():
    rep = {"rows": [{"name": "splavu", "linkage_removed": float("nan"),
                     "derived_intervals": {"linkage_removed": {"value": float("nan"), "ci_low": float("nan"),
                                                               "ci_high": float("nan")}}}]}
    text = report.report_json(rep).decode()
    assert "NaN" not in text and json.loads(text)["rows"][0]["linkage_removed"] is None
    assert report.interval_cell(rep["rows"][0], "linkage_removed", {}) == "no signal"
    assert report.fmt_cell(rep["rows"][0], "linkage_removed") == "no signal"


def test_the_report_markdown_shows_retention_and_the_gate_verdicts():
    row = {"name": "splavu", "derived_intervals": {"ar_retention": {"value": 0.93, "ci_low": 0.85, "ci_high": 1.01},
                                                   "tad_retention": {"value": float("nan"), "ci_low": float("nan"),
                                                                     "ci_high": float("nan")}}}
    lines = report.retention_markdown([{"name": "raw"}, row])
    assert "| Features | AR | TAD |" in lines and "| splavu | 0.93 [0.85, 1.01] | no signal |" in lines
    verdicts = {"privacy": {"passed": False, "why": "closeups: ... holds the budget 0.5: undecidable; ..."},
                "utility": {"passed": True, "why": "ar: keeps 0.93"}}
    gates = report.gates_markdown(verdicts, "abc")
    assert "- Privacy budget: **not passed**: closeups: ... holds the budget 0.5: undecidable; ..." in gates
    assert "- Utility: **passed**: ar: keeps 0.93" in gates
    assert "Not gated yet" in "\n".join(report.gates_markdown({}, "abc"))
