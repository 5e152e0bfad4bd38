"""The keep family's privacy–utility curve and operating point on validation, and its task ablation (prints JSON).

    python benchmarks/keep_sweep.py --store store --k 8 14 20 24 32 [--mark VERSION]  # curve + operating point (val)
    python benchmarks/keep_sweep.py --store store --split test --seen ar tad ad ar,tad ar,ad tad,ad ar,tad,ad
    python benchmarks/keep_sweep.py --store store --seen ar tad ad ar,tad,ad --ridge 0.001 0.01 0.1 1  # shrinkage (val)

Each member is fitted exactly as `aam_model` fits the keep stage (TrainConfig's keep_* fields; utility labels
only), the store's evaluation sets are projected in memory, and all of them are scored in one pass with the
evaluation suite (splavu_core.evaluation.scoring.score_sets: probe seeds, bootstrap over the scored videos,
changes paired with raw). --split val scores validation videos only (a dataset's `val` videos, else a
deterministic carve of its train videos), never the report's test split; the operating point is the largest k
that passes both promotion gates' rules there: the weaker leakage removal (close-ups, action clips) meets the
privacy budget at the lower end of its interval, and each seen task's utility retention reaches the utility
floor at the upper end of its interval (the gates' defaults: 0.5 and 0.9).
--seen fits one member per task set (the paper's task ablation: which tasks were seen in training). With --ridge
and --split val it also chooses the shrinkage (keep_ridge): the one whose single-task fits lose least on the
tasks they never saw (the worst AR / TAD retention), among those whose all-task fit passes the privacy rule.
Writes <store>/reports/keep_family.{json,png} (the curve and chosen point, --split val), keep_family_test.{json,png}
(--split test: no point is chosen there) or reports/keep_tasks_seen.json (--seen).
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from splavu_core.aam.keep import apply_keep  # noqa: E402
from splavu_core.aam.train import TrainConfig, fit_utility_keep, load_training_data  # noqa: E402
from splavu_core.evaluation.scoring import score_sets  # noqa: E402
from splavu_core.evaluation.suite import load_feature_sets  # noqa: E402
from splavu_core.ledger import privacy_threshold, utility_fraction  # noqa: E402
from splavu_core.roles import task_datasets  # noqa: E402
from splavu_core.store import FeatureStore  # noqa: E402

TASKS = ("privacy", "clip_privacy", "ar", "tad", "ad", "bias_f")
HEADLINE = {"privacy": "leakage_removed", "clip_privacy": "leakage_removed", "ar": "retention_top1",
            "tad": "retention_mAP", "ad": "retention_auc", "bias_f": "delta_gap"}


def summarise(rows, name: str) -> dict:
    """name's headline figures: {task: [value, ci_low, ci_high]} (leakage removed; utility retention; bias gap Δ)."""
    out = {}
    for r in rows:
        if r["feature_set"] == name and HEADLINE.get(r["task"]) == r["metric"]:
            out[r["task"]] = [round(r["value"], 4), round(r["ci_low"], 4), round(r["ci_high"], 4)]
    return out


def operating_point(members: list[dict], budget: float, floor: float) -> dict | None:
    """The largest k that passes both promotion gates' rules on these rows: the weaker leakage removal's lower end
    meets the privacy budget, and no seen task's retention has its upper end below the utility floor."""
    def passes(m):
        private = all(t in m and m[t][1] >= budget for t in ("privacy", "clip_privacy"))
        return private and all(m[t][2] >= floor for t in m["seen"] if t in m)
    ok = [m for m in members if passes(m)]
    return max(ok, key=lambda m: m["k"]) if ok else None


GENERALISATION_TASKS = ("ar", "tad")  # AD is left out: on validation its retention is a ratio of noise (README)


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
            r["private"] = all(t in m and m[t][1] >= budget for t in ("privacy", "clip_privacy"))
    scored = [r for r in by_ridge.values() if r["worst_unseen"] is not None]
    if not scored:
        return None
    eligible = [r for r in scored if r["private"]] or scored
    best = max(eligible, key=lambda r: r["worst_unseen"])
    return {**best, "by_ridge": sorted(by_ridge.values(), key=lambda r: r["ridge"]),
            "privacy_rule_met_by_any": any(r["private"] for r in scored)}


def plot(members: list[dict], chosen: dict | None, path: Path, marks: list[dict] = ()) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 3.6))
    for ax, task in zip(axes, ("ar", "tad")):
        pts = [m for m in members if task in m and "privacy" in m and "clip_privacy" in m]
        x = [min(m["privacy"][0], m["clip_privacy"][0]) for m in pts]
        y = [m[task][0] for m in pts]
        err = [[m[task][0] - m[task][1] for m in pts], [m[task][2] - m[task][0] for m in pts]]
        ax.errorbar(x, y, yerr=err, fmt="o-", label="keep family")
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
    fig.savefig(path, dpi=90, bbox_inches="tight")
    plt.close(fig)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--store", default="store")
    ap.add_argument("--k", type=int, nargs="+", default=[14])
    ap.add_argument("--split", choices=["val", "test"], default="val")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    ap.add_argument("--budget", type=float, default=privacy_threshold(), help="default: the privacy gate's")
    ap.add_argument("--floor", type=float, default=utility_fraction(), help="default: the utility gate's")
    ap.add_argument("--w-motion", type=float, help="keep_w_motion (default: TrainConfig's)")
    ap.add_argument("--w-dynamic", type=float, help="keep_w_dynamic (default: TrainConfig's)")
    ap.add_argument("--ridge", type=float, nargs="+", help="keep_ridge values (default: TrainConfig's)")
    ap.add_argument("--mark", nargs="*", default=[], help="published AAM versions to score beside the family")
    ap.add_argument("--variant", nargs="*", default=[],
                    help="ablation variants (pipeline/ablations.py) trained in memory and scored beside the family")
    ap.add_argument("--seen", nargs="*", default=[], help="task ablation: one member per task set (ar, ar,tad, ...)")
    args = ap.parse_args()
    fs = FeatureStore(args.store)
    cfg = TrainConfig(**{f"keep_{n}": v for n, v in (("w_motion", args.w_motion), ("w_dynamic", args.w_dynamic))
                         if v is not None})
    data = load_training_data(fs)
    ds = task_datasets(fs, {})
    which = [t for t in TASKS if t in ds]
    raw = load_feature_sets(fs, which, "raw", datasets=ds)
    t0 = time.perf_counter()
    members, sets = [], {"raw": raw}
    ridges = args.ridge or [cfg.keep_ridge]
    for ridge in ridges:
        for k in args.k:
            for seen in args.seen or [",".join(cfg.tasks)]:
                tasks = tuple(t for t in seen.split(",") if t)
                fit = fit_utility_keep(data, tasks, k, cfg.keep_w_motion, cfg.keep_w_app, cfg.keep_tad_phases,
                                       w_dynamic=cfg.keep_w_dynamic, ridge=ridge)
                name = f"keep k={k}" + (f" ridge {ridge:g}" if args.ridge else "") + (f" seen {seen}" if args.seen else "")
                sets[name] = {d: [dataclasses.replace(v, feats=apply_keep(fit, v.feats)) for v in vs]
                              for d, vs in raw.items()}
                members.append({"name": name, "k": k, "ridge": ridge, "seen": list(tasks)})
    marks = []
    for variant in args.variant:  # an ablation variant trained in memory (e.g. the paper's objective, the oracle)
        from pipeline.ablations import AblationConfig
        from splavu_core.aam.train import load_oracle_labels, train_aam
        from splavu_core.evaluation.suite import anonymize_videos

        vcfg = AblationConfig().variant_train_config(variant)
        vdata = load_oracle_labels(fs, data) if vcfg.oracle else data
        adapter, _, _ = train_aam(vdata, vcfg, log=None)
        sets[variant] = {d: anonymize_videos(adapter, vs) for d, vs in raw.items()}
        marks.append({"name": variant, "seen": list(vcfg.tasks)})
    for version in args.mark:  # published AAM versions (e.g. the previous default) on the same view
        name = f"AAM {version}"
        sets[name] = load_feature_sets(fs, which, "anonymized", version, datasets=ds)
        marks.append({"name": name, "seen": ["ar", "tad", "ad"]})
    rows = score_sets(sets, which, ds, split=args.split, seeds=args.seeds)
    for m in marks:
        m.update(summarise(rows, m["name"]))
        print(json.dumps(m), flush=True)
    for m in members:
        m.update(summarise(rows, m["name"]))
        print(json.dumps(m), flush=True)
    raw_rows = [{k: r[k] for k in ("task", "metric", "value", "ci_low", "ci_high", "chance")} for r in rows
                if r["feature_set"] == "raw"]
    out = {"split": args.split, "seeds": args.seeds, "budget": args.budget, "floor": args.floor, "members": members,
           "marks": marks, "raw": raw_rows,
           "keep_w_motion": cfg.keep_w_motion, "keep_w_dynamic": cfg.keep_w_dynamic, "seconds": round(time.perf_counter() - t0, 1)}
    (fs.root / "reports").mkdir(exist_ok=True)
    if args.seen:
        if args.split == "val":  # the shrinkage is chosen on validation only
            out["chosen_ridge"] = choose_ridge(members, args.budget)
            print(json.dumps({"chosen_ridge": out["chosen_ridge"]}), flush=True)
        stem = "keep_tasks_seen" if args.split == "test" else f"keep_tasks_seen_{args.split}"
        (fs.root / "reports" / f"{stem}.json").write_text(json.dumps(out, indent=1))
        return
    # the operating point is chosen on validation only; a test-split run is a report, written beside it
    chosen = operating_point(members, args.budget, args.floor) if args.split == "val" else None
    out["chosen_k"] = chosen and chosen["k"]
    stem = "keep_family" if args.split == "val" else f"keep_family_{args.split}"
    (fs.root / "reports" / f"{stem}.json").write_text(json.dumps(out, indent=1))
    plot(members, chosen, fs.root / "reports" / f"{stem}.png", marks)
    print(json.dumps({"chosen_k": out["chosen_k"], "budget": args.budget, "split": args.split,
                      "seconds": out["seconds"]}), flush=True)


if __name__ == "__main__":
    main()
