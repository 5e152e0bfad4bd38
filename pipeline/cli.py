"""`splavu`: the project's command line.

    splavu synth --scale demo --seed 0 --out data/synth     write the synthetic benchmark
    splavu ingest NAME MANIFEST [--shard-size N]            register a dataset, add its shards
    splavu extract [--dataset NAME ...]                     materialise latents of every shard
    splavu demo                                             all of the above on the embedded default
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

from splavu_core.manifest import ManifestError
from splavu_core.store import StoreError


def _store_root(args) -> str:
    return args.store or os.environ.get("SPLAVU_STORE", "./store")


def cmd_synth(args) -> int:
    from tqdm import tqdm

    from splavu_core.synth.datasets import DATASETS, generate, plan

    names = args.datasets or list(DATASETS)
    total = sum(len(plan(args.scale, args.seed)[n]) for n in names)
    t0 = time.perf_counter()
    with tqdm(total=total, desc="rendering + encoding", unit="video", disable=args.quiet) as bar:
        summary = generate(args.out, args.scale, args.seed, workers=args.workers, datasets=names,
                           progress=lambda _: bar.update())
    print(f"synthetic benchmark ({args.scale}, seed {args.seed}) in {args.out}  [{time.perf_counter() - t0:.0f} s]")
    print(f"{'dataset':10s} {'videos':>7s} {'clips':>7s} {'frames':>8s}  splits")
    for name, s in summary.items():
        print(f"{name:10s} {s['videos']:7d} {s['clips']:7d} {s['frames']:8d}  {json.dumps(s['splits'])}")
    return 0


def cmd_ingest(args) -> int:
    from pipeline.resources import StoreResource
    from pipeline.runner import ingest, instance

    keys = ingest(instance(), StoreResource(root=_store_root(args)), args.name, args.manifest, args.shard_size)
    print(f"{args.name}: {len(keys)} shard(s): {' '.join(keys)}")
    return 0


def _extract(store, encoder, keys, quiet=False) -> list[dict]:
    from pipeline.runner import instance, materialize_shard

    inst, rows = instance(), []
    for k in keys:
        res = materialize_shard(inst, k, store, encoder)
        md = {m.asset_key.to_user_string(): m.metadata for m in res.asset_materializations_for_node("extracted_latents")}
        clip = md["clip_latents"]
        row = {"shard": k, "videos": clip["videos"].value, "clips": clip["clips"].value,
               "quarantined": clip["quarantined"].value, "clips_per_s": clip["clips_per_s"].value,
               "skipped": clip["skipped"].value}
        rows.append(row)
        if not quiet:
            speed = "(already extracted)" if row["skipped"] else f"{row['clips_per_s']:.0f} clips/s"
            print(f"  {k:14s} videos {row['videos']:5d}  clips {row['clips']:6d}  quarantined {row['quarantined']:3d}"
                  f"  {speed}", flush=True)
    return rows


def cmd_extract(args) -> int:
    from pipeline.resources import EncoderResource, StoreResource
    from splavu_core.registry import registered

    store = StoreResource(root=_store_root(args))
    regs = registered(store.store())
    names = args.dataset or list(regs)
    missing = [n for n in names if n not in regs]
    if missing:
        raise StoreError(f"not registered in {store.root}: {missing} (known: {list(regs)})")
    keys = [k for n in names for k in regs[n]["shards"]]
    _extract(store, EncoderResource(checkpoint=args.checkpoint or EncoderResource().checkpoint), keys)
    return 0


def cmd_demo(args) -> int:
    from pipeline.resources import EncoderResource, StoreResource
    from pipeline.runner import ingest, instance
    from splavu_core.synth.datasets import DATASETS

    data = Path(args.data)
    t0 = time.perf_counter()
    if not (data / "gait" / "manifest.csv").is_file() or args.regenerate:
        cmd_synth(argparse.Namespace(out=str(data), scale=args.scale, seed=args.seed, workers=None,
                                     datasets=None, quiet=False))
    store = StoreResource(root=_store_root(args))
    inst = instance()
    keys = []
    for name in DATASETS:
        keys += ingest(inst, store, name, str(data / name / "manifest.csv"), args.shard_size)
    print(f"\nextracting latents of {len(keys)} shards into {store.root} (encoder: shipped demo VideoMAE)")
    rows = _extract(store, EncoderResource(), keys)
    n_clips = sum(r["clips"] for r in rows)
    print(f"\n{n_clips} clip latents, {sum(r['quarantined'] for r in rows)} quarantined, "
          f"{time.perf_counter() - t0:.0f} s in all")
    return 0


def _catalog_store(args):
    from splavu_core.catalog import CatalogError, catalog_path
    from splavu_core.store import FeatureStore

    store = FeatureStore(_store_root(args))
    if not catalog_path(store).is_file():
        raise CatalogError(f"no catalog at {catalog_path(store)}: run feature_catalog first "
                           f"(dagster asset materialize -m pipeline.definitions --select feature_catalog)")
    return store


def cmd_sql(args) -> int:
    from splavu_core.catalog import format_table, query

    store = _catalog_store(args)
    out = format_table(query(store, args.query, read_only=True), args.format)
    print(out, end="" if out.endswith("\n") else "\n")
    return 0


def cmd_neighbors(args) -> int:
    from splavu_core.catalog import format_table, neighbors

    if args.k < 1:
        raise StoreError(f"--k must be >= 1, got {args.k}")
    store = _catalog_store(args)
    out = format_table(neighbors(store, args.video_id, k=args.k, reduce=args.reduce, dataset=args.dataset), args.format)
    print(out, end="" if out.endswith("\n") else "\n")
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="splavu", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--store", help="store root (default $SPLAVU_STORE or ./store)")
    sub = ap.add_subparsers(dest="cmd", required=True)

    p = sub.add_parser("synth", help="generate the synthetic benchmark")
    p.add_argument("--scale", default="demo", choices=["tiny", "demo", "large"])
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", required=True)
    p.add_argument("--workers", type=int)
    p.add_argument("--datasets", nargs="*")
    p.add_argument("--quiet", action="store_true")
    p.set_defaults(fn=cmd_synth)

    p = sub.add_parser("ingest", help="register a dataset (folder + manifest) and its shards")
    p.add_argument("name")
    p.add_argument("manifest")
    p.add_argument("--shard-size", type=int, default=256)
    p.set_defaults(fn=cmd_ingest)

    p = sub.add_parser("extract", help="extract raw latents of registered datasets")
    p.add_argument("--dataset", nargs="*")
    p.add_argument("--checkpoint", help="VideoMAE / V-JEPA 2 directory or hub id (default: the demo encoder)")
    p.set_defaults(fn=cmd_extract)

    p = sub.add_parser("demo", help="run the pipeline on the embedded synthetic benchmark")
    p.add_argument("--data", default="data/synth")
    p.add_argument("--scale", default="demo", choices=["tiny", "demo", "large"])
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--shard-size", type=int, default=256)
    p.add_argument("--regenerate", action="store_true")
    p.set_defaults(fn=cmd_demo)

    p = sub.add_parser("sql", help="run a read-only SQL query on the catalog (catalog.duckdb)")
    p.add_argument("query", help='e.g. "SELECT split, count(*) FROM clips GROUP BY split"')
    p.add_argument("--format", default="table", choices=["table", "csv", "json"])
    p.set_defaults(fn=cmd_sql)

    p = sub.add_parser("neighbors", help="nearest clips to a video in the current anonymized table")
    p.add_argument("video_id")
    p.add_argument("--k", type=int, default=10)
    p.add_argument("--dataset", help="the video's dataset, when its id occurs in several")
    p.add_argument("--reduce", default="mean", choices=["mean", "first"], help="query with the mean or the first clip")
    p.add_argument("--format", default="table", choices=["table", "csv", "json"])
    p.set_defaults(fn=cmd_neighbors)

    args = ap.parse_args(argv)
    try:
        return args.fn(args)
    except (ManifestError, StoreError) as e:
        print(f"splavu: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
