"""Tasks nobody fitted for: what a feature store exists to serve.

For the configuration of an AAM version (its keep width, recentring, fitted tasks), and beside it keep alone and the
same-width PCA (label-free: what it keeps does not depend on any task's labels):

    leave_one_task_out   for each utility task the store has (AR, TAD, AD), the configuration fitted WITHOUT that
                         task's labels, the task read by its reader suite (raw's strongest judges), retention
                         against raw with its interval
    new_classes          AR on action classes the fit never saw: per fold the fit sees AR alone without a third of
                         the classes (keep_curve.heldout_classes), AR read on those classes' videos only

Both fit in closed form (seconds) and score in memory; nothing is published. Rows go to the metrics table as
feature sets `unseen_<member>` (task = the left-out task; new classes: task `ar_new_classes`, one fold per seed
block), aam_version = the version whose configuration was refitted. No dagster here.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

from splavu_core.aam.config import TrainConfig
from splavu_core.aam.model import AAMConfig
from splavu_core.evaluation import trivial
from splavu_core.evaluation.keep_curve import family_sets, heldout_classes, load_inputs
from splavu_core.evaluation.scoring import score_sets
from splavu_core.store.feature_store import FeatureStore

UTILITY = ("ar", "tad", "ad")
MEMBERS = ("config", "keep", "pca")          # the version's configuration, keep alone, the same-width PCA
NEW_CLASS_TASK = "ar_new_classes"
# the adapter fields a closed-form refit reads (fit_closed_form), taken from the version's own stored config
REFIT_FIELDS = ("keep", "recentre", "recentre_draw", "recentre_top")


def version_config(store: FeatureStore, version: str) -> TrainConfig:
    """The TrainConfig `version` was fitted with (adapter.json's train_config), as a TrainConfig."""
    meta = store.files.read_json(f"aam/{version}/adapter.json")
    tc = dict((meta.get("extra") or {}).get("train_config") or {})
    if tc and "recentre_on" not in tc:  # recorded before recentring could be on clips: it was on classes
        tc["recentre_on"] = "classes"
    cfg = TrainConfig.from_flat({k: tuple(v) if k == "tasks" else v for k, v in tc.items()}) if tc else TrainConfig()
    stored = meta.get("config", {})
    return cfg.replace(**{k: stored[k] for k in REFIT_FIELDS if k in stored})


def closed_form_why_not(store: FeatureStore, version: str) -> str | None:
    """None when `version` is a closed-form configuration (keep k, layers 0, no appearance projection) that refits in
    seconds; else why the unseen-task protocols do not refit it."""
    c = AAMConfig.from_dict(store.files.read_json(f"aam/{version}/adapter.json")["config"])  # under the names now
    if not c.keep or c.layers or c.projection_rank:
        return (f"version {version} is not a closed-form keep configuration (keep={c.keep}, "
                f"layers={c.layers}, projection_rank={c.projection_rank}): refitting a trained adapter "
                f"without each task is a training run per task; train it with `splavu train --tasks ...` and "
                f"evaluate that version instead")
    return None


def _members(inp, tasks: tuple, k: int, recentre: bool, pca) -> dict[str, dict]:
    """member -> dataset -> videos: the configuration and keep alone fitted on `tasks`, and the PCA."""
    sub = dataclasses.replace(inp, cfg=dataclasses.replace(inp.cfg, tasks=tasks))
    sets, members = family_sets(sub, [k], recentres=[recentre, False])
    by = {("config" if m["recentre"] == recentre else "keep"): sets[m["name"]] for m in members}
    by.setdefault("config", by["keep"])  # recentring without centroids (no AR labels): the configuration IS keep
    return {**by, "pca": pca}


def leave_one_task_out(store: FeatureStore, version: str, split: str = "test", seeds: Sequence[int] = range(5),
                       log: Callable | None = None, reference_cache: dict | None = None) -> tuple[list[dict], dict]:
    """(metric rows, {task: {"fitted_on", "reader", "skipped"?}}) of every utility task with the configuration fitted
    without its labels."""
    cfg = version_config(store, version)
    inp = load_inputs(store, cfg)
    inp = dataclasses.replace(inp, cfg=dataclasses.replace(inp.cfg, tasks=tuple(cfg.tasks)))
    k = cfg.keep
    pca = trivial.baseline_sets(inp.raw, trivial.training_clips(inp.raw, inp.datasets), k)[f"pca_{k}"]
    rows, fits = [], {}  # per task: what the fit read, who judged (and why skipped, if it was)
    for task in [t for t in UTILITY if t in inp.which]:
        tasks = tuple(t for t in inp.cfg.tasks if t != task)
        sets = {f"unseen_{m}": s for m, s in _members(inp, tasks, k, cfg.recentre, pca).items()}
        if log:
            log(f"unseen {task}: fitted on {', '.join(tasks) or 'no task (motion directions)'}")
        res = score_sets({"raw": inp.raw, **sets}, [task], inp.datasets, split=split, seeds=list(seeds), log=log,
                         versions={n: version for n in sets}, reference_cache=reference_cache, store=store)
        rows += [r for r in res if r["feature_set"] != "raw"]
        raw_sc = res.scored.get(task, {}).get("raw")
        fits[task] = {"fitted_on": list(tasks), "reader": raw_sc.details.get("strongest") if raw_sc else None,
                         **({"skipped": res.skipped[task]} if task in res.skipped else {})}
    return rows, fits


def summary(rows: Sequence[dict], fits: dict, new: Sequence[dict]) -> dict:
    """The report's "unseen" section: {"loto": {member: {task: {value, ci_low, ci_high, fitted_on, reader}}},
    "new_classes": {member: [{fold, unseen, value, ci_low, ci_high, raw_top1}]}}."""
    head = {"ar": "retention_top1", "tad": "retention_mAP", "ad": "retention_auc"}
    loto: dict = {}
    for r in rows:
        if r["metric"] == head.get(r["task"]) and r["feature_set"].startswith("unseen_"):
            loto.setdefault(r["feature_set"][len("unseen_"):], {})[r["task"]] = {
                **{k: r[k] for k in ("value", "ci_low", "ci_high")}, **{k: v for k, v in fits[r["task"]].items()}}
    classes: dict = {}
    for m in new:
        if "ar" in m:
            classes.setdefault(m["member"], []).append({"fold": m["fold"], "unseen": m["unseen"], "value": m["ar"][0],
                                                        "ci_low": m["ar"][1], "ci_high": m["ar"][2],
                                                        "raw_top1": m["raw_top1"]})
    return {"loto": loto, "new_classes": classes, "fits": fits}


def new_classes(store: FeatureStore, version: str, split: str = "test", seeds: Sequence[int] = range(5),
                folds: int = 3) -> list[dict]:
    """Per fold and member: AR retention on classes the fit never saw ([value, ci_low, ci_high]), raw's top-1 there."""
    cfg = version_config(store, version)
    inp = load_inputs(store, cfg)
    k = cfg.keep
    if not inp.datasets.get("ar") or len(inp.data.classes) < 2 * folds:
        return []
    fit = trivial.fit(trivial.training_clips(inp.raw, inp.datasets), k)[f"pca_{k}"]
    out = heldout_classes(store, inp, [k], folds=folds, seeds=seeds, recentres=[cfg.recentre, False],
                          split=split, baselines={"pca": lambda x, mu=fit[0], q=fit[1]: (x.astype("float64") - mu) @ q})
    recentre = cfg.recentre
    for m in out:
        m["member"] = "pca" if m.get("baseline") else ("config" if m.get("recentre") == recentre else "keep")
    return out


REPORT = "reports/unseen.json"
NAMES = {"config": "the version's configuration", "keep": "keep alone", "pca": "same-width PCA"}


def evaluate(store: FeatureStore, version: str, split: str = "test", seeds: Sequence[int] = range(5),
             log: Callable | None = None) -> dict:
    """Both protocols for `version` -> {"rows", "summary", "path"}; the summary is written to reports/unseen.json.
    A version that is not closed form gets a summary that says why nothing was refitted ("skipped")."""
    why = closed_form_why_not(store, version)
    if why:
        out = {"version": version, "split": split, "seeds": list(seeds), "skipped": why, "loto": {},
               "new_classes": {}, "fits": {}}
        store.files.write_json(REPORT, out)
        return {"rows": [], "summary": out, "path": store.loc(REPORT)}
    rows, fits = leave_one_task_out(store, version, split, seeds, log)
    new = new_classes(store, version, split, seeds)
    out = {"version": version, "split": split, "seeds": list(seeds), **summary(rows, fits, new)}
    store.files.write_json(REPORT, out)
    return {"rows": rows, "summary": out, "path": store.loc(REPORT)}


def markdown(s: dict) -> str:
    """Two tables: leave-one-task-out retention per member, and new-class AR retention per fold."""
    def cell(st):
        return "—" if st is None else f"{st['value']:.2f} [{st['ci_low']:.2f}, {st['ci_high']:.2f}]"

    if s.get("skipped"):
        return f"Not measured: {s['skipped']}."
    tasks = [t for t in UTILITY if t in s.get("fits", {})]
    lines = ["| fitted without the task's labels | " + " | ".join(
        f"{t.upper()} (fit on {', '.join(s['fits'][t]['fitted_on']) or 'no task'}; judged by "
        f"{s['fits'][t].get('reader') or '—'})" for t in tasks) + " |", "|---|" + "---:|" * len(tasks)]
    for m in MEMBERS:
        if m in s["loto"]:
            lines.append(f"| {NAMES[m]} | " + " | ".join(cell(s["loto"][m].get(t)) for t in tasks) + " |")
    folds = sorted({f["fold"] for v in s["new_classes"].values() for f in v})
    if folds:
        first = next(iter(s["new_classes"].values()))
        heads = [f"fold {f['fold']}: {', '.join(f['unseen'])} (raw top-1 {f['raw_top1'][0]:.2f})" for f in first]
        lines += ["", "| AR on classes the fit never saw | " + " | ".join(heads) + " |", "|---|" + "---:|" * len(folds)]
        for m in MEMBERS:
            if m in s["new_classes"]:
                by = {f["fold"]: f for f in s["new_classes"][m]}
                lines.append(f"| {NAMES[m]} | " + " | ".join(cell(by.get(f)) for f in folds) + " |")
    return "\n".join(lines)
