"""Does a store publish, by the publish rule? (prints JSON lines; evaluation/operating_point.py is the rule)

    python benchmarks/publish_rule.py --store store [--seeds 0 1 2 3] [--forget N] [--candidates default k14 ...]
        [--val all|pick] [--config JSON] [--probe-seeds 5]

Per run (a k-means seed of recentring, TrainConfig.seed: the randomness a fit has left; or, with --forget, one
training subject erased as `splavu forget --subject` erases it, at seed 0): every candidate of the family is fitted
from the store's cached latents (the adapter itself), scored on the SELECTION split, and the rule picks one; then the
pick (--val pick, the product's path) or every candidate (--val all, to see how selection predicts validation) is
scored on VALIDATION by the gates' scoring, and the gates' own verdict rules say whether the pick would publish:
every privacy part's lower end at the budget (ledger.budget_verdict's rule), no seen task's retention lost beyond the
noise (ledger.retention_state), none at chance. Nothing is written to the store. A last line counts the runs that
publish, with a 95% Clopper-Pearson interval on the rate.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

from splavu_core.aam.config import TrainConfig
from splavu_core.aam.training_data import load_training_data, without_subjects
from splavu_core.evaluation.operating_point import (
    CANDIDATES,
    PRIVACY_PARTS,
    Measured,
    family,
    measure_candidates,
    pick,
    pick_lazily,
    split_units,
)
from splavu_core.evaluation.suite import load_feature_sets
from splavu_core.ingest.datasets import task_datasets
from splavu_core.settings import settings
from splavu_core.store import costs
from splavu_core.store.feature_store import FeatureStore
from splavu_core.store.ledger import retention_state

TASKS = ("privacy", "clip_privacy", "reid", "ar", "tad", "ad")


def verdict(figures: dict, seen, budget: float, floor: float) -> dict:
    """The gates' verdict rules on one candidate's validation figures {task: [value, lo, hi]}."""
    privacy = all(figures.get(t) is not None and figures[t][1] >= budget for t in PRIVACY_PARTS
                  if t in figures or t == "privacy")
    lost = [t for t in seen if t in figures and retention_state(*figures[t], floor) == "lost"]
    return {"privacy_passes": privacy, "utility_refused": lost, "publishes": privacy and not lost}


def promise(figures: dict, seen, floor: float) -> dict:
    """What a published version promises, read on the TEST split: close-ups, clips and linkage removed at least 0.5
    (point), every seen task's retention at least the floor (point), none lost beyond the noise."""
    short = [t for t in PRIVACY_PARTS if t in figures and figures[t][0] < 0.5]
    low = [t for t in seen if t in figures and figures[t][0] < floor]
    lost = [t for t in seen if t in figures and retention_state(*figures[t], floor) == "lost"]
    return {"kept": not (short or low or lost), "privacy_below_half": short, "below_floor": low, "lost": lost}


def world_of(store: FeatureStore) -> dict | None:
    """The synthetic world a store's privacy set came from (its manifest folder's benchmark.json), when it has one."""
    from splavu_core.ingest.datasets import registered

    reg = registered(store).get(task_datasets(store, {}).get("privacy", ""))
    stamp = Path(reg["manifest"]).parent / "benchmark.json" if reg else None
    return json.loads(stamp.read_text()) if stamp and stamp.is_file() else None


def clopper_pearson(k: int, n: int) -> list[float]:
    """95% interval on a rate of k in n: scipy's exact (Clopper-Pearson) binomial interval."""
    from scipy.stats import binomtest

    ci = binomtest(k, n).proportion_ci(0.95, method="exact")
    return [round(float(ci.low), 3), round(float(ci.high), 3)]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--store", required=True)
    ap.add_argument("--seeds", type=int, nargs="*", default=[0, 1, 2, 3], help="k-means seeds (TrainConfig.seed)")
    ap.add_argument("--forget", type=int, default=0, help="erase N training subjects one at a time instead (seed 0)")
    ap.add_argument("--candidates", nargs="*", help="names of the family (default: all, with --extra's)")
    ap.add_argument("--val", choices=("all", "pick"), default="pick")
    ap.add_argument("--config", default="{}", help="TrainConfig fields as JSON applied before the candidates'")
    ap.add_argument("--probe-seeds", type=int, default=5)
    ap.add_argument("--parts", help="exploration: score only these parts, e.g. privacy,ar (the rule then sees only "
                                    "them)")
    ap.add_argument("--extra", default="{}", help="exploration: more candidates, JSON {name: {field: value}}")
    ap.add_argument("--test", action="store_true", help="also score the pick on the TEST split (what the report "
                                                        "would say of it) and whether it keeps its promise there")
    ap.add_argument("--record", help="append this run's lines and summary, with --label, to this JSON file (a list; "
                                     "docs/gen_reference.py renders docs/publish_rate.json into results.md)")
    ap.add_argument("--label", default="", help="what these runs are, e.g. 'world 0, k-means seeds 0-3'")
    args = ap.parse_args(argv)
    store = FeatureStore(args.store)
    data = load_training_data(store)
    datasets = task_datasets(store, {})
    which = [t for t in TASKS if t in datasets and (not args.parts or t in args.parts.split(","))]
    CANDIDATES.update(json.loads(args.extra))
    raw = load_feature_sets(store, which, "raw", datasets=datasets)
    budget, floor = settings().privacy_budget, settings().utility_gate
    base = TrainConfig.from_flat(json.loads(args.config))
    seen = [t for t in base.tasks if t in which]
    if args.forget:
        subjects = sorted({str(v.meta["subject_id"]) for v in data.ar_train + data.tad_train + data.ad_train
                           if v.meta.get("subject_id") is not None})
        runs = [("subject", str(s)) for s in np.random.default_rng(0).choice(subjects, args.forget, replace=False)]
    else:
        runs = [("seed", s) for s in args.seeds]
    seeds = range(args.probe_seeds)
    found = []
    for kind, what in runs:
        t = time.perf_counter()
        if kind == "subject":
            fit_data, fit_raw, cfg = *without_subjects(data, raw, {what}), base
        else:
            fit_data, fit_raw, cfg = data, raw, base.replace(seed=what)
        cands = family(cfg, args.candidates or list(CANDIDATES))
        val_units = split_units(fit_raw, datasets, which, "val")
        if args.val == "all":  # every part of every candidate on selection too, to see what the rule did not need
            sel = measure_candidates(cands, fit_data, fit_raw, datasets, which, seeds, store=store)
            choice = pick(sel["members"], seen, budget, floor, val_units)
        else:  # the product's path (operating_point.choose)
            measured = Measured(cands, fit_data, fit_raw, datasets, which, seeds, store=store)
            choice = pick_lazily(measured, seen, budget, floor, val_units)
            sel = measured.record()
        on_val = cands if args.val == "all" else [c for c in cands if c.name == choice["chosen"]]
        val = measure_candidates(on_val, fit_data, fit_raw, datasets, which, seeds, store=store, split="val")
        val_fig = {m["name"]: m["figures"] for m in val["members"]}
        line = {kind: what, "seconds": round(time.perf_counter() - t, 1), "chosen": choice["chosen"],
                "why": choice["why"],
                "candidates": {m["name"]: {"select": m["figures"], "z": m["assessment"]["z_min"],
                                           "val": val_fig.get(m["name"])} for m in sel["members"]},
                **verdict(val_fig[choice["chosen"]], seen, budget, floor)}
        if args.val == "all":
            line["would_publish"] = {n: verdict(f, seen, budget, floor)["publishes"] for n, f in val_fig.items()}
        if args.test:
            on_test = [c for c in cands if c.name == choice["chosen"]]
            line["test"] = measure_candidates(on_test, fit_data, fit_raw, datasets, which, seeds, store=store,
                                              split="test")["members"][0]["figures"]
            line["keeps_promise"] = promise(line["test"], seen, floor)
        line["seconds"] = round(time.perf_counter() - t, 1)
        found.append(line)
        print(json.dumps(line), flush=True)
        if args.record:  # after every run: a long measurement stopped early keeps the runs it finished
            save_record(Path(args.record), args, argv, store, found, summarize(found, args, budget, floor),
                        new=len(found) == 1)
    print(json.dumps(summarize(found, args, budget, floor)))


def summarize(found: list[dict], args, budget: float, floor: float) -> dict:
    """How many runs publish (with a 95% Clopper-Pearson interval), what the rule picked, and, with --test, how many
    published picks keep their promise on test."""
    k = sum(f["publishes"] for f in found)
    summary = {"summary": "publish rule", "runs": len(found), "publishing": k,
               "rate": round(k / len(found), 3) if found else None,
               "rate_ci95": clopper_pearson(k, len(found)) if found else None,
               "chosen": {c: sum(f["chosen"] == c for f in found) for c in args.candidates or CANDIDATES},
               "budget": budget, "floor": floor}
    if args.test:
        summary["published_keep_promise_on_test"] = sum(f["keeps_promise"]["kept"] for f in found if f["publishes"])
    return summary


def save_record(path: Path, args, argv, store: FeatureStore, found: list[dict], summary: dict, new: bool) -> None:
    """This invocation's record (--label, the runs so far, their summary) as the last entry of `path` (a JSON list;
    written whole, atomically): appended on the first run, replaced after. One invocation per file at a time."""
    records = json.loads(path.read_text()) if path.is_file() else []
    entry = {"label": args.label, "store": str(args.store), "world": world_of(store),
             "encoder": store.encoder_fingerprint(), "argv": list(argv or sys.argv[1:]), **costs.provenance(),
             "runs": found, "summary": summary}
    records = records + [entry] if new or not records else records[:-1] + [entry]
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(records, indent=1) + "\n")
    tmp.replace(path)

if __name__ == "__main__":
    main()
