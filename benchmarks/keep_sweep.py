"""The keep family's privacy–utility curve and its operating point, on validation splits (prints JSON lines).

    python benchmarks/keep_sweep.py --store store --k 8 14 24 32 --seeds 0 1 [--mark VERSION ...] [--split val]
    python benchmarks/keep_sweep.py --store store --k 14 --split test --seeds 0 1 2 --seen ar tad ad ar,tad ar,ad tad,ad ar,tad,ad

Each k is fitted exactly as `aam_model` fits the keep stage (TrainConfig's keep_* defaults, utility labels only),
the store's evaluation sets are projected in memory and scored with the evaluation suite's probes (fresh
attackers, the stronger of raw and standardised; AR/TAD/AD heads) for every probe seed. Every figure is the
mean and sd over seeds of the paired difference with raw under the same seed.

--split val (default) scores on validation, never on the test split the report uses: a dataset's `val`
videos where it has them (ar, tad), else a quarter of its train videos (by a hash of the video id; the
probes then train on the other three quarters). The operating point is the largest k whose weaker leakage
removal (close-ups, action clips), less one sd, meets --budget; utility is reported beside it. --mark scores a
published AAM version on the same view (e.g. the previous default) for the curve.
Writes <store>/reports/keep_family.{json,png}.
"""
from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from splavu_core.aam.train import TrainConfig, fit_utility_keep, load_training_data  # noqa: E402
from splavu_core.aam.keep import apply_keep  # noqa: E402
from splavu_core.evaluation.suite import evaluate_feature_set, load_feature_sets, metric_value  # noqa: E402
from splavu_core.store import FeatureStore  # noqa: E402

KEYS = {"privacy": "cmap", "clip_privacy": "cmap", "ar": "top1", "tad": "mAP", "ad": "auc", "bias_f": "gap"}
UTILITY = ("ar", "tad", "ad")


def _carved(video_id: str) -> bool:
    return int(hashlib.sha256(video_id.encode()).hexdigest(), 16) % 4 == 0


def validation_view(videos: list) -> list:
    """Train -> val as the probes' train -> test; the real test split is dropped."""
    if any(v.split == "val" for v in videos):
        pick = {"train": "train", "val": "test"}
        return [dataclasses.replace(v, split=pick[v.split]) for v in videos if v.split in pick]
    return [dataclasses.replace(v, split="test" if _carved(v.video_id) else "train") for v in videos if v.split == "train"]


def scores(sets, tasks, seed) -> dict:
    kw = {t: {"seed": seed} for t in ("ar", "tad", "ad", "privacy", "bias")}
    rows = evaluate_feature_set(sets, "x", None, which=tasks, probe_kwargs=kw)
    out = {t: metric_value(rows, t, m) for t, m in KEYS.items() if t in tasks}
    for t in ("privacy", "clip_privacy"):
        if t in tasks:
            out[f"{t}_chance"] = metric_value(rows, t, "chance_cmap")
    return out


def _ms(a) -> list:
    a = np.asarray(a, float)
    return [round(float(a.mean()), 4), round(float(a.std(ddof=1)) if len(a) > 1 else 0.0, 4)]


def summarise(raw: list[dict], new: list[dict]) -> dict:
    """Per key: [mean, sd] over seeds of the value, and of the paired removal (privacy) or relative change."""
    out = {}
    for key in raw[0]:
        if key.endswith("_chance") or raw[0][key] is None:
            continue
        r, n = np.array([s[key] for s in raw], float), np.array([s[key] for s in new], float)
        out[key] = _ms(n)
        if key in ("privacy", "clip_privacy"):
            chance = np.array([s[f"{key}_chance"] for s in raw], float)
            out[f"{key}_removed"] = _ms((r - n) / (r - chance))
        else:
            out[f"{key}_rel"] = _ms((n - r) / r)
    return out


def operating_point(rows: list[dict], budget: float) -> dict | None:
    """The largest k whose weaker removal minus its sd meets the budget."""
    ok = [r for r in rows if min(r[f"{t}_removed"][0] - r[f"{t}_removed"][1]
                                 for t in ("privacy", "clip_privacy")) >= budget]
    return max(ok, key=lambda r: r["k"]) if ok else None


def plot(rows: list[dict], marks: list[dict], chosen: dict | None, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 3.6))
    for ax, task in zip(axes, ("ar", "tad")):
        def pts(rs):
            return ([min(r["privacy_removed"][0], r["clip_privacy_removed"][0]) for r in rs],
                    [r[f"{task}_rel"][0] for r in rs], [r[f"{task}_rel"][1] for r in rs])
        x, y, e = pts(rows)
        ax.errorbar(x, y, yerr=e, fmt="o-", label="keep family (k)")
        for r, xi, yi in zip(rows, x, y):
            ax.annotate(f"k={r['k']}", (xi, yi), textcoords="offset points", xytext=(4, 4), fontsize=7)
        if chosen:
            cx, cy, _ = pts([chosen])
            ax.plot(cx, cy, "*", ms=14, color="tab:red", label=f"chosen k={chosen['k']}")
        for m in marks:
            mx, my, me = pts([m])
            ax.errorbar(mx, my, yerr=me, fmt="s", label=m["name"])
        ax.axhline(0, color="grey", lw=0.8)
        ax.set_xlabel("weaker leakage removed (close-ups, action clips), validation")
        ax.set_ylabel(f"{task} change vs raw (validation)")
        ax.set_title(task.upper())
    axes[1].legend(fontsize=7, loc="center left", bbox_to_anchor=(1.02, 0.5))
    fig.tight_layout()
    fig.savefig(path, dpi=90, bbox_inches="tight")
    plt.close(fig)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--store", default="store")
    ap.add_argument("--k", type=int, nargs="+", default=[8, 14, 24, 32])
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    ap.add_argument("--split", choices=["val", "test"], default="val")
    ap.add_argument("--budget", type=float, default=0.6)
    ap.add_argument("--mark", nargs="*", default=[], help="published AAM versions to score on the same view")
    ap.add_argument("--tasks", nargs="+", default=list(KEYS))
    ap.add_argument("--seen", nargs="*", default=[],
                    help="task ablation: fit on each of these task sets (e.g. ar tad ar,tad) instead of all, at each k; "
                         "writes reports/keep_tasks_seen.json")
    args = ap.parse_args()
    fs = FeatureStore(args.store)
    data = load_training_data(fs)
    cfg = TrainConfig()
    view = validation_view if args.split == "val" else (lambda vs: vs)
    sets = {d: view(vs) for d, vs in load_feature_sets(fs, args.tasks, "raw").items()}
    t0 = time.perf_counter()
    raw = [scores(sets, args.tasks, s) for s in args.seeds]
    print(json.dumps({"name": "raw", **summarise(raw, raw), "seconds": round(time.perf_counter() - t0, 1)}), flush=True)
    rows = []
    for k in args.k:
        for seen in args.seen or [",".join(cfg.tasks)]:
            t0 = time.perf_counter()
            tasks = tuple(t for t in seen.split(",") if t)
            fit = fit_utility_keep(data, tasks, k, cfg.keep_w_motion, cfg.keep_w_app, cfg.keep_tad_phases)
            kept = {d: [dataclasses.replace(v, feats=apply_keep(fit, v.feats)) for v in vs] for d, vs in sets.items()}
            rows.append({"name": f"keep k={k}" + (f" seen {seen}" if args.seen else ""), "k": k, "seen": list(tasks),
                         **summarise(raw, [scores(kept, args.tasks, s) for s in args.seeds]),
                         "seconds": round(time.perf_counter() - t0, 1)})
            print(json.dumps(rows[-1]), flush=True)
    if args.seen:  # the task ablation: no operating point, its own file
        (fs.root / "reports").mkdir(exist_ok=True)
        (fs.root / "reports" / "keep_tasks_seen.json").write_text(json.dumps(
            {"split": args.split, "seeds": args.seeds, "rows": rows}, indent=1))
        return
    marks = []
    for version in args.mark:
        anon = {d: view(vs) for d, vs in load_feature_sets(fs, args.tasks, "anonymized", version).items()}
        marks.append({"name": f"AAM {version}", **summarise(raw, [scores(anon, args.tasks, s) for s in args.seeds])})
        print(json.dumps(marks[-1]), flush=True)
    chosen = operating_point(rows, args.budget)
    out = {"split": args.split, "seeds": args.seeds, "budget": args.budget, "rows": rows, "marks": marks,
           "chosen_k": chosen and chosen["k"], "train_config": {k: v for k, v in dataclasses.asdict(cfg).items()
                                                               if k.startswith("keep_") or k == "tasks"}}
    (fs.root / "reports").mkdir(exist_ok=True)
    (fs.root / "reports" / "keep_family.json").write_text(json.dumps(out, indent=1))
    plot(rows, marks, chosen, fs.root / "reports" / "keep_family.png")
    print(json.dumps({"chosen_k": out["chosen_k"], "budget": args.budget, "split": args.split}), flush=True)


if __name__ == "__main__":
    main()
