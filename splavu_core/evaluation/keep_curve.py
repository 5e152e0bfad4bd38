"""The keep family fitted from a store's cached latents and scored in memory, member by member: what the unseen-task
protocols (unseen.py: the version's configuration refitted without a task, or without some action classes) and the
research sweeps (benchmarks/keep_sweep.py: widths, shrinkage, task sets) read.

Each member (a width k, a shrinkage, a set of co-trained tasks, with or without recentring) is fitted as `aam_model`
fits the keep stage (utility labels only), the store's evaluation sets are projected in memory, and every member is
scored in one pass (scoring.score_sets: probe seeds, a bootstrap over the scored videos, changes paired with raw).

    family_sets       one member per (recentring, ridge, k, seen task set), projected
    heldout_classes   per fold, the fit without some action classes, AR probed on those classes only
    score_family      score raw and the members on a split; each member gets its headline figures
    choose_ridge      the shrinkage whose single-task fits lose least on the tasks they never saw

Which configuration a store publishes is the publish rule's choice (operating_point.py), not this module's.
"""
from __future__ import annotations

import dataclasses
import io
from collections.abc import Sequence

import numpy as np

from splavu_core.aam.closed_form import fit_closed_form
from splavu_core.aam.config import TrainConfig
from splavu_core.aam.training_data import load_training_data
from splavu_core.evaluation.attackers import SUITE_NAMES
from splavu_core.evaluation.scoring import score_sets
from splavu_core.evaluation.suite import load_feature_sets
from splavu_core.ingest.datasets import task_datasets, training_plan
from splavu_core.store.feature_store import FeatureStore

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


def score_family(store: FeatureStore, inp: FamilyInputs, sets: dict, members: list[dict], marks: list[dict],
                 versions: Sequence[str] = (), split: str = "select", seeds: Sequence[int] = range(5),
                 log=None) -> list:
    """Score raw, the members, the marks' sets and the published `versions` in one pass; each member and mark (a
    version added as "AAM <version>") gets its headline figures. Returns raw's rows (task, metric, interval)."""
    sets = dict(sets)
    for version in versions:
        name = f"AAM {version}"
        sets[name] = load_feature_sets(store, inp.which, "anonymized", version, datasets=inp.datasets)
        marks.append({"name": name, "seen": ["ar", "tad", "ad"]})
    rows = score_sets({"raw": inp.raw, **sets}, inp.which, inp.datasets, split=split, seeds=list(seeds), log=log,
                      probe_kwargs=PROBE_KWARGS, store=store)
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
