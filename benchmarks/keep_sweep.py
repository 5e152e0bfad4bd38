"""The keep family's widths, its task ablation, its shrinkage and its variants, scored in memory (prints JSON); the
library is splavu_core/evaluation/keep_curve.py. Research, not the product: which configuration a store publishes
is the publish rule's choice (splavu_core/evaluation/operating_point.py, `splavu curve`).

    python benchmarks/keep_sweep.py --store store --k 8 11 14 17 20 24 [--mark VERSION] [--variant paper]
    python benchmarks/keep_sweep.py --store store --split test --seen ar tad ad ar,tad ar,ad tad,ad ar,tad,ad
    python benchmarks/keep_sweep.py --store store --seen ar tad ad ar,tad,ad --ridge 0.001 0.01 0.1 1  # shrinkage

--split select (the default) scores the selection videos: never the validation videos the gates read (choosing
there would spend the gates' confidence), never the report's test split unless asked. Each run is written to
<store>/reports/keep_family_<split>*.{json,png} (keep_tasks_seen* for --seen); with --seen on the selection split
it also chooses the shrinkage (keep_curve.choose_ridge).
"""
from __future__ import annotations

import argparse
import json
import time

from splavu_core.aam.config import TrainConfig
from splavu_core.evaluation.keep_curve import (
    choose_ridge,
    family_sets,
    heldout_classes,
    load_inputs,
    plot_png,
    score_family,
)
from splavu_core.store.feature_store import FeatureStore
from splavu_core.store.ledger import privacy_threshold, utility_fraction


def variant_sets(store, data, raw, variants) -> tuple[dict, list[dict]]:
    """Ablation variants (pipeline/ablations.py) trained in memory, e.g. the paper's objective or the oracle."""
    from pipeline.ablations import AblationConfig
    from splavu_core.aam.train import train_aam
    from splavu_core.aam.training_data import load_oracle_labels
    from splavu_core.evaluation.suite import anonymize_videos

    sets, marks = {}, []
    for variant in variants:
        vcfg = AblationConfig().variant_train_config(variant)
        vdata = load_oracle_labels(store, data) if vcfg.loop.oracle else data
        adapter, _, _ = train_aam(vdata, vcfg, log=None)
        sets[variant] = {d: anonymize_videos(adapter, vs) for d, vs in raw.items()}
        marks.append({"name": variant, "seen": list(vcfg.tasks)})
    return sets, marks


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--store", default="store")
    ap.add_argument("--k", type=int, nargs="+", default=[14])
    ap.add_argument("--split", choices=["select", "val", "test"], default="select")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    ap.add_argument("--budget", type=float, default=privacy_threshold(), help="default: the privacy gate's")
    ap.add_argument("--floor", type=float, default=utility_fraction(), help="default: the utility gate's")
    ap.add_argument("--w-motion", type=float, help="keep_w_motion (default: TrainConfig's)")
    ap.add_argument("--w-dynamic", type=float, help="keep_w_dynamic (default: TrainConfig's)")
    ap.add_argument("--w-app", type=float, help="keep_w_app: static clips' between-video scatter avoided (label-free)")
    ap.add_argument("--ridge", type=float, nargs="+", help="keep_ridge values (default: TrainConfig's)")
    ap.add_argument("--mark", nargs="*", default=[], help="published AAM versions to score beside the family")
    ap.add_argument("--variant", nargs="*", default=[],
                    help="ablation variants (pipeline/ablations.py) trained in memory and scored beside the family")
    ap.add_argument("--seen", nargs="*", default=[], help="task ablation: one member per task set (ar, ar,tad, ...)")
    ap.add_argument("--heldout-classes", type=int, default=0, metavar="FOLDS",
                    help="new action classes: per fold the fit sees AR without a third (say) of the classes, AR is "
                         "probed on those classes only (keep_curve.heldout_classes)")
    ap.add_argument("--recentre", nargs="*", choices=["on", "off"], default=[],
                    help="members with and/or without recentring (default: as the default adapter)")
    args = ap.parse_args()
    store = FeatureStore(args.store)
    cfg = TrainConfig(**{f"keep_{n}": v for n, v in (("w_motion", args.w_motion), ("w_dynamic", args.w_dynamic),
                                                             ("w_app", args.w_app))
                         if v is not None})
    inp = load_inputs(store, cfg)
    recentres = [r == "on" for r in args.recentre] or None
    t0 = time.perf_counter()
    if args.heldout_classes:
        members = heldout_classes(store, inp, args.k, args.heldout_classes, args.seeds, recentres, args.split)
        for m in members:
            print(json.dumps(m), flush=True)
        out = {"split": args.split, "seeds": args.seeds, "folds": args.heldout_classes, "members": members,
               "seconds": round(time.perf_counter() - t0, 1)}
        (store.root / "reports").mkdir(exist_ok=True)
        (store.root / "reports" / f"keep_heldout_classes_{args.split}.json").write_text(json.dumps(out, indent=1))
        print(json.dumps({"seconds": out["seconds"]}), flush=True)
        return
    vsets, marks = variant_sets(store, inp.data, inp.raw, args.variant)
    sets, members = family_sets(inp, args.k, ridges=args.ridge, seens=args.seen, recentres=recentres)
    raw_rows = score_family(store, inp, {**sets, **vsets}, members, marks, args.mark, args.split, args.seeds)
    for m in marks + members:
        print(json.dumps(m), flush=True)
    out = {"split": args.split, "seeds": args.seeds, "budget": args.budget, "floor": args.floor, "members": members,
           "marks": marks, "raw": raw_rows, "keep_w_motion": cfg.keep_w_motion, "keep_w_dynamic": cfg.keep_w_dynamic,
           "keep_w_app": cfg.keep_w_app,
           "seconds": round(time.perf_counter() - t0, 1)}
    (store.root / "reports").mkdir(exist_ok=True)
    if args.seen:
        if args.split == "select":  # the shrinkage is chosen on the selection split only
            out["chosen_ridge"] = choose_ridge(members, args.budget)
            print(json.dumps({"chosen_ridge": out["chosen_ridge"]}), flush=True)
        stem = "keep_tasks_seen" if args.split == "test" else f"keep_tasks_seen_{args.split}"
        (store.root / "reports" / f"{stem}.json").write_text(json.dumps(out, indent=1))
        return
    stem = f"keep_family_{args.split}" + ("_ridges" if args.ridge else "")
    (store.root / "reports" / f"{stem}.json").write_text(json.dumps(out, indent=1))
    (store.root / "reports" / f"{stem}.png").write_bytes(plot_png(members, None, marks))
    print(json.dumps({"split": args.split, "seconds": out["seconds"]}), flush=True)


if __name__ == "__main__":
    main()
