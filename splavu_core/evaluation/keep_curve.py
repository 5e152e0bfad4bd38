"""The keep family's privacy–utility curve and its operating point, on validation videos.

Each member (a width k, a shrinkage, a set of co-trained tasks) is fitted as `aam_model` fits the keep stage
(utility labels only), the store's evaluation sets are projected in memory, and every member is scored in one
pass (scoring.score_sets: probe seeds, a bootstrap over the scored videos, changes paired with raw).

    operating_point   the largest k that passes both promotion gates' rules on these rows: the weaker leakage
                      removal's lower end meets the privacy budget, no seen task's retention has its upper end
                      below the utility floor
    choose_ridge      the shrinkage whose single-task fits lose least on the tasks they never saw
    keep_curve        the curve of a store -> reports/keep_family.{json,png} (validation only)

Choosing here, not inside training: the choice reads private-attribute labels (the attackers), and the
adapter must not depend on them (the label-flip test), so the curve advises and the engineer sets `keep`.
"""
from __future__ import annotations

import dataclasses
import io
import time
from collections.abc import Sequence

import numpy as np

from splavu_core.aam.closed_form import fit_closed_form
from splavu_core.aam.config import TrainConfig
from splavu_core.aam.training_data import load_training_data
from splavu_core.evaluation.attackers import SUITE_NAMES
from splavu_core.evaluation.gates import scored_in_process
from splavu_core.evaluation.scoring import score_sets
from splavu_core.evaluation.suite import load_feature_sets
from splavu_core.ingest.datasets import task_datasets, training_plan
from splavu_core.store.feature_store import FeatureStore
from splavu_core.store.ledger import privacy_threshold, retention_state, utility_fraction

TASKS = ("privacy", "clip_privacy", "reid", "ar", "tad", "ad", "bias_f")
PRIVATE = ("privacy", "clip_privacy", "reid")   # the privacy gate's parts: close-ups, clips, linking
HEADLINE = {"privacy": "leakage_removed", "clip_privacy": "leakage_removed", "reid": "linkage_removed",
            "ar": "retention_top1",
            "tad": "retention_mAP", "ad": "retention_auc", "bias_f": "delta_gap"}
GENERALISATION_TASKS = ("ar", "tad")  # AD is left out: on validation its retention is a ratio of noise (docs/method.md)
DEFAULT_KS = (8, 11, 14, 17, 20, 24)


def summarise(rows, name: str) -> dict:
    """name's headline figures: {task: [value, ci_low, ci_high]} (leakage removed; utility retention; bias gap Δ)."""
    out = {}
    for r in rows:
        if r["feature_set"] == name and HEADLINE.get(r["task"]) == r["metric"]:
            out[r["task"]] = [round(r["value"], 4), round(r["ci_low"], 4), round(r["ci_high"], 4)]
    return out


PART_NAMES = {"privacy": "close-ups removed", "clip_privacy": "action clips removed", "reid": "linkage removed"}


def privacy_state(v: list, budget: float) -> str:
    """The privacy gate's three-way verdict on one part's [value, ci_low, ci_high] (ledger._verdict_one): 'passed'
    (lower end at the budget), 'undecidable' (the interval holds it), 'FAILED', or 'no signal' (raw at chance: NaN)."""
    value, low, high = v
    if value is None or value != value:
        return "no signal"
    return "passed" if low >= budget else "undecidable" if high >= budget else "FAILED"


def failures(m: dict, budget: float, floor: float) -> dict[str, str]:
    """What keeps member m from both promotion gates, {part: its figures and state} (empty: it passes): each
    privacy part not passed, in the gate's own words (FAILED, undecidable: its interval holds the budget, which the
    gate refuses too), and each seen task's retention the utility gate refuses (ledger.retention_state 'lost'; an
    undecidable retention does not refuse, as in the gate; a task whose raw features are at chance has nothing to
    lose)."""
    out = {} if "privacy" in m else {"close-ups removed": "not measured"}
    for t in PRIVATE:
        if t in m and (state := privacy_state(m[t], budget)) != "passed":
            out[PART_NAMES[t]] = f"{m[t][0]:.2f} [{m[t][1]:.2f}, {m[t][2]:.2f}] at budget {budget:g}: {state}"
    out.update({f"{t.upper()} retention": f"{m[t][0]:.2f} [{m[t][1]:.2f}, {m[t][2]:.2f}], refused at floor {floor:g}: "
                f"FAILED" for t in m["seen"] if t in m and retention_state(*m[t], floor) == "lost"})
    return out


def operating_point(members: list[dict], budget: float, floor: float) -> dict | None:
    """The largest k that passes both promotion gates' rules on these rows (no `failures`): the weaker leakage
    removal's lower end meets the privacy budget, and no seen task's retention is refused by the utility gate."""
    ok = [m for m in members if not failures(m, budget, floor)]
    return max(ok, key=lambda m: m["k"]) if ok else None


def why_no_width(out: dict) -> str:
    """Why the curve `out` picks no width, plainly: each width's parts that are not passed, in the gates' words, and
    the parts every width FAILS (then no version of this family can be published on this store under these budgets;
    a budget is policy, not a knob to turn until something passes). A part undecidable at some width is not a
    failure of the family: more validation videos would decide it."""
    own = [m for m in out["members"] if bool(m.get("recentre")) == bool(out.get("recentre"))] or out["members"]
    per = {m["k"]: failures(m, out["budget"], out["floor"]) for m in own}
    lines = [f"no width of {list(per)} passes both gates' rules on validation (privacy budget {out['budget']:g} at "
             f"the lower end, utility floor {out['floor']:g})"]
    lines += [f"k = {k}: " + "; ".join(f"{part} {v}" for part, v in parts.items()) for k, parts in per.items()]
    failed = [{p for p, v in parts.items() if v.endswith("FAILED") or v == "not measured"} for parts in per.values()]
    common = sorted(set.intersection(*failed)) if failed else []
    if common:
        lines.append(f"every width FAILS on {', '.join(common)}: no width of this family can be published on this "
                     f"store under these budgets")
    elif any(any(v.endswith("undecidable") for v in parts.values()) for parts in per.values()):
        lines.append("no part fails at every width; the undecidable ones need more validation videos (`splavu "
                     "publish` says how many) before a width can be chosen")
    return "\n".join(lines)


def choose_ridge(members: list[dict], budget: float) -> dict | None:
    """The shrinkage that generalises best to tasks never seen in training, on these (validation) rows: per ridge,
    the worst retention of an unseen task (AR, TAD) over the single-task fits; among ridges whose all-task fit
    passes the privacy budget's rule (all ridges when none does), the highest. None without single-task fits."""
    by_ridge: dict[float, dict] = {}
    for m in members:
        r = by_ridge.setdefault(m["ridge"], {"ridge": m["ridge"], "worst_unseen": None, "private": None})
        if len(m["seen"]) == 1:
            unseen = [m[t][0] for t in GENERALISATION_TASKS if t not in m["seen"] and t in m]
            if unseen:
                r["worst_unseen"] = min(unseen + ([r["worst_unseen"]] if r["worst_unseen"] is not None else []))
        elif set(m["seen"]) >= set(GENERALISATION_TASKS):
            r["private"] = all(m[t][1] >= budget for t in PRIVATE if t in m) and "privacy" in m
    scored = [r for r in by_ridge.values() if r["worst_unseen"] is not None]
    if not scored:
        return None
    eligible = [r for r in scored if r["private"]] or scored
    best = max(eligible, key=lambda r: r["worst_unseen"])
    return {**best, "by_ridge": sorted(by_ridge.values(), key=lambda r: r["ridge"]),
            "privacy_rule_met_by_any": any(r["private"] for r in scored)}


@dataclasses.dataclass
class FamilyInputs:
    """What every member is fitted from and scored on, read once: the training data aam_model would read (by the
    store's roles), cfg with the tasks that have labelled data, and the raw evaluation sets."""
    data: object
    cfg: TrainConfig
    datasets: dict                # task -> dataset
    which: list                   # the TASKS this store can score
    raw: dict                     # dataset -> raw videos


def load_inputs(store: FeatureStore, cfg: TrainConfig | None = None) -> FamilyInputs:
    cfg = cfg or TrainConfig()
    plan = training_plan(store)
    data = load_training_data(store, plan.datasets["ar"], plan.datasets["tad"], plan.datasets["ad"])
    ds = task_datasets(store, {})
    which = [t for t in TASKS if t in ds]
    return FamilyInputs(data, dataclasses.replace(cfg, tasks=plan.tasks), ds, which,
                        load_feature_sets(store, which, "raw", datasets=ds))


def family_sets(inp: FamilyInputs, ks: Sequence[int], ridges: Sequence[float] | None = None,
                seens: Sequence[str] = (), recentres: Sequence[bool] | None = None) -> tuple[dict, list[dict]]:
    """Fit one member per (recentring, ridge, k, seen task set) and project the raw sets through it.
    Returns (name -> dataset -> videos, members); seens: "ar", "ar,tad", ... (default: the config's tasks);
    recentres: with and/or without recentring (default: as the config's adapter)."""
    sets, members = {}, []
    for ridge in ridges or [inp.cfg.keep_ridge]:
        cfg = dataclasses.replace(inp.cfg, keep_ridge=ridge)
        for k in ks:
            for seen in seens or [",".join(cfg.tasks)]:
                tasks = tuple(t for t in seen.split(",") if t)
                maps = fit_closed_form(inp.data, tasks, k, cfg)
                # recentring asked for without centroids (no task 'ar'): the member is keep alone, once
                for recentred in dict.fromkeys(r and r in maps for r in recentres or [cfg.recentre]):
                    name = (f"keep k={k}" + (" + recentre" if recentred else "") + (f" ridge {ridge:g}" if ridges else "")
                            + (f" seen {seen}" if seens else ""))
                    sets[name] = {d: [dataclasses.replace(v, feats=maps[recentred](v.feats)) for v in vs]
                                  for d, vs in inp.raw.items()}
                    members.append({"name": name, "k": k, "ridge": ridge, "seen": list(tasks), "recentre": recentred})
    return sets, members


def heldout_classes(store: FeatureStore, inp: FamilyInputs, ks: Sequence[int], folds: int = 3,
                    seeds: Sequence[int] = range(5), recentres: Sequence[bool] | None = None,
                    split: str = "val", baselines: dict | None = None) -> list[dict]:
    """Action classes nobody trained for. Per fold f, the fit sees AR alone, without the classes classes[f::folds]
    (neither their train nor their val videos), and AR is probed on those classes' videos only: raw vs member,
    paired, with intervals. Returns the members, each with its fold, unseen classes and raw's top-1 on them
    ([value, ci_low, ci_high, chance]); a member's "ar" is its retention (NaN when raw is at chance there).
    baselines: name -> a label-free per-video map (T, D) -> (T, k), scored beside the members ("baseline": True)."""
    d, ards = inp.data, inp.datasets.get("ar")
    assert ards and len(d.classes) >= 2 * folds, f"heldout_classes needs an AR dataset with >= {2 * folds} classes"
    out = []
    for f in range(folds):
        unseen = set(d.classes[f::folds])
        seen = [v for v in d.ar_train if v.meta["action"] not in unseen]
        data = dataclasses.replace(d, ar_train=seen, ar_val=[v for v in d.ar_val if v.meta["action"] not in unseen],
                                   classes=[c for c in d.classes if c not in unseen])
        sub = dataclasses.replace(inp, data=data, cfg=dataclasses.replace(inp.cfg, tasks=("ar",)), which=["ar"],
                                  raw={ards: [v for v in inp.raw[ards] if v.meta.get("action") in unseen]})
        sets, members = family_sets(sub, ks, recentres=recentres)
        for name, fn in (baselines or {}).items():
            sets[name] = {ds: [dataclasses.replace(v, feats=fn(v.feats).astype(np.float32)) for v in vs]
                          for ds, vs in sub.raw.items()}
            members.append({"name": name, "seen": [], "baseline": True})
        raw = next(r for r in score_family(store, sub, sets, members, [], split=split, seeds=seeds) if r["metric"] == "top1")
        out += [{**m, "fold": f, "unseen": sorted(unseen),
                 "raw_top1": [round(raw[k], 4) for k in ("value", "ci_low", "ci_high", "chance")]} for m in members]
    return out


PROBE_KWARGS = {"privacy": {"attackers": SUITE_NAMES}}  # the gate's judges, as the gate


def gate_scores(store: FeatureStore, version: str, inp: FamilyInputs, sets: dict, seeds: Sequence[int]) -> dict:
    """What this process's gate measurement of `version` (gates.scored_in_process) spares the curve: raw's scores on
    the tasks it measured, and the version's for the member that publishes its vectors (up to float32 rounding: the
    tables come out of torch, a member out of numpy). {} when the gates did not measure it here with this protocol."""
    hit = scored_in_process(store, version, seeds, PROBE_KWARGS, inp.datasets)
    if hit is None:
        return {}
    same = next((name for name, member in sets.items() if all(
        len(member.get(d, ())) == len(vs) and all(a.video_id == b.video_id and a.feats.shape == b.feats.shape
                                                  and np.allclose(a.feats, b.feats, 1e-5, 1e-4)
                                                  for a, b in zip(member[d], vs))
        for d, vs in hit["videos"].items())), None)
    by_task = hit["scored"].items()
    return {"version": version, "reference_cache": {t: (sc["raw"], None) for t, sc in by_task if "raw" in sc},
            "scored": {same: {t: sc["splavu"] for t, sc in by_task if "splavu" in sc}} if same else {}, "member": same}


def score_family(store: FeatureStore, inp: FamilyInputs, sets: dict, members: list[dict], marks: list[dict],
                 versions: Sequence[str] = (), split: str = "val", seeds: Sequence[int] = range(5), log=None,
                 reuse: dict | None = None) -> list:
    """Score raw, the members, the marks' sets and the published `versions` in one pass; each member and mark (a
    version added as "AAM <version>") gets its headline figures. Returns raw's rows (task, metric, interval).
    reuse: gate_scores' answer, whose scores are taken instead of scoring those sets again."""
    sets = dict(sets)
    for version in versions:
        name = f"AAM {version}"
        sets[name] = load_feature_sets(store, inp.which, "anonymized", version, datasets=inp.datasets)
        marks.append({"name": name, "seen": ["ar", "tad", "ad"]})
    reuse = reuse or {}
    rows = score_sets({"raw": inp.raw, **sets}, inp.which, inp.datasets, split=split, seeds=list(seeds), log=log,
                      probe_kwargs=PROBE_KWARGS, reference_cache=dict(reuse.get("reference_cache") or {}) or None,
                      scored=reuse.get("scored"), store=store)
    for m in members + marks:
        m.update(summarise(rows, m["name"]))
    return [{k: r[k] for k in ("task", "metric", "value", "ci_low", "ci_high", "chance")} for r in rows
            if r["feature_set"] == "raw"]


def plot_png(members: list[dict], chosen: dict | None, marks: Sequence[dict] = ()) -> bytes:
    """Two panels (AR, TAD): each member's utility retention against its weaker leakage removal, with intervals;
    the chosen point starred, published versions or variants (marks) drawn beside."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 3.6))
    for ax, task in zip(axes, ("ar", "tad")):
        for recentred in sorted({bool(m.get("recentre")) for m in members}):
            pts = [m for m in members if task in m and "privacy" in m and "clip_privacy" in m
                   and bool(m.get("recentre")) == recentred]
            x = [min(m["privacy"][0], m["clip_privacy"][0]) for m in pts]
            y = [m[task][0] for m in pts]
            err = [[m[task][0] - m[task][1] for m in pts], [m[task][2] - m[task][0] for m in pts]]
            ax.errorbar(x, y, yerr=err, fmt="o-", label="keep + recentre" if recentred else "keep")
            for m, xi, yi in zip(pts, x, y):
                ax.annotate(f"k={m['k']}", (xi, yi), textcoords="offset points", xytext=(4, 4), fontsize=7)
            if chosen and chosen in pts:
                i = pts.index(chosen)
                ax.plot([x[i]], [y[i]], "*", ms=14, color="tab:red", label=f"chosen k={chosen['k']}")
        for m in marks:
            if task in m and "privacy" in m and "clip_privacy" in m:
                ax.errorbar([min(m["privacy"][0], m["clip_privacy"][0])], [m[task][0]],
                            yerr=[[m[task][0] - m[task][1]], [m[task][2] - m[task][0]]], fmt="s", label=m["name"])
        ax.axhline(1.0, color="grey", lw=0.8)
        ax.set_xlabel("weaker leakage removed (close-ups, action clips)")
        ax.set_ylabel(f"{task.upper()}: share of raw's above-chance utility kept")
    axes[1].legend(fontsize=7, loc="center left", bbox_to_anchor=(1.02, 0.5))
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=90, bbox_inches="tight")
    plt.close(fig)
    return buf.getvalue()


def keep_curve(store: FeatureStore, ks: Sequence[int] = DEFAULT_KS, seeds: Sequence[int] = range(5),
               versions: Sequence[str] = (), cfg: TrainConfig | None = None, budget: float | None = None,
               floor: float | None = None, extra_sets: dict | None = None, extra_marks: Sequence[dict] = (),
               inputs: FamilyInputs | None = None, log=None,
               recentres: Sequence[bool] | None = None, reuse_gates_of: str | None = None) -> tuple[dict, bytes]:
    """The family's curve on validation videos, with published `versions` (and `extra_sets`, e.g. variants
    trained in memory) marked; writes reports/keep_family.{json,png} and returns (the JSON, the PNG).
    recentres: also draw the members with/without recentring; the operating point is chosen among the members
    that recentre as the config's adapter does. reuse_gates_of: a version the gates measured in this process: its
    scores stand in for raw's and for the member publishing its vectors (gate_scores; "reused" says what)."""
    budget = privacy_threshold() if budget is None else budget
    floor = utility_fraction() if floor is None else floor
    t0 = time.perf_counter()
    inp = inputs or load_inputs(store, cfg)
    ks = [k for k in ks if 0 < k < inp.data.dim]  # k = D would publish an invertible map of the raw latents
    assert ks, f"keep_curve: no width below the latents' {inp.data.dim} dims among {ks}"
    sets, members = family_sets(inp, ks, recentres=recentres)
    marks = [dict(m) for m in extra_marks]
    reuse = gate_scores(store, reuse_gates_of, inp, sets, seeds) if reuse_gates_of else {}
    raw_rows = score_family(store, inp, {**sets, **(extra_sets or {})}, members, marks, versions, "val", seeds, log,
                            reuse=reuse)
    own = inp.cfg.recentre and any(m["recentre"] for m in members)
    chosen = operating_point([m for m in members if m["recentre"] == own], budget, floor)
    out = {"split": "val", "seeds": list(seeds), "budget": budget, "floor": floor, "members": members,
           "marks": marks, "chosen_k": chosen and chosen["k"], "keep_ridge": inp.cfg.keep_ridge,
           "keep_w_motion": inp.cfg.keep_w_motion, "keep_w_dynamic": inp.cfg.keep_w_dynamic, "recentre": own,
           "raw": raw_rows, "reused": {"version": reuse["version"], "member": reuse["member"],
                                       "raw_tasks": sorted(reuse["reference_cache"])} if reuse else {},
           "seconds": round(time.perf_counter() - t0, 1)}
    png = plot_png(members, chosen, marks)
    store.files.write_json("reports/keep_family.json", out)
    store.files.put_atomic("reports/keep_family.png", png)
    return out, png


def curve_markdown(out: dict) -> str:
    """The curve as a Markdown table: one row per member (and mark), the chosen k in bold."""
    def pct(v):
        return "—" if v is None else f"{v[0] * 100:.0f}% [{v[1] * 100:.0f}, {v[2] * 100:.0f}]"

    def ret(v):
        return "—" if v is None else f"{v[0]:.2f} [{v[1]:.2f}, {v[2]:.2f}]"

    lines = ["| member | close-ups removed | action clips removed | re-id linkage removed | AR retention | "
             "TAD retention |", "|---|---:|---:|---:|---:|---:|"]
    for m in out["members"] + out["marks"]:
        name = f"**{m['name']} (chosen)**" if m.get("k") is not None and m.get("k") == out["chosen_k"] \
            and m in out["members"] else m["name"]
        lines.append(f"| {name} | {pct(m.get('privacy'))} | {pct(m.get('clip_privacy'))} | {pct(m.get('reid'))} | "
                     f"{ret(m.get('ar'))} | {ret(m.get('tad'))} |")
    reused = out.get("reused") or {}
    if reused.get("raw_tasks"):
        lines += ["", f"Scored by the gates of AAM {reused['version']} in the same run, not again: raw on "
                      f"{', '.join(reused['raw_tasks'])}" + (f"; {reused['member']}, which publishes that version's "
                                                               f"vectors" if reused.get("member") else "") + "."]
    return "\n".join(lines)
