"""Writing the privacy-utility report (and the ablation report): JSON, a Markdown table, a PNG plot.

    <root>/reports/privacy_utility.json   the report (schema: evaluation.suite)
    <root>/reports/privacy_utility.md     the table, relative change against raw as the paper's Table 1
    <root>/reports/privacy_utility.png    trade-off: privacy cMAP (x) vs mean utility retention (y)
    <root>/reports/ablations.json / .md   the same for the ablation variants (grouped tables)

Every file is written atomically: a temp name renamed into place, or one PUT on an object store.
"""
from __future__ import annotations

import base64
import io
import json
from collections.abc import Mapping, Sequence
from pathlib import Path

from splavu_core.evaluation.suite import REPORT_METRICS, UTILITY_KEYS, mean_utility_retention
from splavu_core.store.costs import DEMO_STAGES
from splavu_core.store.feature_store import FeatureStore
from splavu_core.store.ledger import read_verdicts

COLUMNS = (  # (report key, header); the privacy columns first, as in the paper
    ("privacy_cmap", "Privacy cMAP ↓"), ("leakage_removed", "Leakage removed ↑"),
    ("clip_privacy_cmap", "Action-clip cMAP ↓"), ("clip_leakage_removed", "Action-clip leakage removed ↑"),
    ("reid_rank1", "Re-id rank-1 ↓"), ("linkage_removed", "Linkage removed ↑"), ("privacy_f1", "Privacy F1"),
    ("ar_top1", "AR top-1"), ("tad_map", "TAD mAP"), ("ad_auc", "AD AUC"), ("bias_f_gap", "Bias-F gap ↓"),
    ("bias_m_gap", "Bias-M gap ↓"), ("gait_top1", "Gait top-1 ↓"))

LEAKAGE_KEYS = ("leakage_removed", "clip_leakage_removed", "linkage_removed")
ATTACK_TABLES = (("privacy", "Close-ups: cMAP by attacker (leakage removed)"),
                 ("clip_privacy", "Published action clips: cMAP by attacker (leakage removed)"),
                 ("reid", "Re-identification across actions: rank-1 by attacker (linkage removed)"))


def _write_atomic(store: FeatureStore, name: str, data: bytes):
    store.files.put_atomic(f"reports/{name}", data)
    return store.loc("reports", name)


# ---------------------------------------------------------------- Markdown

def fmt_change(rel: float | None) -> str:
    """-0.292 -> '↓29.2%', 0.01 -> '↑1.0%', 0 -> '=' (as in the paper's Table 1)."""
    if rel is None:
        return ""
    pct = abs(rel) * 100
    if round(pct, 1) == 0:
        return "="
    return f"{'↓' if rel < 0 else '↑'}{pct:.1f}%"


NO_SIGNAL = "no signal"  # a leakage/linkage share whose raw features are not above chance: nothing to remove


def _nan(v) -> bool:
    return isinstance(v, float) and v != v


def without_nan(obj):
    """`obj` with every NaN float replaced by None (JSON null): the report's JSON never holds NaN, which is not JSON."""
    if isinstance(obj, dict):
        return {k: without_nan(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [without_nan(v) for v in obj]
    return None if _nan(obj) else obj


def fmt_cell(row: dict, key: str) -> str:
    if key in LEAKAGE_KEYS:
        v = row.get(key)
        return "—" if v is None else (NO_SIGNAL if _nan(v) else f"{v * 100:.1f}%")
    v = row.get(key)
    if v is None:
        return "—"
    change = fmt_change((row.get("relative_change") or {}).get(key)) if "relative_change" in row else ""
    return f"{v * 100:.1f}" + (f" ({change})" if change else "")


def _pts(v: float) -> str:
    return f"{v * 100:.1f}"


def fmt_interval(stat: dict) -> str:
    """{value, ci_low, ci_high} -> '69.3 [64.5, 74.2]' (x100)."""
    return f"{_pts(stat['value'])} [{_pts(stat['ci_low'])}, {_pts(stat['ci_high'])}]"


def fmt_share(stat: dict) -> str:
    """{value, ci_low, ci_high} of a share -> '62% [55, 68]'."""
    return f"{stat['value'] * 100:.0f}% [{stat['ci_low'] * 100:.0f}, {stat['ci_high'] * 100:.0f}]"


def member_cell(st: dict, second: str, fmt_second, mark: str = "") -> str:
    """One suite member's cell: its score [interval], a mark, and (its `second` stat, e.g. the share removed)."""
    if "score" not in st:
        return "—"
    return fmt_interval(st["score"]) + mark + (f" ({fmt_second(st[second])})" if second in st else "")


def fmt_delta(d: dict) -> str:
    """A paired difference in points with its interval; 'no change' when the interval holds 0."""
    if not (d["ci_low"] > 0 or d["ci_high"] < 0):
        return f"no change (Δ {d['value'] * 100:+.1f} [{d['ci_low'] * 100:+.1f}, {d['ci_high'] * 100:+.1f}])"
    return f"Δ {d['value'] * 100:+.1f} [{d['ci_low'] * 100:+.1f}, {d['ci_high'] * 100:+.1f}]"


def interval_cell(row: dict, key: str, raw: dict) -> str:
    """A cell of a report scored with intervals: value [95% CI]; non-raw rows add the paired change vs raw,
    unless the raw features show no signal on that metric (then no change is claimed)."""
    if key in LEAKAGE_KEYS:
        if row["name"] == "raw":
            return "—"
        st = (row.get("derived_intervals") or {}).get(key)
        if st is None:
            return "—" if row.get(key) is None else (NO_SIGNAL if _nan(row[key]) else f"{row[key] * 100:.1f}%")
        if any(_nan(st.get(k)) for k in ("value", "ci_low", "ci_high")):
            return NO_SIGNAL  # raw at chance: a share of nothing is undefined, never `nan%`
        return f"{st['value'] * 100:.1f}% [{st['ci_low'] * 100:.1f}, {st['ci_high'] * 100:.1f}]"
    st = (row.get("intervals") or {}).get(key)
    if st is None:
        return fmt_cell(row, key)
    cell = fmt_interval(st)
    raw_st = (raw.get("intervals") or {}).get(key) or {}
    if raw_st.get("signal") is False:  # no change claimed; whether the fit saw the task is still the row's
        return cell + (" no signal" if row["name"] == "raw" else _seen_mark(row, key))
    d = (row.get("changes") or {}).get(key)
    return cell + (f"; {fmt_delta(d)}" if d is not None and row["name"] != "raw" else "") + _seen_mark(row, key)


def _seen_mark(row: dict, key: str) -> str:
    """' (seen)' / ' (unseen)' on a utility cell of a row that records the tasks it was co-trained with."""
    if key not in UTILITY_KEYS or row.get("seen_tasks") is None:
        return ""
    return " (seen)" if key.split("_")[0] in row["seen_tasks"] else " (unseen)"


def chance_row(rows: Sequence[dict], cols) -> str | None:
    raw = rows[0] if rows else {}
    iv = raw.get("intervals") or {}
    if not iv:
        return None
    cells = []
    for k, _ in cols:
        c = (iv.get(k) or {}).get("chance")
        cells.append("—" if c is None else _pts(c))
    return "| chance | " + " | ".join(cells) + " |"


def table_markdown(rows: Sequence[dict]) -> str:
    """One Markdown table; values x100. Rows scored with intervals show value [95% CI], a chance row, and the
    paired change against raw in points (or 'no change'); older rows show the relative change against raw."""
    cols = [(k, h) for k, h in COLUMNS if any(r.get(k) is not None for r in rows)
            or (k == "leakage_removed" and not any(r.get("clip_privacy_cmap") is not None for r in rows))]
    if rows and rows[0].get("intervals"):
        lines = ["| Features | " + " | ".join(h for _, h in cols) + " |", "|---|" + "---:|" * len(cols)]
        for r in rows:
            lines.append(f"| {r['name']} | " + " | ".join(interval_cell(r, k, rows[0]) for k, _ in cols) + " |")
        ch = chance_row(rows, cols)
        return "\n".join(lines + ([ch] if ch else []))
    lines = ["| Features | " + " | ".join(h for _, h in cols) + " |",
             "|---|" + "---:|" * len(cols)]
    for r in rows:
        cells = ["—" if (k in LEAKAGE_KEYS and r["name"] == "raw") else fmt_cell(r, k) for k, _ in cols]
        lines.append(f"| {r['name']} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def attackers_markdown(rows: Sequence[dict]) -> list[str]:
    """One table per attacked set: each attacker's score with its interval and, for non-raw rows, the share it
    says was removed; * marks the strongest suite member on that row (the one the headline and the gate quote)."""
    from splavu_core.evaluation.attackers import ALL, SUITE_NAMES

    out = []
    for task, title in ATTACK_TABLES:
        names = [a.name for a in ALL] if task != "reid" else None
        have = [r for r in rows if (r.get("attackers") or {}).get(task)]
        if not have:
            continue
        names = names or sorted({n for r in have for n in r["attackers"][task]})
        names = [n for n in names if any(n in r["attackers"][task] for r in have)]
        lines = [f"#### {title}", "", "| Features | " + " | ".join(names) + " |", "|---|" + "---:|" * len(names)]
        for r in have:
            att = r["attackers"][task]
            scores = {n: att[n]["score"]["value"] for n in names if n in att and "score" in att[n]}
            judges = [n for n in scores if n in SUITE_NAMES or task == "reid"]
            best = max(judges, key=lambda n: scores[n]) if judges else None
            cells = [member_cell(att.get(n, {}), "removed", fmt_share, "*" if n == best else "") for n in names]
            lines.append(f"| {r['name']} | " + " | ".join(cells) + " |")
        out += lines + [""]
    if out:
        out.append("`mlp_width` is the previous protocol's D -> D -> A attacker: its capacity shrinks with the table, "
                   "so it is shown for the record and never judges. * = the strongest attacker on that row.")
        out.append("")
    return out


ATTRIBUTE_TABLES = (("privacy", "Close-ups: the strongest attacker's AP per attribute"),
                    ("clip_privacy", "Published action clips: the strongest attacker's AP per attribute"))


def attributes_markdown(rows: Sequence[dict]) -> list[str]:
    """One table per attacked set: which private attribute stays readable. Each cell is the AP of the attacker
    strongest on that row (its interval), and for non-raw rows the share of raw's above-chance AP removed; chance
    is the attribute's prevalence. The mean of a row is its cMAP."""
    out = []
    for task, title in ATTRIBUTE_TABLES:
        have = [r for r in rows if (r.get("attributes") or {}).get(task)]
        if not have:
            continue
        names = list(have[0]["attributes"][task])
        lines = [f"#### {title}", "", "| Features | " + " | ".join(n.replace("_", " ") for n in names) + " |",
                 "|---|" + "---:|" * len(names)]
        for r in have:
            cells = [member_cell(r["attributes"][task].get(n, {}), "removed", fmt_share) for n in names]
            lines.append(f"| {r['name']} | " + " | ".join(cells) + " |")
        chance = [((have[0]["attributes"][task].get(n) or {}).get("score") or {}).get("chance") for n in names]
        lines.append("| chance | " + " | ".join("—" if c is None else _pts(c) for c in chance) + " |")
        out += lines + [""]
    if out:
        out += ["AP of the attacker strongest on each row (the one its cMAP quotes), on one attribute, and (the "
                "share of raw's above-chance AP removed [interval]); chance = the attribute's prevalence. An "
                "attribute far above chance on a published row is what that table still tells about the people in it.",
                ""]
    return out


READER_TABLES = (("ar", "Action recognition: top-1 by reader (retention)"),
                 ("tad", "Temporal action detection: mAP by reader (retention)"),
                 ("ad", "Anomaly detection: frame AUC by reader (retention)"))


def readers_markdown(rows: Sequence[dict]) -> list[str]:
    """One table per utility task: each reader's score with its interval and, for non-raw rows, the share of raw's
    above-chance utility it says was kept; * marks raw's strongest reader, which judges every row (the headline,
    the retention column and the utility gate quote it)."""
    from splavu_core.evaluation.readers import NAMES

    out = []
    raw = rows[0] if rows else {}
    for task, title in READER_TABLES:
        have = [r for r in rows if (r.get("readers") or {}).get(task)]
        if not have:
            continue
        names = [n for n in NAMES[task] if any(n in r["readers"][task] for r in have)]
        raw_rd = (raw.get("readers") or {}).get(task) or {}
        judge = max((n for n in names if "score" in raw_rd.get(n, {})), key=lambda n: raw_rd[n]["score"]["value"],
                    default=None)
        lines = [f"#### {title}", "", "| Features | " + " | ".join(n + ("*" if n == judge else "") for n in names) + " |",
                 "|---|" + "---:|" * len(names)]
        for r in have:
            cells = [member_cell(r["readers"][task].get(n, {}), "retained",
                                 lambda rt: f"{rt['value']:.2f} [{rt['ci_low']:.2f}, {rt['ci_high']:.2f}]") for n in names]
            lines.append(f"| {r['name']} | " + " | ".join(cells) + " |")
        out += lines + [""]
    if out:
        out += ["Utility readers have a fixed capacity (evaluation/readers.py). * = the strongest reader on raw: it "
                "judges every row, paired with itself, so the anonymized table cannot choose its own reader.", ""]
    return out


def unseen_markdown(report: dict) -> list[str]:
    """The tasks nobody fitted for (report["unseen"], from unseen_tasks_eval), when the report carries them."""
    from splavu_core.evaluation.unseen import markdown

    u = report.get("unseen")
    if not u:
        return []
    return ["### Tasks the fit never saw (test split)", "",
            f"Retention of each task after refitting AAM `{u['version']}`'s configuration without that task's labels, "
            f"and of AR on action classes withheld from the fit; judged by raw's strongest reader.", "",
            markdown(u), ""]


def _footer(report: dict, version_note: str | None = None) -> list[str]:
    raw = report["rows"][0] if report["rows"] else {}
    notes = []
    if raw.get("clip_privacy_chance_cmap") is not None:
        notes.append(f"Action-clip attack: attackers train on the train actors' action clips and are scored on the "
                     f"disjoint test actors; chance cMAP {raw['clip_privacy_chance_cmap'] * 100:.1f}.")
    if raw.get("privacy_chance_cmap") is not None:
        notes.append(f"Chance cMAP (mean attribute prevalence): {raw['privacy_chance_cmap'] * 100:.1f}. "
                     "Leakage removed = (raw − anonymized) / (raw − chance) of the cMAP of the strongest attacker "
                     "of the fixed-capacity suite (MLP 512, linear, gradient boosting, k-NN) on each row.")
    iv = raw.get("intervals") or {}
    if iv:
        n = max((st.get("n_seeds") or 1) for st in iv.values())
        notes.append(f"Each cell: mean over {n} probe seeds [95% interval: seeds and a bootstrap over the test videos]; "
                     f"Δ = paired difference against raw in points (same seed, same resampled videos); 'no change' "
                     f"when its interval holds 0; 'no signal' when raw is not above chance beyond its interval.")
    if raw.get("reid_rank1") is not None:
        notes.append("Re-identification: each test actor's video queries the test videos of OTHER actions (the "
                     "action cannot link them); rank-1 of the same actor, strongest of cosine on standardised means "
                     "and LDA learned on the train actors; linkage removed = (raw − anonymized) / (raw − chance).")
    if any(raw.get(k) is not None for k in ("bias_f_gap", "bias_m_gap")):
        notes.append("Bias-F/M gap: the AR probe trained where one action (the shortcut) is 95% done by one "
                     "perceived-gender group and every other action 95% by the other; on balanced test videos of the "
                     "shortcut action, the favoured group's top-1 minus the other group's (signed: 0 is no bias, "
                     "below 0 the other group ahead). Where a model reads the group, the favoured group's shortcut "
                     "videos are called right and the other group's called a look-alike action.")
    no_bias = [k for k in ("bias_f_gap", "bias_m_gap") if (iv.get(k) or {}).get("signal") is False]
    if no_bias:
        notes.append(f"{', '.join(no_bias)}: no signal — the raw features' own gap interval reaches 0, so this "
                     f"protocol shows no bias to remove on this data; the anonymized gap is reported, no change "
                     f"is claimed.")
    trivial_rows = [r["name"] for r in report["rows"] if r["name"].startswith(("pca_", "randproj_"))]
    if trivial_rows:
        notes.append(f"Trivial baselines ({', '.join(trivial_rows)}): label-free projections to the published width "
                     f"fitted on the training clips, scored on every privacy and utility task; an anonymizer must "
                     f"beat them.")
    missing = [k for k in REPORT_METRICS if raw.get(k) is None]
    if missing:
        notes.append(f"Not measured (dataset absent or unusable): {', '.join(missing)}.")
    cur = report.get("aam_version_is_current")
    state = "" if cur is None else (" (the current version)" if cur else " (NOT the current version)")
    notes.append(f"Encoder `{report['encoder_fingerprint']}`, "
                 + (version_note or f"AAM version `{report['aam_version'] or '—'}`{state}."))
    return notes


def _secs(v: float | None) -> str:
    return "not recorded" if v is None else f"{v:,.1f}"


def _times(v: float | None) -> str:
    return "—" if v is None else f"{v:.2f}×"


def costs_markdown(costs: Mapping) -> list[str]:
    """The report's cost section: wall time to produce the published features from videos, and to change the
    anonymizer, as recorded by each step (splavu_core.store.costs)."""
    sp = costs["splavu"]
    lines = ["### Cost", "", "| Features | Shards | Produce from videos (s) | Change of anonymizer (s) "
             "| Produce ÷ splavu | Change ÷ splavu |", "|---|---:|---:|---:|---:|---:|",
             f"| splavu | {sp['shards']} | {_secs(sp['produce_seconds'])} | {_secs(sp['change_seconds'])} | 1× | 1× |"]
    for name, c in costs.items():
        if name.startswith("pixel_"):
            lines.append(f"| {name} | {c['shards']} | {_secs(c['produce_seconds'])} | {_secs(c['change_seconds'])} | "
                         f"{_times(c['produce_ratio_vs_splavu'])} | {_times(c['change_ratio_vs_splavu'])} |")
    lines += ["", f"splavu: produce = extract raw latents ({_secs(sp['extract_seconds'])} s) + train the AAM "
                  f"({_secs(sp['train_seconds'])} s) + anonymize ({_secs(sp['anonymize_seconds'])} s); a change of "
                  f"anonymizer = train + anonymize from cached latents. A pixel method's change re-decodes and "
                  f"re-encodes every video. Ratios compare each baseline with splavu on the shards the baseline "
                  f"has. Wall times as recorded when each step ran, not in one controlled run "
                  f"(benchmarks/pixel_baselines.py is that)."]
    missing = list(dict.fromkeys(sp["missing"] + [m for n, c in costs.items() if n.startswith("pixel_")
                                                  for m in c["missing"]]))
    if missing:
        lines.append(f"Not recorded: {', '.join(missing[:8])}{' …' if len(missing) > 8 else ''}.")
    return lines + [""] + demo_markdown(costs.get("demo"))


def demo_markdown(demo: Mapping | None) -> list[str]:
    """The last `splavu demo`'s wall time per stage, and the datasets it did not run (said, not left out silently)."""
    if not demo:
        return []
    st = {k: demo["stages"].get(k) for k in DEMO_STAGES}  # the JSON file's keys are sorted: the pipeline's order here
    known = [v for v in st.values() if v is not None]
    lines = ["#### `make demo`, stage by stage (wall seconds)", "",
             "| " + " | ".join(st) + " | total |", "|" + "---:|" * (len(st) + 1),
             "| " + " | ".join("—" if v is None else f"{v:,.0f}" for v in st.values()) + f" | {sum(known):,.0f} |", ""]
    if st.get("install") is None:
        lines.append("install: not measured (the demo ran outside `make demo`).")
    line = measurements_line(demo.get("measurements"))
    if line:
        lines.append(line)
    for group, why in demo.get("left_out", {}).items():
        lines.append(f"**Not run in this demo: {group}** ({why}).")
    return lines + ([""] if len(lines) > 5 else [])


def measurements_line(measured: Mapping | None) -> str | None:
    """One line: per stage, the measurements (a task's protocol on one feature set, split and seeds) it scored and
    those it reused from the run's caches (the same measurement taken earlier in the run is never scored again), and
    how many of the scored ones' reader and attacker runs came from the store's score cache (score_cache.py)."""
    if not measured:
        return None
    parts = [f"{stage} {m.get('scored', 0)} scored, {m.get('reused', 0)} reused"
             + (f" ({m['read_back']} reader or attacker runs read back from the store's score cache)"
                if m.get("read_back") else "")
             for stage, m in ((s, measured[s]) for s in DEMO_STAGES if s in measured)]
    return "Measurements (a task's protocol on one feature set): " + "; ".join(parts) + "."


RETENTION_KEYS = (("ar_retention", "AR"), ("tad_retention", "TAD"), ("ad_retention", "AD"))


def retention_markdown(rows: Sequence[dict]) -> list[str]:
    """Utility retention, (anonymized − chance) / (raw − chance) with its 95% interval, per non-raw row and task."""
    have = [(k, h) for k, h in RETENTION_KEYS if any((r.get("derived_intervals") or {}).get(k) for r in rows)]
    if not have:
        return []
    out = ["### Utility retention (share of raw's above-chance utility kept)", "",
           "| Features | " + " | ".join(h for _, h in have) + " |", "|---|" + "---:|" * len(have)]
    for r in rows:
        if r["name"] == "raw":
            continue
        cells = []
        for k, _ in have:
            st = (r.get("derived_intervals") or {}).get(k)
            bad = st is None or any(_nan(st.get(x)) for x in ("value", "ci_low", "ci_high"))
            cells.append(("—" if st is None else NO_SIGNAL) if bad else
                         f"{st['value']:.2f} [{st['ci_low']:.2f}, {st['ci_high']:.2f}]")
        out.append(f"| {r['name']} | " + " | ".join(cells) + " |")
    return out + [""]


def gates_markdown(verdicts: Mapping | None, version: str | None) -> list[str]:
    """The promotion gates' recorded verdicts on the report's version (validation splits; the ledger's words)."""
    if not version:
        return []
    out = [f"### Promotion gates on AAM `{version}` (validation splits)", ""]
    if not verdicts:
        return out + ["Not gated yet (`splavu publish` measures both gates).", ""]
    for gate, label in (("privacy", "Privacy budget"), ("utility", "Utility")):
        v = verdicts.get(gate)
        out.append(f"- {label}: " + ("not run" if v is None else
                                     f"**{'passed' if v['passed'] else 'not passed'}**: {v['why']}"))
    return out + [""]


def report_markdown(report: dict, title: str = "Privacy–utility trade-off", verdicts: Mapping | None = None) -> str:
    cost = costs_markdown(report["costs"]) if report.get("costs") else []
    gates = gates_markdown(verdicts, report.get("aam_version")) if verdicts is not None else []
    return "\n".join([f"## {title}", "", table_markdown(report["rows"]), ""] + retention_markdown(report["rows"])
                     + gates + attackers_markdown(report["rows"]) + attributes_markdown(report["rows"])
                     + readers_markdown(report["rows"])
                     + unseen_markdown(report) + cost + _footer(report)) + "\n"


def ablation_markdown(report: dict, groups: Mapping[str, Sequence[str]]) -> str:
    """One table per group of variants (e.g. losses, tasks seen, ω_LC sweep), each led by the raw row."""
    by_name = {r["name"]: r for r in report["rows"]}
    raw = report["rows"][0]
    parts = ["## Ablations", ""]
    for title, names in groups.items():
        rows = [by_name[n] for n in names if n in by_name]
        if not rows:
            continue
        parts += [f"### {title}", "", table_markdown([raw] + rows), ""]
    missing = [n for names in groups.values() for n in names if n not in by_name]
    if missing:
        parts += [f"Not yet run: {', '.join(dict.fromkeys(missing))}.", ""]
    note = "each variant trains its own AAM (versions in reports/ablations/variants/)."
    return "\n".join(parts + _footer(report, note)) + "\n"


# ---------------------------------------------------------------- PNG

def png_markdown(png: bytes, alt: str = "trade-off") -> str:
    """A PNG inline in Markdown (the one way Dagster's UI shows an image from metadata)."""
    return f"![{alt}](data:image/png;base64,{base64.b64encode(png).decode()})"


def tradeoff_png(report: dict, title: str = "Privacy–utility trade-off") -> bytes:
    """x: privacy cMAP (lower = more private), y: mean utility retention over AR/TAD/AD (raw = 1)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    raw = report["rows"][0]
    fig, ax = plt.subplots(figsize=(5.5, 4))
    points: dict[tuple, list[str]] = {}  # identical results (e.g. the same config under two names) share a label
    for r in report["rows"]:
        x = r.get("privacy_cmap")
        y = 1.0 if r["name"] == "raw" else mean_utility_retention(raw, r)
        if x is not None and y is not None:
            points.setdefault((round(x, 9), round(y, 9)), []).append(r["name"])
            st = (r.get("intervals") or {}).get("privacy_cmap")
            if st:  # the privacy cMAP's 95% interval as a horizontal bar
                ax.errorbar([x], [y], xerr=[[x - st["ci_low"]], [st["ci_high"] - x]], fmt="none", ecolor="grey",
                            capsize=3, lw=1)
    for (x, y), names in points.items():
        is_raw = "raw" in names
        ax.scatter([x], [y], s=40, marker="s" if is_raw else "o", color="black" if is_raw else None)
        ax.annotate(" = ".join(names), (x, y), textcoords="offset points", xytext=(5, 4), fontsize=8)
    chance = raw.get("privacy_chance_cmap")
    if chance is not None:
        ax.axvline(chance, ls="--", color="grey", lw=1)
        ax.annotate("chance", (chance, ax.get_ylim()[0]), textcoords="offset points", xytext=(3, 3), fontsize=8,
                    color="grey")
    ax.set_xlabel("privacy attack cMAP (strongest attacker of the suite)  ← more private")
    ax.set_ylabel(f"mean utility retention ({'/'.join(k.split('_')[0].upper() for k in UTILITY_KEYS)}) ↑")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=90)
    plt.close(fig)
    return buf.getvalue()


# ---------------------------------------------------------------- files

def report_json(report: dict) -> bytes:
    """The report as JSON; NaN (a share of nothing: raw at chance) is written as null, never as `NaN`."""
    return (json.dumps(without_nan(report), indent=1, allow_nan=False) + "\n").encode()


def write_privacy_utility_report(store: FeatureStore, report: dict, stem: str = "privacy_utility") -> dict[str, Path]:
    """Write <root>/reports/<stem>.json, .md and .png; returns their paths (keys json, md, png)."""
    return {"json": _write_atomic(store, f"{stem}.json", report_json(report)),
            "md": _write_atomic(store, f"{stem}.md", report_markdown(
                report, verdicts=read_verdicts(store, report["aam_version"]) if report.get("aam_version") else {}
            ).encode()),
            "png": _write_atomic(store, f"{stem}.png", tradeoff_png(report))}


def write_ablation_report(store: FeatureStore, report: dict, groups: Mapping[str, Sequence[str]],
                          stem: str = "ablations") -> dict[str, Path]:
    """Write <root>/reports/<stem>.json, .md (grouped tables) and .png."""
    return {"json": _write_atomic(store, f"{stem}.json", report_json(report)),
            "md": _write_atomic(store, f"{stem}.md", ablation_markdown(report, groups).encode()),
            "png": _write_atomic(store, f"{stem}.png", tradeoff_png(report, title="Ablations: privacy–utility"))}


def read_report(store: FeatureStore, stem: str = "privacy_utility") -> dict:
    try:
        return store.files.read_json(f"reports/{stem}.json")
    except FileNotFoundError:
        raise FileNotFoundError(f"no report at {store.loc('reports', f'{stem}.json')}: "
                                f"materialise privacy_utility_report first") from None
