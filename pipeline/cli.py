"""`splavu`: the project's command line.

    splavu synth --scale demo --seed 0 --out data/synth     write the synthetic benchmark
    splavu ingest NAME MANIFEST [--roles ar,privacy]        register a dataset and the tasks it serves
    splavu extract [--dataset NAME ...]                     materialise latents of every shard
    splavu train [--tasks ar,tad] [--config JSON]           train an AAM from cached latents
    splavu publish [--version V]                            anonymized tables + DuckDB catalog
    splavu evaluate [--version V] [--seed N]                privacy-utility report (raw vs anonymized), with intervals
    splavu promote VERSION [--force --reason TEXT]          make a version current (gated) / splavu rollback
    splavu curve [--config JSON]                            the publish rule's candidates on the selection split
    splavu ablations                                        the paper's ablations on the same latents
    splavu baselines [--masks rendered|hog]                 pixel-space baselines, scored beside splavu
    splavu sql "SELECT ..."  /  splavu neighbors VIDEO_ID   analysts: query the catalog read-only
    splavu forget --video ID ... | --subject ID ... | --file F --reason TEXT   erase videos from every layer, refit
    splavu fail-run RUN_ID                                  free the pool slots of a run whose process is gone
    splavu demo                                             all of the above on the embedded default
"""
from __future__ import annotations

import argparse
import json
import re
import sys
import time
from pathlib import Path

from tqdm import tqdm

from pipeline import demo, messages, preflight
from splavu_core.extract.encoders import DEMO_ENCODERS, QUANTIZE
from splavu_core.ingest.datasets import describe_registration, parse_roles, registered, registration
from splavu_core.ingest.synth.datasets import BENCHMARKS, DATASETS, DEFAULT_BENCHMARK, generate, plan
from splavu_core.serve.analyst import query
from splavu_core.serve.catalog import build_catalog, empty_reason
from splavu_core.serve.neighbors import NeighborsError, search
from splavu_core.serve.tables import format_table
from splavu_core.settings import settings
from splavu_core.store.feature_store import FeatureStore, StoreError
from splavu_core.store.ledger import PublishError, current_version, gates_passed, promote, read_verdicts, rollback


def launch(workflow: str, root: str, encoder: dict | None = None, **kw):
    """Every workflow a command starts: pipeline/runner.py's `workflow` on the store at `root` (encoder: the
    EncoderResource fields set), recorded in the CLI's Dagster instance. The runner is imported here, at the first
    launch: it loads Dagster, torch and every asset (~4 s on 2 cores), which the analysts' commands (sql, neighbors)
    and argument errors never need."""
    from assets.resources import EncoderResource, StoreResource
    from pipeline import runner

    if encoder is not None:
        kw["encoder"] = EncoderResource(**{k: v for k, v in encoder.items() if v})  # unset: the resource's default
    return getattr(runner, workflow)(runner.instance(), StoreResource(root=root), **kw)


def _store_root(args) -> str:
    return args.store or settings().store


def _print(lines) -> None:
    for line in lines:
        print(line, flush=True)


def cmd_synth(args) -> int:
    names = args.datasets or list(DATASETS)
    total = sum(len(plan(args.scale, args.seed, args.benchmark)[n]) for n in names)
    t0 = time.perf_counter()
    with tqdm(total=total, desc="rendering + encoding", unit="video", disable=args.quiet) as bar:
        summary = generate(args.out, args.scale, args.seed, workers=args.workers, datasets=names,
                           progress=lambda _: bar.update(), benchmark=args.benchmark,
                           masks=getattr(args, "masks", True))
    _print(messages.synth_lines(summary, args.benchmark, args.scale, args.seed, args.out, time.perf_counter() - t0))
    return 0


def cmd_ingest(args) -> int:
    root = _store_root(args)
    keys = launch("ingest", root, name=args.name, manifest=args.manifest, shard_size=args.shard_size,
                  roles=args.roles, allow_forgotten=args.allow_forgotten)
    print(f"{args.name}: {len(keys)} shard(s): {' '.join(keys)}")
    print(f"  {describe_registration(registration(FeatureStore(root), args.name))}")
    return 0


def _extract(root: str, encoder: dict, keys) -> list[dict]:
    rows = []
    for row in launch("extract_shards", root, encoder=encoder, shards=keys):
        rows.append(row)
        print(messages.extract_line(row), flush=True)
    return rows


def cmd_extract(args) -> int:
    root = _store_root(args)
    regs = registered(FeatureStore(root))
    names = args.dataset or list(regs)
    missing = [n for n in names if n not in regs]
    if missing:
        raise StoreError(f"not registered in {root}: {missing} (known: {list(regs)})")
    _extract(root, {"checkpoint": args.checkpoint, "quantize": args.quantize},
             [k for n in names for k in regs[n]["shards"]])
    return 0


def _train_config(args) -> dict:
    """--config (and --tasks) as aam_model's run config, checked before any run starts."""
    from assets.aam import check_training_config  # here: it loads torch

    try:
        cfg = json.loads(args.config) if args.config else {}
    except json.JSONDecodeError as e:
        raise StoreError(f"--config is not JSON ({e}): e.g. '{{\"keep\": 11}}'") from e
    if getattr(args, "tasks", None) is not None:
        cfg["tasks"] = list(parse_roles(args.tasks))
    try:
        check_training_config(cfg)
    except ValueError as e:
        raise StoreError(f"--config: {e}") from None
    return cfg


def cmd_train(args) -> int:
    cfg = _train_config(args)
    print(preflight.training_plan_line(FeatureStore(_store_root(args)), cfg), flush=True)
    _print(messages.train_lines(launch("train_aam", _store_root(args), config=cfg)))
    return 0


def cmd_publish(args, quiet_return: bool = False):
    out = launch("run_reanonymize", _store_root(args), version=args.version or "")
    print(f"  {messages.publish_summary(out)}")
    _print(f"  {line}" for line in messages.gate_lines(FeatureStore(_store_root(args)), out["version"]))
    return out if quiet_return else 0


def cmd_promote(args) -> int:
    store = FeatureStore(_store_root(args))
    if args.force and not (args.reason or "").strip():
        raise PublishError("--force needs --reason TEXT (kept in the version ledger)")
    if not read_verdicts(store, args.version):  # never gated (e.g. trained but not published): measure now
        from splavu_core.evaluation.gates import evaluate_gates  # here: loads the evaluation probes (torch), ~2 s

        evaluate_gates(store, args.version)
    from splavu_core.forget import retire_served_until_refit  # here: the analysts' commands never need it

    gates = gates_passed(store, args.version)
    prev = promote(store, args.version, force=args.force, reason=args.reason or "")
    print(messages.promoted_line(args.version, prev, gates, args.reason))
    _print(messages.retired_line(v) for v in retire_served_until_refit(store, args.version))
    _rebuild_catalog(store)
    return 0


def cmd_rollback(args) -> int:
    store = FeatureStore(_store_root(args))
    was, now = rollback(store, reason=args.reason or "")
    print(f"rolled back: AAM version {now} is current again (was {was})")
    _rebuild_catalog(store)
    return 0


def _rebuild_catalog(store) -> None:
    try:
        build_catalog(store)  # the analysts' anonymized_features view follows the current version
    except Exception as e:  # the ledger changed; say that the catalog did not follow
        print(f"note: the catalog was not rebuilt ({e}); run `splavu publish`", file=sys.stderr)


def cmd_evaluate(args) -> int:
    root = _store_root(args)
    store = FeatureStore(root)
    version = preflight.version_to_score(store, root, getattr(args, "version", None))
    state = messages.version_state(store, version, current_version(store))
    seed = getattr(args, "seed", 0) or 0
    print(f"scoring AAM version {version}: {state}; probe seeds {seed}..{seed + 4}", flush=True)
    res = launch("run_evaluation", root, config={"aam_version": version, "seed": seed})
    build_catalog(store)  # the metrics view now has files to read
    print(store.files.read_text("reports/privacy_utility.md"))
    print(f"scored AAM version {version} ({state})")
    _print(messages.evaluation_notes(res))
    return 0


def cmd_curve(args) -> int:
    """The choose_operating_point job: the publish rule's candidates fitted and scored on the store's selection split, the
    one it picks and why, and its check (is the current version that pick)."""
    _print(messages.curve_lines(*launch("run_curve", _store_root(args), config=_train_config(args))))
    return 0


def cmd_ablations(args) -> int:
    root = _store_root(args)
    launch("run_ablations", root, variants=args.variants, epochs=args.epochs)
    print(FeatureStore(root).files.read_text("reports/ablations.md"))
    return 0


def cmd_baselines(args) -> int:
    from splavu_core.extract.pixel import BASELINES  # here: it loads torch

    root = _store_root(args)
    names = args.only or list(BASELINES)
    if not args.no_evaluate:  # before minutes of extraction, not after them
        preflight.version_to_score(FeatureStore(root), root, args.version)
    print(f"pixel baselines {names} (person masks: {args.masks}): re-decoding and re-encoding the evaluation videos")
    t0 = time.perf_counter()
    launch("run_baselines", root, encoder={"checkpoint": args.checkpoint}, names=names, mask_source=args.masks,
           datasets=args.dataset or ())
    print(f"extracted in {time.perf_counter() - t0:.0f} s; scoring every feature set")
    return 0 if args.no_evaluate else cmd_evaluate(args)


def cmd_demo(args) -> int:
    """Every step on the synthetic benchmark, each by its own command, in order (pipeline/demo.py: the plan, the
    stages' clock and their record)."""
    root, data = _store_root(args), Path(args.data)
    names, left_out = demo.demo_datasets(args.extras, args.full)
    clock = demo.StageClock()
    if args.regenerate:
        demo.remove_datasets(data, names)
    _print(messages.demo_start_lines(names, left_out))
    # videos only: the person masks are for `splavu baselines --masks rendered` (splavu synth adds them then)
    cmd_synth(argparse.Namespace(out=str(data), scale=args.scale, seed=args.seed, workers=None,
                                 datasets=names, quiet=False, benchmark=args.benchmark, masks=False))
    clock.lap("synth")
    keys = [k for n in names for k in launch("ingest", root, name=n, manifest=str(data / n / "manifest.csv"),
                                              shard_size=args.shard_size)]
    encoder = DEMO_ENCODERS[args.encoder]
    print(f"\n2/6 extracting raw latents of {len(keys)} shards into {root} (shipped VideoMAE '{args.encoder}': "
          f"{encoder.name})")
    rows = _extract(root, {"checkpoint": str(encoder), "quantize": args.quantize},
                    keys)  # static clips where roles say training reads them
    print(messages.extracted_line(rows, clock.elapsed()))
    clock.lap("extract")
    print("\n3/6 the publish rule picks an operating point on the selection split, then the anonymizing adapter is "
          "fitted from cached latents")
    store = FeatureStore(root)
    print(f"  {preflight.training_plan_line(store, {})}")
    # the defaults: the rule over its candidate family (docs/method.md)
    _print(messages.train_lines(launch("train_aam", root, config={}), table=True))
    clock.lap("fit")
    print(f"\n4/6 publishing anonymized feature tables and the DuckDB catalog [{clock.elapsed():.0f} s]")
    out = cmd_publish(argparse.Namespace(store=root, version=None), quiet_return=True)
    clock.lap("publish")
    clock.split_gates(out)
    print(f"\n5/6 evaluating raw vs anonymized features [{clock.elapsed():.0f} s]")
    cmd_evaluate(argparse.Namespace(store=root, version=demo.demo_version(store), seed=0))
    clock.lap("evaluate")
    record = demo.record(store, clock.stages, left_out, datasets=names, scale=args.scale, seed=args.seed,
                         measurements=clock.measurements)
    _print(messages.demo_end_lines(demo.ANALYST_SQL, format_table(query(store, demo.ANALYST_SQL)), record["stages"],
                                   clock.elapsed()))
    return 0


def cmd_sql(args) -> int:
    if not args.query.strip():
        raise StoreError('empty query: pass SQL, e.g. splavu sql "SELECT dataset, count(*) FROM videos GROUP BY ALL"')
    store = preflight.require_catalog(_store_root(args))
    out = format_table(query(store, args.query, read_only=True), args.format)
    print(out, end="" if out.endswith("\n") else "\n")
    if re.search(r"\banonymized_features\b", args.query, re.IGNORECASE) and (why := empty_reason(store)):
        print(f"splavu: note: anonymized_features is empty: {why}", file=sys.stderr)
    return 0


def cmd_neighbors(args) -> int:
    if args.k < 1:
        raise NeighborsError(f"--k must be >= 1, got {args.k}")
    store = FeatureStore(_store_root(args))
    out = format_table(search(store, args.video_id, k=args.k, reduce=args.reduce, dataset=args.dataset,
                              version=args.version, mode=args.search, nprobe=args.nprobe,
                              note=lambda m: print(f"note: {m}", file=sys.stderr)), args.format)
    print(out, end="" if out.endswith("\n") else "\n")
    return 0


def cmd_forget(args) -> int:
    """Erase videos (or a subject's) from every layer of the store, then refit the adapter if it was fitted on them."""
    root = _store_root(args)
    for event in launch("forget", root, videos=args.video or [], subjects=args.subject or [], ids_file=args.file,
                        reason=args.reason or "", policy=args.policy):
        _print(messages.forget_lines(event, FeatureStore(root)))
    return 0


def cmd_fail_run(args) -> int:
    from pipeline.recovery import fail_run_by_id  # here: both load Dagster
    from pipeline.runner import instance

    fail_run_by_id(instance(), args.run_id, "by hand (`splavu fail-run`)", log=print)
    return 0


def build_parser() -> argparse.ArgumentParser:
    """The `splavu` command line (docs/cli.md is generated from it: docs/gen_reference.py)."""
    ap = argparse.ArgumentParser(prog="splavu", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--store", help="store root (default $SPLAVU_STORE or ./store)")
    # every subcommand takes --store too (`splavu sql --store X ...`); SUPPRESS keeps the one given before it otherwise
    store_opt = argparse.ArgumentParser(add_help=False)
    store_opt.add_argument("--store", default=argparse.SUPPRESS, help="store root (default $SPLAVU_STORE or ./store)")
    sub = ap.add_subparsers(dest="cmd", required=True)

    def add(name: str, fn, **kw) -> argparse.ArgumentParser:
        p = sub.add_parser(name, parents=[store_opt], **kw)
        p.set_defaults(fn=fn)
        return p

    p = add("synth", cmd_synth, help="generate the synthetic benchmark")
    p.add_argument("--scale", default="demo", choices=["tiny", "demo", "large"])
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", required=True)
    p.add_argument("--workers", type=int)
    p.add_argument("--datasets", nargs="*")
    p.add_argument("--benchmark", default=DEFAULT_BENCHMARK, choices=sorted(BENCHMARKS),
                   help="v3 (default): v2 plus test videos of the bias sets' shortcut action; v2: adds hand-object "
                        "interaction actions; v1: motion-only actions")
    p.add_argument("--quiet", action="store_true")

    p = add("ingest", cmd_ingest, help="register a dataset (folder + manifest) and its shards")
    p.add_argument("name")
    p.add_argument("manifest")
    p.add_argument("--shard-size", type=int, default=256)
    p.add_argument("--roles", help="tasks the dataset serves, comma-separated: ar (action), tad (segments), ad "
                                   "(anomaly), privacy (attr_*), bias_f / bias_m (action, group), gait (subject_id); "
                                   "default: the dataset's name when it is one of these")
    p.add_argument("--allow-forgotten", action="store_true",
                   help="re-admit videos erased by `splavu forget` that this manifest lists (logged in the erasure log)")

    p = add("extract", cmd_extract, help="extract raw latents of registered datasets")
    p.add_argument("--dataset", nargs="*")
    p.add_argument("--checkpoint", help="VideoMAE / V-JEPA 2 directory or hub id (default: the demo encoder)")
    p.add_argument("--quantize", choices=QUANTIZE, help="int8: the encoder's linear layers in int8 on CPU (1.4-1.5x "
                   "faster, cosine to fp32 >= 0.998; another encoder fingerprint, so not mixed with fp32 latents)")

    p = add("train", cmd_train, help="train an AAM from the store's cached latents (Dagster run)")
    p.add_argument("--config", help="JSON of AAMTrainingConfig fields, e.g. '{\"keep\": 11}' (the default closed-form "
                                    "keep fit reads keep, recentre and the dataset fields; epochs, w_lc and the other "
                                    "loop fields only with a trained adapter: docs/configuration.md)")
    p.add_argument("--tasks", help="utility tasks to co-train, e.g. ar,tad (default: every task with labelled data)")

    p = add("publish", cmd_publish, help="anonymize every shard with an AAM version and rebuild the catalog")
    p.add_argument("--version", help="AAM version (default: the newest)")

    p = add("evaluate", cmd_evaluate, help="score raw vs anonymized features; write reports/privacy_utility.*")
    p.add_argument("--version", help="AAM version (default: the current one)")
    p.add_argument("--seed", type=int, default=0, help="base probe seed: every probe runs with seeds N .. N+4")

    p = add("promote", cmd_promote,
            help="make an AAM version current; one the gates refused only with --force --reason")
    p.add_argument("version")
    p.add_argument("--force", action="store_true", help="promote a version that failed a gate (needs --reason)")
    p.add_argument("--reason", help="why (kept in the version ledger and shown in the aam_versions table)")

    p = add("rollback", cmd_rollback, help="make the previously current AAM version current again")
    p.add_argument("--reason", help="why (kept in the ledger log)")

    p = add("curve", cmd_curve, help="score the publish rule's candidates on the selection split; say which it "
                                     "picks and why (nothing is fitted or published)")
    p.add_argument("--config", help="JSON of AAMTrainingConfig fields the candidates start from (as `train --config`)")

    p = add("ablations", cmd_ablations, help="train and score the ablation variants; write reports/ablations.*")
    p.add_argument("--variants", nargs="*")
    p.add_argument("--epochs", type=int)

    p = add("baselines", cmd_baselines, help="pixel-space baselines (blur, blacken, 2x/4x downsampling) through the "
                                             "same encoder and evaluation; adds their rows and costs to the report")
    p.add_argument("--only", nargs="*", help="baselines to run (default: all of blur blacken down2 down4)")
    p.add_argument("--masks", default="none", choices=["none", "rendered", "hog"],
                   help="person masks for blur/blacken: the synthetic renderer's (rendered) or OpenCV HOG (hog); "
                        "none skips them")
    p.add_argument("--dataset", nargs="*", help="datasets to re-extract (default: every evaluation dataset)")
    p.add_argument("--checkpoint", help="the raw store's encoder (default: the demo encoder)")
    p.add_argument("--no-evaluate", action="store_true", help="extract only")
    p.add_argument("--version", help="AAM version to score them beside (default: the current one)")

    p = add("demo", cmd_demo, help="run the pipeline on the embedded synthetic benchmark")
    p.add_argument("--data", default="data/synth")
    p.add_argument("--scale", default="demo", choices=["tiny", "demo", "large"])
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--shard-size", type=int, default=256)
    p.add_argument("--benchmark", default=DEFAULT_BENCHMARK, choices=sorted(BENCHMARKS))
    p.add_argument("--regenerate", action="store_true")
    p.add_argument("--with", dest="extras", metavar="GROUPS",
                   help=f"also run these dataset groups, comma-separated ({', '.join(demo.DEMO_EXTRAS)}); not by default")
    p.add_argument("--full", action="store_true", help="every dataset of the benchmark (= --with bias)")
    p.add_argument("--encoder", default="demo", choices=sorted(DEMO_ENCODERS),
                   help="the shipped encoder: 'demo' (trained with appearance heads) or 'action' (actions + masked "
                        "reconstruction only, as real VFMs are); a store holds one encoder's latents")
    p.add_argument("--quantize", choices=QUANTIZE, help="extract with the encoder's linear layers in int8 (CPU)")

    p = add("sql", cmd_sql, help="run a read-only SQL query on the catalog (catalog.duckdb)")
    p.add_argument("query", help='e.g. "SELECT split, count(*) FROM clips GROUP BY split"')
    p.add_argument("--format", default="table", choices=["table", "csv", "json"])

    p = add("neighbors", cmd_neighbors, help="nearest clips to a video in the current anonymized table")
    p.add_argument("video_id")
    p.add_argument("--version", help="AAM version whose published table to search (default: the current one)")
    p.add_argument("--k", type=int, default=10)
    p.add_argument("--dataset", help="the video's dataset, when its id occurs in several")
    p.add_argument("--reduce", default="mean", choices=["mean", "first"], help="query with the mean or the first clip")
    p.add_argument("--search", default="auto", choices=["auto", "exact", "approximate"],
                   help="exact: every row scored; approximate: the version's faiss IVF index (written for tables of "
                        "10M+ rows, $SPLAVU_ANN_MIN_ROWS); auto: approximate where the version has that index")
    p.add_argument("--nprobe", type=int, default=8, help="IVF lists scanned by the approximate search")
    p.add_argument("--format", default="table", choices=["table", "csv", "json"])

    p = add("forget", cmd_forget, help="erase videos (or every video of a subject) from every layer of the store and "
                                       "refit the adapter without them; the receipt goes to the erasure log "
                                       "(`erasures` view)")
    p.add_argument("--video", nargs="+", metavar="ID", help="video ids to erase")
    p.add_argument("--subject", nargs="+", metavar="ID", help="erase every video whose manifest row has this subject_id")
    p.add_argument("--file", metavar="F", help="a file of video ids, one a line")
    p.add_argument("--reason", help="why (required; kept in the erasure log: do not name the person)")
    p.add_argument("--policy", choices=("retire", "serve_until_refit"),
                   help="what serves until the refit passes both gates: 'retire' the versions fitted on these videos "
                        "now, or 'serve_until_refit' (the current version, their rows removed, retired once a version "
                        "fitted without them is current); default $SPLAVU_ERASURE_POLICY (retire)")

    p = add("fail-run", cmd_fail_run, help="mark a run whose process is gone failed and free its pool slots "
                                           "(runs of this host are found and failed automatically)")
    p.add_argument("run_id")
    return ap


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    try:
        if args.cmd not in CREATES_STORE:
            preflight.require_store(_store_root(args))
        rc = args.fn(args)
    except Exception as e:
        rc, line = messages.error_line(e)
        if rc == 1 and settings().traceback:  # a bug: its traceback on request
            raise
        print(line, file=sys.stderr)
        return rc
    if "pipeline.runner" in sys.modules and (note := sys.modules["pipeline.runner"].instance_note()):
        print(note, file=sys.stderr)  # where the runs went, once per instance folder the CLI chose itself
    return rc


CREATES_STORE = ("synth", "ingest", "demo", "fail-run")  # every other command reads an existing store (fail-run: none)


if __name__ == "__main__":
    sys.exit(main())
