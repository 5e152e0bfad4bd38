"""`splavu`: the project's command line.

    splavu synth --scale demo --seed 0 --out data/synth     write the synthetic benchmark
    splavu ingest NAME MANIFEST [--roles ar,privacy]        register a dataset and the tasks it serves
    splavu extract [--dataset NAME ...]                     materialise latents of every shard
    splavu train [--tasks ar,tad] [--config JSON]           train an AAM from cached latents
    splavu publish [--version V]                            anonymized tables + DuckDB catalog
    splavu evaluate [--version V] [--seed N]                privacy-utility report (raw vs anonymized), with intervals
    splavu promote VERSION [--force --reason TEXT]          make a version current (gated) / splavu rollback
    splavu ablations                                        the paper's ablations on the same latents
    splavu baselines [--masks rendered|hog]                 pixel-space baselines, scored beside splavu
    splavu sql "SELECT ..."  /  splavu neighbors VIDEO_ID   analysts: query the catalog read-only
    splavu fail-run RUN_ID                                  free the pool slots of a run whose process is gone
    splavu demo                                             all of the above on the embedded default
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import shutil
import sys
import time
from pathlib import Path

from splavu_core.manifest import ManifestError
from splavu_core.masks import PixelError
from splavu_core.store import StoreError
from pipeline.inprocess import quiet


def _store_root(args) -> str:
    return args.store or os.environ.get("SPLAVU_STORE", "./store")


def cmd_synth(args) -> int:
    from tqdm import tqdm

    from splavu_core.synth.datasets import DATASETS, generate, plan

    names = args.datasets or list(DATASETS)
    total = sum(len(plan(args.scale, args.seed, args.benchmark)[n]) for n in names)
    t0 = time.perf_counter()
    with tqdm(total=total, desc="rendering + encoding", unit="video", disable=args.quiet) as bar:
        summary = generate(args.out, args.scale, args.seed, workers=args.workers, datasets=names,
                           progress=lambda _: bar.update(), benchmark=args.benchmark)
    print(f"synthetic benchmark {args.benchmark} ({args.scale}, seed {args.seed}) in {args.out}  "
          f"[{time.perf_counter() - t0:.0f} s]")
    print(f"{'dataset':10s} {'videos':>7s} {'clips':>7s} {'frames':>8s}  splits")
    for name, s in summary.items():
        print(f"{name:10s} {s['videos']:7d} {s['clips']:7d} {s['frames']:8d}  {json.dumps(s['splits'])}")
    return 0


def cmd_ingest(args) -> int:
    from pipeline.resources import StoreResource
    from pipeline.runner import ingest, instance

    from splavu_core.registry import registration
    from splavu_core.roles import describe_registration

    store = StoreResource(root=_store_root(args))
    keys = ingest(instance(), store, args.name, args.manifest, args.shard_size, roles=args.roles)
    print(f"{args.name}: {len(keys)} shard(s): {' '.join(keys)}")
    print(f"  {describe_registration(registration(store.store(), args.name))}")
    return 0


def _extract(store, encoder, keys, quiet=False) -> list[dict]:
    from pipeline.runner import instance, materialize_shard

    inst, rows = instance(), []
    for k in keys:
        res = materialize_shard(inst, k, store, encoder)
        md = {m.asset_key.to_user_string(): m.metadata for m in res.asset_materializations_for_node("extracted_latents")}
        clip = md["clip_latents"]
        static = md["static_latents"]["static_clips"].value if "static_clips" in md["static_latents"] else 0
        row = {"shard": k, "videos": clip["videos"].value, "clips": clip["clips"].value, "static_clips": static,
               "quarantined": clip["quarantined"].value, "clips_per_s": clip["clips_per_s"].value,
               "skipped": clip["skipped"].value}
        rows.append(row)
        if not quiet:  # clips/s counts every clip encoded, static ones included
            speed = "(already extracted)" if row["skipped"] else f"{row['clips_per_s']:.0f} clips/s"
            print(f"  {k:14s} videos {row['videos']:5d}  clips {row['clips']:6d} + static {static:5d}  "
                  f"quarantined {row['quarantined']:3d}  {speed}", flush=True)
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


DEMO_AAM: dict = {}  # AAMTrainingConfig defaults (README: how they were chosen)


def _train_aam(store, config: dict) -> str:
    import dagster as dg

    from assets.aam import aam_model
    from pipeline.runner import instance

    res = dg.materialize([aam_model], instance=instance(), resources={"store": store},
                         run_config=quiet({"ops": {"aam_model": {"config": config}}}), tags={"splavu/entry": "cli"})
    md = res.asset_materializations_for_node("aam_model")[0].metadata
    print(f"  AAM {md['version'].value}: {md['parameters'].value} parameters, selected epoch "
          f"{md['selected_epoch'].value}, {md['train_seconds'].value:.0f} s (encoder never loaded)")
    if "pair_matching" in md:
        pm = md["pair_matching"].value
        print(f"  what a fresh critic still matches on held-out videos (chance {pm['raw']['chance']:.3f}): "
              + ", ".join(f"{k.replace('_', '↔')} {pm['raw'][k]:.3f} → {pm['selected'][k]:.3f}"
                          for k in pm["raw"] if k != "chance"))
    return md["version"].value


def cmd_train(args) -> int:
    from pipeline.resources import StoreResource
    from splavu_core.roles import parse_roles

    try:
        cfg = json.loads(args.config) if args.config else {}
    except json.JSONDecodeError as e:
        raise StoreError(f"--config is not JSON ({e}): e.g. '{{\"epochs\": 30}}'") from e
    if args.tasks is not None:
        cfg["tasks"] = list(parse_roles(args.tasks))
    store = StoreResource(root=_store_root(args))
    print(_training_preflight(store.store(), cfg), flush=True)
    _train_aam(store, cfg)
    return 0


def _training_preflight(fs, cfg: dict) -> str:
    """What training will use, checked before a Dagster run starts (so a missing task is one line, not a
    failed run): the one-line plan, or RoleError / StoreError saying what to do."""
    from splavu_core.registry import registration
    from splavu_core.roles import training_plan

    plan = training_plan(fs, cfg.get("tasks"), {t: cfg.get(f"{t}_dataset", "") for t in ("ar", "tad", "ad")},
                         cfg.get("selection", ""))
    shards = {s for d in plan.datasets.values() if d for s in registration(fs, d)["shards"]}
    missing = sorted(s for s in shards if fs.committed(s) is None)
    if missing:
        raise StoreError(f"no latents yet for shard(s) {missing}: run `splavu extract` first")
    return plan.summary()


def cmd_publish(args) -> int:
    from pipeline.reanonymize import run_reanonymize
    from pipeline.resources import StoreResource
    from pipeline.runner import instance

    out = run_reanonymize(instance(), StoreResource(root=_store_root(args)), version=args.version or "")
    rows = sum(v["rows"] for v in out["shards"].values())
    last = list(out["shards"].values())[-1]
    print(f"  published {rows} anonymized clips of {len(out['shards'])} shards with AAM {out['version']}; "
          f"current version: {last['current_version'] or 'none'} ({last['promotion']})")
    for line in gate_lines(_ledger_store(args), out["version"]):
        print(f"  {line}")
    return 0


def _ledger_store(args):
    from splavu_core.store import FeatureStore

    return FeatureStore(_store_root(args))


def gate_lines(store, version: str) -> list[str]:
    """Both gates' recorded verdicts on `version` (validation splits), one line each."""
    from splavu_core.ledger import read_verdicts

    v = read_verdicts(store, version)
    out = []
    for gate, label in (("privacy", "privacy budget"), ("utility", "utility")):
        if gate not in v:
            out.append(f"gate {label}: not run on {version}")
        else:
            out.append(f"gate {label}: {'PASSED' if v[gate]['passed'] else 'FAILED'} on validation: {v[gate]['why']}")
    return out


def cmd_promote(args) -> int:
    from splavu_core.ledger import PublishError, gates_passed, promote, read_verdicts

    store = _ledger_store(args)
    if args.force and not (args.reason or "").strip():
        raise PublishError("--force needs --reason TEXT (kept in the version ledger)")
    if not read_verdicts(store, args.version):  # never gated (e.g. trained but not published): measure now
        from splavu_core.gates import evaluate_gates

        evaluate_gates(store, args.version)
    ok, why = gates_passed(store, args.version)
    prev = promote(store, args.version, force=args.force, reason=args.reason or "")
    how = "passed both gates" if ok else f"FORCED past the gates ({why}); reason: {args.reason}"
    print(f"AAM version {args.version} is now current (was {prev or 'none'}): {how}")
    _rebuild_catalog(store)
    return 0


def cmd_rollback(args) -> int:
    from splavu_core.ledger import rollback

    store = _ledger_store(args)
    was, now = rollback(store, reason=args.reason or "")
    print(f"rolled back: AAM version {now} is current again (was {was})")
    _rebuild_catalog(store)
    return 0


def _rebuild_catalog(store) -> None:
    from splavu_core.catalog import build_catalog

    try:
        build_catalog(store)  # the analysts' anonymized_features view follows the current version
    except Exception as e:  # the ledger changed; say that the catalog did not follow
        print(f"note: the catalog was not rebuilt ({e}); run `splavu publish`", file=sys.stderr)


def cmd_evaluate(args) -> int:
    from assets.evaluation import run_evaluation
    from pipeline.runner import instance

    from splavu_core.catalog import build_catalog
    from splavu_core.ledger import current_version, read_versions
    from splavu_core.store import FeatureStore

    root = _store_root(args)
    store = FeatureStore(root)
    current = current_version(store)
    version = getattr(args, "version", None) or current
    if not version:
        known = read_versions(store)["version"].to_pylist()
        if not known:
            raise StoreError(f"no AAM version in {root}: run `splavu train` and `splavu publish` first")
        raise StoreError(f"no AAM version is current in {root} (every recorded one was refused or is not published "
                         f"everywhere): score one explicitly with --version {known[-1]}")
    state = "the current version" if version == current else \
        f"NOT current (current: {current or 'none'}){'; ' + _refusal(store, version) if _refusal(store, version) else ''}"
    seed = getattr(args, "seed", 0) or 0
    print(f"scoring AAM version {version}: {state}; probe seeds {seed}..{seed + 4}", flush=True)
    res = run_evaluation(root, config={"aam_version": version, "seed": seed}, instance=instance())
    build_catalog(store)  # the metrics view now has files to read
    print(store.fs.read_text("reports/privacy_utility.md"))
    print(f"scored AAM version {version} ({state})")
    for line in evaluation_notes(res):
        print(line)
    return 0


def _refusal(store, version: str) -> str:
    from splavu_core.ledger import refused_versions

    r = refused_versions(store).get(version)
    return f"refused: {r['why']}" if r else ""


def evaluation_notes(res) -> list[str]:
    """Tasks skipped (and why) and failed checks (e.g. utility_retention) of an evaluation run: they are in the
    event log, and the terminal must say them too."""
    skipped = {}
    for mat in res.get_asset_materialization_events():
        md = mat.step_materialization_data.materialization.metadata
        if "skipped" in md:
            skipped.update(md["skipped"].value)
    out = [f"skipped {task}: {why}" for task, why in sorted(skipped.items())]
    for ev in res.get_asset_check_evaluations():
        if not ev.passed:
            level = "warning" if ev.severity.value == "WARN" else "error"
            out.append(f"{level}: check {ev.check_name} failed: {ev.description}")
    return out


def cmd_ablations(args) -> int:
    from pipeline.ablations import run_ablations
    from pipeline.runner import instance
    from splavu_core.store import FeatureStore

    root = _store_root(args)
    run_ablations(root, variants=args.variants, epochs=args.epochs, instance=instance())
    print(FeatureStore(root).fs.read_text("reports/ablations.md"))
    return 0


def cmd_baselines(args) -> int:
    from pipeline.resources import EncoderResource, StoreResource
    from pipeline.runner import instance, run_baselines
    from splavu_core.pixel import BASELINES

    root = _store_root(args)
    names = args.only or list(BASELINES)
    print(f"pixel baselines {names} (person masks: {args.masks}): re-decoding and re-encoding the evaluation videos")
    t0 = time.perf_counter()
    run_baselines(instance(), StoreResource(root=root), EncoderResource(checkpoint=args.checkpoint or EncoderResource().checkpoint),
                  names, mask_source=args.masks, datasets=args.dataset or ())
    print(f"extracted in {time.perf_counter() - t0:.0f} s; scoring every feature set")
    return 0 if args.no_evaluate else cmd_evaluate(args)


def cmd_demo(args) -> int:
    from pipeline.resources import EncoderResource, StoreResource
    from pipeline.runner import ingest, instance
    from splavu_core.catalog import format_table, query
    from splavu_core.synth.datasets import DATASETS

    data = Path(args.data)
    t0 = time.perf_counter()
    if args.regenerate:  # only the benchmark's own dataset folders
        for name in DATASETS:
            shutil.rmtree(data / name, ignore_errors=True)
    print("1/6 synthesising the benchmark (only videos not already there)")
    cmd_synth(argparse.Namespace(out=str(data), scale=args.scale, seed=args.seed, workers=None,
                                 datasets=None, quiet=False, benchmark=args.benchmark))
    store = StoreResource(root=_store_root(args))
    inst = instance()
    keys = []
    for name in DATASETS:
        keys += ingest(inst, store, name, str(data / name / "manifest.csv"), args.shard_size)
    print(f"\n2/6 extracting raw latents of {len(keys)} shards into {store.root} (shipped demo VideoMAE)")
    rows = _extract(store, EncoderResource(), keys)  # static clips where roles say training reads them
    print(f"  {sum(r['clips'] for r in rows)} clip latents + {sum(r['static_clips'] for r in rows)} static, "
          f"{sum(r['quarantined'] for r in rows)} quarantined "
          f"[{time.perf_counter() - t0:.0f} s]")
    print("\n3/6 training the anonymizing adapter from cached latents")
    print(f"  {_training_preflight(store.store(), DEMO_AAM)}")
    _train_aam(store, DEMO_AAM)
    print(f"\n4/6 publishing anonymized feature tables and the DuckDB catalog [{time.perf_counter() - t0:.0f} s]")
    cmd_publish(argparse.Namespace(store=store.root, version=None))
    print(f"\n5/6 evaluating raw vs anonymized features [{time.perf_counter() - t0:.0f} s]")
    cmd_evaluate(argparse.Namespace(store=store.root, version=_demo_version(store.store()), seed=0))
    print("6/6 an analyst's query (read-only DuckDB catalog):")
    sql = ("SELECT task, metric, feature_set, round(value, 3) AS value FROM metrics "
           "WHERE metric IN ('top1', 'mAP', 'auc', 'cmap', 'leakage_removed') AND task IN ('ar', 'tad', 'ad', 'privacy') "
           "ORDER BY task, metric, feature_set")
    print(f"  splavu sql \"{sql}\"")
    print(format_table(query(store.store(), sql)))
    print(f"\ndone in {time.perf_counter() - t0:.0f} s; `splavu sql`, `splavu neighbors`, `dagster dev` to explore")
    return 0


def _demo_version(fs) -> str | None:
    """The demo scores the current version, else (all refused) the newest, and says which."""
    from splavu_core.ledger import current_version, newest_version

    return current_version(fs) or newest_version(fs)


def _catalog_store(args):
    from splavu_core.catalog import CatalogError, catalog_path
    from splavu_core.store import FeatureStore

    root = _store_root(args)
    store = FeatureStore(root)
    if not catalog_path(store).is_file():
        raise CatalogError(f"no catalog at {catalog_path(store)}: run feature_catalog first "
                           f"(`splavu --store {shlex.quote(str(root))} publish` publishes and builds it, or "
                           f"`SPLAVU_STORE={shlex.quote(str(root))} dagster asset materialize -m pipeline.definitions "
                           f"--select feature_catalog`)")
    return store


def cmd_sql(args) -> int:
    from splavu_core.catalog import empty_reason, format_table, query

    if not args.query.strip():
        raise StoreError('empty query: pass SQL, e.g. splavu sql "SELECT dataset, count(*) FROM videos GROUP BY ALL"')
    store = _catalog_store(args)
    out = format_table(query(store, args.query, read_only=True), args.format)
    print(out, end="" if out.endswith("\n") else "\n")
    if re.search(r"\banonymized_features\b", args.query, re.IGNORECASE) and (why := empty_reason(store)):
        print(f"splavu: note: anonymized_features is empty: {why}", file=sys.stderr)
    return 0


def cmd_neighbors(args) -> int:
    from splavu_core.catalog import format_table
    from splavu_core.neighbors import Index, NeighborsError, neighbors, refuse_if_refused
    from splavu_core.publish import current_version, read_versions
    from splavu_core.store import FeatureStore

    if args.k < 1:
        raise NeighborsError(f"--k must be >= 1, got {args.k}")
    store = FeatureStore(_store_root(args))
    version = args.version or current_version(store)
    index = None
    if version in read_versions(store)["version"].to_pylist():  # else neighbors() explains what is missing
        refuse_if_refused(store, version)
        index = Index.open(store, version)
        if not index.from_index:
            print(f"note: AAM version {version} has no up-to-date neighbour index, so its Parquet tables were read "
                  f"instead (slow); `splavu publish --version {version}` writes it", file=sys.stderr)
    out = format_table(neighbors(store, args.video_id, k=args.k, reduce=args.reduce, dataset=args.dataset,
                                 version=version, index=index), args.format)
    print(out, end="" if out.endswith("\n") else "\n")
    return 0



def cmd_fail_run(args) -> int:
    from pipeline.recovery import fail_run
    from pipeline.runner import instance

    inst = instance()
    run = inst.get_run_by_id(args.run_id)
    if run is None:
        raise StoreError(f"no run {args.run_id!r} in the Dagster instance at {inst.root_directory}")
    fail_run(inst, run, "by hand (`splavu fail-run`)", log=print)
    return 0


def main(argv=None) -> int:
    from splavu_core.synth.datasets import BENCHMARKS, DEFAULT_BENCHMARK

    ap = argparse.ArgumentParser(prog="splavu", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--store", help="store root (default $SPLAVU_STORE or ./store)")
    sub = ap.add_subparsers(dest="cmd", required=True)

    p = sub.add_parser("synth", help="generate the synthetic benchmark")
    p.add_argument("--scale", default="demo", choices=["tiny", "demo", "large"])
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", required=True)
    p.add_argument("--workers", type=int)
    p.add_argument("--datasets", nargs="*")
    p.add_argument("--benchmark", default=DEFAULT_BENCHMARK, choices=sorted(BENCHMARKS),
                   help="v2 (default): adds hand-object interaction actions; v1: motion-only actions")
    p.add_argument("--quiet", action="store_true")
    p.set_defaults(fn=cmd_synth)

    p = sub.add_parser("ingest", help="register a dataset (folder + manifest) and its shards")
    p.add_argument("name")
    p.add_argument("manifest")
    p.add_argument("--shard-size", type=int, default=256)
    p.add_argument("--roles", help="tasks the dataset serves, comma-separated: ar (action), tad (segments), ad "
                                   "(anomaly), privacy (attr_*), bias_f / bias_m (action, group), gait (subject_id); "
                                   "default: the dataset's name when it is one of these")
    p.set_defaults(fn=cmd_ingest)

    p = sub.add_parser("extract", help="extract raw latents of registered datasets")
    p.add_argument("--dataset", nargs="*")
    p.add_argument("--checkpoint", help="VideoMAE / V-JEPA 2 directory or hub id (default: the demo encoder)")
    p.set_defaults(fn=cmd_extract)

    p = sub.add_parser("train", help="train an AAM from the store's cached latents (Dagster run)")
    p.add_argument("--config", help="JSON of AAMTrainingConfig fields, e.g. '{\"epochs\": 30, \"w_lc\": 10}'")
    p.add_argument("--tasks", help="utility tasks to co-train, e.g. ar,tad (default: every task with labelled data)")
    p.set_defaults(fn=cmd_train)

    p = sub.add_parser("publish", help="anonymize every shard with an AAM version and rebuild the catalog")
    p.add_argument("--version", help="AAM version (default: the newest)")
    p.set_defaults(fn=cmd_publish)

    p = sub.add_parser("evaluate", help="score raw vs anonymized features; write reports/privacy_utility.*")
    p.add_argument("--version", help="AAM version (default: the current one)")
    p.add_argument("--seed", type=int, default=0, help="base probe seed: every probe runs with seeds N .. N+4")
    p.set_defaults(fn=cmd_evaluate)

    p = sub.add_parser("promote", help="make an AAM version current; one the gates refused only with --force --reason")
    p.add_argument("version")
    p.add_argument("--force", action="store_true", help="promote a version that failed a gate (needs --reason)")
    p.add_argument("--reason", help="why (kept in the version ledger and shown in the aam_versions table)")
    p.set_defaults(fn=cmd_promote)

    p = sub.add_parser("rollback", help="make the previously current AAM version current again")
    p.add_argument("--reason", help="why (kept in the ledger log)")
    p.set_defaults(fn=cmd_rollback)

    p = sub.add_parser("ablations", help="train and score the ablation variants; write reports/ablations.*")
    p.add_argument("--variants", nargs="*")
    p.add_argument("--epochs", type=int)
    p.set_defaults(fn=cmd_ablations)

    p = sub.add_parser("baselines", help="pixel-space baselines (blur, blacken, 2x/4x downsampling) through the same "
                                         "encoder and evaluation; adds their rows and costs to the report")
    p.add_argument("--only", nargs="*", help="baselines to run (default: all of blur blacken down2 down4)")
    p.add_argument("--masks", default="none", choices=["none", "rendered", "hog"],
                   help="person masks for blur/blacken: the synthetic renderer's (rendered) or OpenCV HOG (hog); "
                        "none skips them")
    p.add_argument("--dataset", nargs="*", help="datasets to re-extract (default: every evaluation dataset)")
    p.add_argument("--checkpoint", help="the raw store's encoder (default: the demo encoder)")
    p.add_argument("--no-evaluate", action="store_true", help="extract only")
    p.set_defaults(fn=cmd_baselines)

    p = sub.add_parser("demo", help="run the pipeline on the embedded synthetic benchmark")
    p.add_argument("--data", default="data/synth")
    p.add_argument("--scale", default="demo", choices=["tiny", "demo", "large"])
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--shard-size", type=int, default=256)
    p.add_argument("--benchmark", default=DEFAULT_BENCHMARK, choices=sorted(BENCHMARKS))
    p.add_argument("--regenerate", action="store_true")
    p.set_defaults(fn=cmd_demo)

    p = sub.add_parser("sql", help="run a read-only SQL query on the catalog (catalog.duckdb)")
    p.add_argument("query", help='e.g. "SELECT split, count(*) FROM clips GROUP BY split"')
    p.add_argument("--format", default="table", choices=["table", "csv", "json"])
    p.set_defaults(fn=cmd_sql)

    p = sub.add_parser("neighbors", help="nearest clips to a video in the current anonymized table")
    p.add_argument("video_id")
    p.add_argument("--version", help="AAM version whose published table to search (default: the current one)")
    p.add_argument("--k", type=int, default=10)
    p.add_argument("--dataset", help="the video's dataset, when its id occurs in several")
    p.add_argument("--reduce", default="mean", choices=["mean", "first"], help="query with the mean or the first clip")
    p.add_argument("--format", default="table", choices=["table", "csv", "json"])
    p.set_defaults(fn=cmd_neighbors)

    p = sub.add_parser("fail-run", help="mark a run whose process is gone failed and free its pool slots "
                                        "(runs of this host are found and failed automatically)")
    p.add_argument("run_id")
    p.set_defaults(fn=cmd_fail_run)

    args = ap.parse_args(argv)
    try:
        if args.cmd not in CREATES_STORE:
            _require_store(_store_root(args))
        return args.fn(args)
    except Exception as e:
        known = _expected_error(e)
        if known is None:
            raise  # a bug: keep the traceback
        print(f"splavu: error: {_one_line(known)}", file=sys.stderr)
        return 2


CREATES_STORE = ("synth", "ingest", "demo", "fail-run")  # every other command reads an existing store (fail-run: none)


def _require_store(root: str) -> None:
    from splavu_core.store import FeatureStore

    if not FeatureStore(root).fs.isdir(""):
        raise StoreError(f"no store at {root}: register a dataset first (splavu ingest NAME MANIFEST), "
                         f"or point --store / $SPLAVU_STORE at an existing store")


def _expected_error(e: BaseException) -> BaseException | None:
    """The user-facing error inside `e` (Dagster wraps what an asset raised), or None for a bug."""
    import dagster as dg

    from splavu_core.aam.train import TrainingDataError
    from splavu_core.synth.datasets import BenchmarkMismatch

    seen = set()
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        if isinstance(e, (ManifestError, StoreError, PixelError, TrainingDataError, BenchmarkMismatch, dg.Failure)):
            return e
        e = getattr(e, "user_exception", None) or e.__cause__
    return None


def _one_line(e: BaseException) -> str:
    if isinstance(e, ManifestError):
        return str(e)  # one problem per line, each with its row and column
    text = e.description if hasattr(e, "description") and e.description else str(e)
    return "; ".join(part.strip() for part in str(text).splitlines() if part.strip())


if __name__ == "__main__":
    sys.exit(main())
