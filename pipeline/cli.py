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
import shlex
import sys
import time
from pathlib import Path

from tqdm import tqdm

from pipeline import demo
from splavu_core.extract.decode import ExtractError
from splavu_core.extract.encoders import DEMO_ENCODERS, QUANTIZE
from splavu_core.ingest.datasets import describe_registration, parse_roles, registered, registration, training_plan
from splavu_core.ingest.manifest import ManifestError
from splavu_core.ingest.masks import PixelError
from splavu_core.ingest.synth.datasets import BENCHMARKS, DATASETS, DEFAULT_BENCHMARK, BenchmarkMismatch, generate, plan
from splavu_core.serve.analyst import query
from splavu_core.serve.catalog import CatalogError, build_catalog, catalog_path, empty_reason
from splavu_core.serve.neighbors import NeighborsError, search
from splavu_core.serve.tables import format_table
from splavu_core.settings import settings
from splavu_core.store.feature_store import FeatureStore, StoreError
from splavu_core.store.ledger import (
    PublishError,
    current_version,
    gates_passed,
    promote,
    read_verdicts,
    read_versions,
    refused_versions,
    rollback,
)


def _runner():
    """pipeline.runner, imported on first use: it loads Dagster, torch and every asset (~4 s on 2 cores), which the
    analysts' commands (sql, neighbors) and argument errors never need."""
    import pipeline.runner

    return pipeline.runner


def _store_root(args) -> str:
    return args.store or settings().store


def cmd_synth(args) -> int:
    names = args.datasets or list(DATASETS)
    total = sum(len(plan(args.scale, args.seed, args.benchmark)[n]) for n in names)
    t0 = time.perf_counter()
    with tqdm(total=total, desc="rendering + encoding", unit="video", disable=args.quiet) as bar:
        summary = generate(args.out, args.scale, args.seed, workers=args.workers, datasets=names,
                           progress=lambda _: bar.update(), benchmark=args.benchmark,
                           masks=getattr(args, "masks", True))
    print(f"synthetic benchmark {args.benchmark} ({args.scale}, seed {args.seed}) in {args.out}  "
          f"[{time.perf_counter() - t0:.0f} s]")
    print(f"{'dataset':10s} {'videos':>7s} {'clips':>7s} {'frames':>8s}  splits")
    for name, s in summary.items():
        print(f"{name:10s} {s['videos']:7d} {s['clips']:7d} {s['frames']:8d}  {json.dumps(s['splits'])}")
    return 0


def cmd_ingest(args) -> int:
    r = _runner()
    store = r.StoreResource(root=_store_root(args))
    keys = r.ingest(r.instance(), store, args.name, args.manifest, args.shard_size, roles=args.roles,
                    allow_forgotten=args.allow_forgotten)
    print(f"{args.name}: {len(keys)} shard(s): {' '.join(keys)}")
    print(f"  {describe_registration(registration(store.store(), args.name))}")
    return 0


def _extract(store, encoder, keys, quiet=False) -> list[dict]:
    r = _runner()
    inst, rows = r.instance(), []
    for k in keys:
        res = r.materialize_shard(inst, k, store, encoder)
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
    r = _runner()
    store = r.StoreResource(root=_store_root(args))
    regs = registered(store.store())
    names = args.dataset or list(regs)
    missing = [n for n in names if n not in regs]
    if missing:
        raise StoreError(f"not registered in {store.root}: {missing} (known: {list(regs)})")
    keys = [k for n in names for k in regs[n]["shards"]]
    _extract(store, r.EncoderResource(checkpoint=args.checkpoint or r.EncoderResource().checkpoint,
                                      quantize=args.quantize or ""), keys)
    return 0


def _train_aam(store, config: dict, table: bool = False) -> str:
    r = _runner()
    res = r.train_aam(r.instance(), store, config)
    md = {k: v.value for k, v in res.asset_materializations_for_node("aam_model")[0].metadata.items()}
    if table and "operating_point_candidates" in md:
        print("  the publish rule's candidates on the selection split:")
        print("\n".join(f"  {line}" for line in md["operating_point_candidates"].splitlines()))
    print(f"  operating point: {md['operating_point_why'] if 'operating_point_why' in md else md['operating_point']}")
    print(f"  {train_line(md)}")
    if "pair_matching_chance" in md:
        print(f"  {pair_matching_line(md)}")
    return md["version"]


def train_line(md: dict) -> str:
    """One line on a fitted AAM (aam_model's metadata values)."""
    if "selected_epoch" in md:  # a trained adapter
        return (f"AAM {md['version']}: {md['parameters']} parameters, selected epoch {md['selected_epoch']}, "
                f"{md['train_seconds']:.0f} s (encoder never loaded)")
    # closed form: what was fitted, not "0 parameters, selected epoch 0"
    return f"AAM {md['version']}: {md['fit']}, {md['fit_seconds']:.0f} s (encoder never loaded)"


def pair_matching_line(md: dict) -> str:
    """What a fresh critic still matches (aam_model's pair_matching_* metadata), with the chance level of the groups
    it was measured in."""
    chance = md["pair_matching_chance"]
    group = md.get("pair_matching_group") or round(1 / chance)
    among = f"among {group} of {md['pair_matching_heldout']} held-out videos" if "pair_matching_heldout" in md \
        else f"among {group} held-out videos"
    pairs = ", ".join(f"{k.replace('_', '↔')} {md[f'pair_matching_{k}_raw']:.3f} → {md[f'pair_matching_{k}_after']:.3f}"
                      for k in ("static_static", "static_action") if f"pair_matching_{k}_raw" in md)
    return f"what a fresh critic still matches, top-1 {among} (chance 1/{group} = {chance:.3f}): {pairs}"


def _train_config(args) -> dict:
    """--config (and --tasks) as aam_model's run config, checked before any run starts."""
    try:
        cfg = json.loads(args.config) if args.config else {}
    except json.JSONDecodeError as e:
        raise StoreError(f"--config is not JSON ({e}): e.g. '{{\"keep\": 11}}'") from e
    if getattr(args, "tasks", None) is not None:
        cfg["tasks"] = list(parse_roles(args.tasks))
    try:
        _runner().check_training_config(cfg)
    except ValueError as e:
        raise StoreError(f"--config: {e}") from None
    return cfg


def cmd_train(args) -> int:
    cfg = _train_config(args)
    store = _runner().StoreResource(root=_store_root(args))
    print(_training_preflight(store.store(), cfg), flush=True)
    _train_aam(store, cfg)
    return 0


def _training_preflight(store, cfg: dict) -> str:
    """What training will use, checked before a Dagster run starts (so a missing task is one line, not a
    failed run): the one-line plan, or RoleError / StoreError saying what to do."""
    plan = training_plan(store, cfg.get("tasks"), {t: cfg.get(f"{t}_dataset", "") for t in ("ar", "tad", "ad")},
                         cfg.get("selection", ""))
    shards = {s for d in plan.datasets.values() if d for s in registration(store, d)["shards"]}
    missing = sorted(s for s in shards if store.committed(s) is None)
    if missing:
        raise StoreError(f"no latents yet for shard(s) {missing}: run `splavu extract` first")
    return plan.summary()


def cmd_publish(args, quiet_return: bool = False):
    r = _runner()
    out = r.run_reanonymize(r.instance(), r.StoreResource(root=_store_root(args)), version=args.version or "")
    print(f"  {publish_summary(out)}")
    for line in gate_lines(FeatureStore(_store_root(args)), out["version"]):
        print(f"  {line}")
    return out if quiet_return else 0


def publish_summary(out: dict) -> str:
    """What this publish did: clips written (shards already published are not counted as new) and whether the
    version became current in this run, was current before, or why it is not."""
    version, shards = out["version"], list(out["shards"].values())
    new = [s for s in shards if not s["skipped"]]
    if new:
        line = f"published {sum(s['rows'] for s in new)} anonymized clips of {len(new)} shard(s) with AAM {version}"
        if len(new) < len(shards):
            line += f" ({len(shards) - len(new)} shard(s) already had its tables)"
    else:
        line = f"nothing new to publish: all {len(shards)} shard(s) already have AAM {version}'s tables"
    promoted = next((s["promotion"] for s in shards if "now current" in s["promotion"]), None)
    last = shards[-1]
    if promoted:
        state = f"AAM {version} is {promoted.split(': ', 1)[-1]}"
    elif last["is_current"]:
        state = f"AAM {version} was already current before this publish"
    else:
        state = f"current version: {last['current_version'] or 'none'}; AAM {version}: {last['promotion']}"
    return f"{line}; {state}"


def gate_lines(store, version: str) -> list[str]:
    """Both gates' recorded verdicts on `version` (validation splits), one line each."""
    v = read_verdicts(store, version)
    out = []
    for gate, label in (("privacy", "privacy budget"), ("utility", "utility")):
        if gate not in v:
            out.append(f"gate {label}: not run on {version}")
        else:
            state = "PASSED" if v[gate]["passed"] else ("UNDECIDABLE (not made current)"
                                                       if ": undecidable" in v[gate]["why"] and ": FAILED" not in
                                                       v[gate]["why"] else "FAILED")
            out.append(f"gate {label}: {state} on validation: {v[gate]['why']}")
    return out


def cmd_promote(args) -> int:
    store = FeatureStore(_store_root(args))
    if args.force and not (args.reason or "").strip():
        raise PublishError("--force needs --reason TEXT (kept in the version ledger)")
    if not read_verdicts(store, args.version):  # never gated (e.g. trained but not published): measure now
        from splavu_core.evaluation.gates import evaluate_gates  # here: loads the evaluation probes (torch), ~2 s

        evaluate_gates(store, args.version)
    ok, why = gates_passed(store, args.version)
    prev = promote(store, args.version, force=args.force, reason=args.reason or "")
    how = "passed both gates" if ok else f"FORCED past the gates ({why}); reason: {args.reason}"
    print(f"AAM version {args.version} is now current (was {prev or 'none'}): {how}")
    from splavu_core.forget import retire_served_until_refit  # here: the analysts' commands never need it

    for v in retire_served_until_refit(store, args.version):
        print(f"AAM version {v} retired: it was fitted on erased videos and served (policy serve_until_refit) until "
              f"a version fitted without them became current")
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


def _version_to_score(store: FeatureStore, root, requested: str | None) -> str:
    """--version, else the current version; a clear error naming the newest recorded one when there is none."""
    version = requested or current_version(store)
    if not version:
        known = read_versions(store)["version"].to_pylist()
        if not known:
            raise StoreError(f"no AAM version in {root}: run `splavu train` and `splavu publish` first")
        raise StoreError(f"no AAM version is current in {root} (every recorded one was refused or is not published "
                         f"everywhere): score one explicitly with --version {known[-1]}")
    return version


def cmd_evaluate(args) -> int:
    r = _runner()
    root = _store_root(args)
    store = FeatureStore(root)
    current = current_version(store)
    version = _version_to_score(store, root, getattr(args, "version", None))
    state = "the current version" if version == current else \
        f"NOT current (current: {current or 'none'}){'; ' + _refusal(store, version) if _refusal(store, version) else ''}"
    seed = getattr(args, "seed", 0) or 0
    print(f"scoring AAM version {version}: {state}; probe seeds {seed}..{seed + 4}", flush=True)
    res = r.run_evaluation(root, config={"aam_version": version, "seed": seed}, instance=r.instance())
    build_catalog(store)  # the metrics view now has files to read
    print(store.files.read_text("reports/privacy_utility.md"))
    print(f"scored AAM version {version} ({state})")
    for line in evaluation_notes(res):
        print(line)
    return 0


def _refusal(store, version: str) -> str:
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
    out = skip_lines(skipped)
    for ev in res.get_asset_check_evaluations():
        if not ev.passed:
            level = "warning" if ev.severity.value == "WARN" else "error"
            out.append(f"{level}: check {ev.check_name} failed: {ev.description}")
    return out


def skip_lines(skipped: dict[str, str]) -> list[str]:
    """{task or "<feature set>:<task>": why} -> one line per task and reason (not per feature set); the tasks that
    have no registered dataset share one line."""
    by_task: dict[tuple[str, str], list[str]] = {}
    for key, why in skipped.items():
        feature_set, _, task = key.rpartition(":")
        by_task.setdefault((task, why), []).append(feature_set or "raw")
    no_data = sorted({task for task, why in by_task if "(no dataset with role" in why})
    out = [f"skipped {', '.join(no_data)}: no dataset is registered with {'that role' if len(no_data) == 1 else 'those roles'} "
           f"(splavu ingest NAME MANIFEST --roles ROLE)"] if no_data else []
    return out + [f"skipped {task} ({', '.join(sets)}): {why}" for (task, why), sets in sorted(by_task.items())
                  if task not in no_data]


def cmd_curve(args) -> int:
    """The choose_operating_point job: the publish rule's candidates fitted and scored on the store's selection split, the
    one it picks and why, and its check (is the current version that pick)."""
    r = _runner()
    config = _train_config(args)
    res = r.run_job(r.instance(), "choose_operating_point", r.StoreResource(root=_store_root(args)),
                    run_config={"ops": {"operating_point": {"config": config}}})
    md = r.metadata(res, "operating_point")
    if "operating_point_candidates" in md:
        print(md["operating_point_candidates"])
    print(f"operating point: {md.get('operating_point_why', md['operating_point'])}")
    for check in res.get_asset_check_evaluations():
        print(f"check {check.check_name} {'passed' if check.passed else 'warns'}: {check.description}")
    print(f"record: {md['path']} (+ .png); {md['seconds']:.0f} s")
    return 0


def cmd_ablations(args) -> int:
    r = _runner()
    root = _store_root(args)
    r.run_ablations(root, variants=args.variants, epochs=args.epochs, instance=r.instance())
    print(FeatureStore(root).files.read_text("reports/ablations.md"))
    return 0


def cmd_baselines(args) -> int:
    r = _runner()
    root = _store_root(args)
    names = args.only or list(r.BASELINES)
    if not args.no_evaluate:  # before minutes of extraction, not after them
        _version_to_score(FeatureStore(root), root, args.version)
    print(f"pixel baselines {names} (person masks: {args.masks}): re-decoding and re-encoding the evaluation videos")
    t0 = time.perf_counter()
    r.run_baselines(r.instance(), r.StoreResource(root=root),
                    r.EncoderResource(checkpoint=args.checkpoint or r.EncoderResource().checkpoint),
                    names, mask_source=args.masks, datasets=args.dataset or ())
    print(f"extracted in {time.perf_counter() - t0:.0f} s; scoring every feature set")
    return 0 if args.no_evaluate else cmd_evaluate(args)


def cmd_demo(args) -> int:
    """Every step on the synthetic benchmark, each by its own command, in order (pipeline/demo.py: the plan, the
    stages' clock and their record)."""
    r = _runner()
    data = Path(args.data)
    names, left_out = demo.demo_datasets(args.extras, args.full)
    clock = demo.StageClock()
    if args.regenerate:
        demo.remove_datasets(data, names)
    print(f"1/6 synthesising the benchmark: {', '.join(names)} (only videos not already there)")
    for group, why in left_out.items():
        print(f"  not in this demo: {group} ({why})")
    # videos only: the person masks are for `splavu baselines --masks rendered` (splavu synth adds them then)
    cmd_synth(argparse.Namespace(out=str(data), scale=args.scale, seed=args.seed, workers=None,
                                 datasets=names, quiet=False, benchmark=args.benchmark, masks=False))
    clock.lap("synth")
    store = r.StoreResource(root=_store_root(args))
    keys = demo.ingest_datasets(r, store, data, names, args.shard_size)
    encoder = DEMO_ENCODERS[args.encoder]
    print(f"\n2/6 extracting raw latents of {len(keys)} shards into {store.root} (shipped VideoMAE '{args.encoder}': "
          f"{encoder.name})")
    rows = _extract(store, r.EncoderResource(checkpoint=str(encoder), quantize=args.quantize or ""),
                    keys)  # static clips where roles say training reads them
    print(f"  {sum(x['clips'] for x in rows)} clip latents + {sum(x['static_clips'] for x in rows)} static, "
          f"{sum(x['quarantined'] for x in rows)} quarantined "
          f"[{clock.elapsed():.0f} s]")
    clock.lap("extract")
    print("\n3/6 the publish rule picks an operating point on the selection split, then the anonymizing adapter is "
          "fitted from cached latents")
    print(f"  {_training_preflight(store.store(), {})}")
    _train_aam(store, {}, table=True)  # the defaults: the rule over its candidate family (docs/method.md)
    clock.lap("fit")
    print(f"\n4/6 publishing anonymized feature tables and the DuckDB catalog [{clock.elapsed():.0f} s]")
    out = cmd_publish(argparse.Namespace(store=store.root, version=None), quiet_return=True)
    clock.lap("publish")
    clock.split_gates(out)
    print(f"\n5/6 evaluating raw vs anonymized features [{clock.elapsed():.0f} s]")
    cmd_evaluate(argparse.Namespace(store=store.root, version=demo.demo_version(store.store()), seed=0))
    clock.lap("evaluate")
    feature_store = store.store()
    record = demo.record(feature_store, clock.stages, left_out, datasets=names, scale=args.scale, seed=args.seed,
                         measurements=clock.measurements)
    print("6/6 an analyst's query (read-only DuckDB catalog):")
    print(f"  splavu sql \"{demo.ANALYST_SQL}\"")
    print(format_table(query(feature_store, demo.ANALYST_SQL)))
    print("\nstages (wall s): " + ", ".join(f"{k} {'—' if v is None else f'{v:.0f}'}"
                                           for k, v in record["stages"].items()))
    print(f"done in {clock.elapsed():.0f} s; `splavu sql`, `splavu neighbors`, `dagster dev` to explore")
    return 0


def _catalog_store(args):
    root = _store_root(args)
    store = FeatureStore(root)
    if not catalog_path(store).is_file():
        raise CatalogError(f"no catalog at {catalog_path(store)}: run feature_catalog first "
                           f"(`splavu --store {shlex.quote(str(root))} publish` publishes and builds it, or "
                           f"`SPLAVU_STORE={shlex.quote(str(root))} dagster asset materialize -m pipeline.definitions "
                           f"--select feature_catalog`)")
    return store


def cmd_sql(args) -> int:
    if not args.query.strip():
        raise StoreError('empty query: pass SQL, e.g. splavu sql "SELECT dataset, count(*) FROM videos GROUP BY ALL"')
    store = _catalog_store(args)
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
    from splavu_core import forget as fg  # here: the analysts' commands never need it

    if not (args.reason or "").strip():
        raise fg.ForgetError("--reason TEXT is required (why; kept in the erasure log, so do not name the person)")
    videos = list(args.video or []) + (fg.read_ids_file(args.file) if args.file else [])
    subjects = list(args.subject or [])
    if not (videos or subjects):
        raise fg.ForgetError("name what to erase: --video ID ..., --subject ID ... or --file F (one video id a line)")
    store = FeatureStore(_store_root(args))
    finished = [_forget(store, rid, note="left unfinished by an earlier run") for rid in fg.pending_requests(store)]
    try:
        targets, already = fg.resolve(store, videos, subjects)
    except fg.ForgetError:
        if finished:  # the request this command repeats was the unfinished one: nothing is left of it
            print("nothing else to erase: the request above was this one")
            return 0
        raise
    for v in already:
        print(f"video {v!r} was erased already (it has a tombstone)")
    if not targets:
        return 0
    files = sorted({f for t in targets.values() for f in t["files"]})
    regs = registered(store)
    manifests = sorted({regs[d]["manifest"] for t in targets.values() for s in t["shards"]
                        if (d := s.rpartition("-")[0]) in regs})
    print(f"erasing {len(targets)} video(s) from {store.root}. Your own files are not touched; delete them yourself "
          f"(and their rows in {', '.join(manifests) or 'your manifests'}, or keep the rows: the tombstones skip "
          f"them):")
    for f in files:
        print(f"  {f}")
    scope = ", ".join(x for x in ("video" if args.video else "", "subject" if subjects else "",
                                  "file" if args.file else "") if x)
    journal = fg.open_request(store, targets, args.reason, subjects=subjects, policy=args.policy, scope=scope)
    print(f"policy {journal['policy']}: {fg.POLICIES[journal['policy']]}")
    _forget(store, journal["request_id"])
    return 0


def _forget(store, request_id: str, note: str = "") -> str:
    """Launch the `forget` job on a journaled request (erase, check, receipt; then the refit it calls for, through
    both gates, and the check after it) and print what it did."""
    from splavu_core import forget as fg

    r = _runner()
    print(f"erasure request {request_id}{f' ({note})' if note else ''}: the `forget` job", flush=True)
    out = r.run_forget(r.instance(), r.StoreResource(root=str(store.root)), request_id)
    summary = out.get("forget_request", {}).get("summary", {})
    if "forget_request" in out:
        md = out["forget_request"]
        for layer, t in md["layers"].items():
            print(f"  {layer:15s} {t['items']:4d} item(s)  rows removed {t['rows_removed']:7d}  files removed "
                  f"{t['files_removed']:4d}  bytes rewritten {t['bytes_written']:10d}")
        print(f"  {md['fitted']}")
        print(f"  check: {md['check']}")
        if summary["refit_config"] is not None:
            print("refitting the adapter without them (it was the current version and was fitted on them)")
    if "aam_model" in out:
        print(f"  {train_line(out['aam_model'])}")
    refit = out.get("forget_refit", {})
    if refit.get("refit") == "done":
        version = refit["version"]
        print(f"  {publish_summary({'version': version, 'shards': refit['shards']})}")
        for line in gate_lines(store, version):
            print(f"  {line}")
        if not refit["current"]:
            print(f"  {fg.not_current_line(version, refit['why'], summary.get('policy', 'retire'))}")
        print(f"  check after the refit: {refit['check']}")
    if "error" in out:
        expected, message = out["error"]
        raise (StoreError if expected else RuntimeError)(message)
    return request_id


def cmd_fail_run(args) -> int:
    r = _runner()
    inst = r.instance()
    run = inst.get_run_by_id(args.run_id)
    if run is None:
        raise StoreError(f"no run {args.run_id!r} in the Dagster instance at {inst.root_directory}")
    r.fail_run(inst, run, "by hand (`splavu fail-run`)", log=print)
    return 0


def build_parser() -> argparse.ArgumentParser:
    """The `splavu` command line (docs/cli.md is generated from it: docs/gen_reference.py)."""
    ap = argparse.ArgumentParser(prog="splavu", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--store", help="store root (default $SPLAVU_STORE or ./store)")
    # every subcommand takes --store too (`splavu sql --store X ...`); SUPPRESS keeps the one given before it otherwise
    store_opt = argparse.ArgumentParser(add_help=False)
    store_opt.add_argument("--store", default=argparse.SUPPRESS, help="store root (default $SPLAVU_STORE or ./store)")
    sub = ap.add_subparsers(dest="cmd", required=True)

    def add(name: str, **kw) -> argparse.ArgumentParser:
        return sub.add_parser(name, parents=[store_opt], **kw)

    p = add("synth", help="generate the synthetic benchmark")
    p.add_argument("--scale", default="demo", choices=["tiny", "demo", "large"])
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", required=True)
    p.add_argument("--workers", type=int)
    p.add_argument("--datasets", nargs="*")
    p.add_argument("--benchmark", default=DEFAULT_BENCHMARK, choices=sorted(BENCHMARKS),
                   help="v3 (default): v2 plus test videos of the bias sets' shortcut action; v2: adds hand-object "
                        "interaction actions; v1: motion-only actions")
    p.add_argument("--quiet", action="store_true")
    p.set_defaults(fn=cmd_synth)

    p = add("ingest", help="register a dataset (folder + manifest) and its shards")
    p.add_argument("name")
    p.add_argument("manifest")
    p.add_argument("--shard-size", type=int, default=256)
    p.add_argument("--roles", help="tasks the dataset serves, comma-separated: ar (action), tad (segments), ad "
                                   "(anomaly), privacy (attr_*), bias_f / bias_m (action, group), gait (subject_id); "
                                   "default: the dataset's name when it is one of these")
    p.add_argument("--allow-forgotten", action="store_true",
                   help="re-admit videos erased by `splavu forget` that this manifest lists (logged in the erasure log)")
    p.set_defaults(fn=cmd_ingest)

    p = add("extract", help="extract raw latents of registered datasets")
    p.add_argument("--dataset", nargs="*")
    p.add_argument("--checkpoint", help="VideoMAE / V-JEPA 2 directory or hub id (default: the demo encoder)")
    p.add_argument("--quantize", choices=QUANTIZE, help="int8: the encoder's linear layers in int8 on CPU (1.4-1.5x "
                   "faster, cosine to fp32 >= 0.998; another encoder fingerprint, so not mixed with fp32 latents)")
    p.set_defaults(fn=cmd_extract)

    p = add("train", help="train an AAM from the store's cached latents (Dagster run)")
    p.add_argument("--config", help="JSON of AAMTrainingConfig fields, e.g. '{\"keep\": 11}' (the default closed-form "
                                    "keep fit reads keep, recentre and the dataset fields; epochs, w_lc and the other "
                                    "loop fields only with a trained adapter: docs/configuration.md)")
    p.add_argument("--tasks", help="utility tasks to co-train, e.g. ar,tad (default: every task with labelled data)")
    p.set_defaults(fn=cmd_train)

    p = add("publish", help="anonymize every shard with an AAM version and rebuild the catalog")
    p.add_argument("--version", help="AAM version (default: the newest)")
    p.set_defaults(fn=cmd_publish)

    p = add("evaluate", help="score raw vs anonymized features; write reports/privacy_utility.*")
    p.add_argument("--version", help="AAM version (default: the current one)")
    p.add_argument("--seed", type=int, default=0, help="base probe seed: every probe runs with seeds N .. N+4")
    p.set_defaults(fn=cmd_evaluate)

    p = add("promote", help="make an AAM version current; one the gates refused only with --force --reason")
    p.add_argument("version")
    p.add_argument("--force", action="store_true", help="promote a version that failed a gate (needs --reason)")
    p.add_argument("--reason", help="why (kept in the version ledger and shown in the aam_versions table)")
    p.set_defaults(fn=cmd_promote)

    p = add("rollback", help="make the previously current AAM version current again")
    p.add_argument("--reason", help="why (kept in the ledger log)")
    p.set_defaults(fn=cmd_rollback)

    p = add("curve", help="score the publish rule's candidates on the selection split; say which it picks and why "
                          "(nothing is fitted or published)")
    p.add_argument("--config", help="JSON of AAMTrainingConfig fields the candidates start from (as `train --config`)")
    p.set_defaults(fn=cmd_curve)

    p = add("ablations", help="train and score the ablation variants; write reports/ablations.*")
    p.add_argument("--variants", nargs="*")
    p.add_argument("--epochs", type=int)
    p.set_defaults(fn=cmd_ablations)

    p = add("baselines", help="pixel-space baselines (blur, blacken, 2x/4x downsampling) through the same "
                                         "encoder and evaluation; adds their rows and costs to the report")
    p.add_argument("--only", nargs="*", help="baselines to run (default: all of blur blacken down2 down4)")
    p.add_argument("--masks", default="none", choices=["none", "rendered", "hog"],
                   help="person masks for blur/blacken: the synthetic renderer's (rendered) or OpenCV HOG (hog); "
                        "none skips them")
    p.add_argument("--dataset", nargs="*", help="datasets to re-extract (default: every evaluation dataset)")
    p.add_argument("--checkpoint", help="the raw store's encoder (default: the demo encoder)")
    p.add_argument("--no-evaluate", action="store_true", help="extract only")
    p.add_argument("--version", help="AAM version to score them beside (default: the current one)")
    p.set_defaults(fn=cmd_baselines)

    p = add("demo", help="run the pipeline on the embedded synthetic benchmark")
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
    p.set_defaults(fn=cmd_demo)

    p = add("sql", help="run a read-only SQL query on the catalog (catalog.duckdb)")
    p.add_argument("query", help='e.g. "SELECT split, count(*) FROM clips GROUP BY split"')
    p.add_argument("--format", default="table", choices=["table", "csv", "json"])
    p.set_defaults(fn=cmd_sql)

    p = add("neighbors", help="nearest clips to a video in the current anonymized table")
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
    p.set_defaults(fn=cmd_neighbors)

    p = add("forget", help="erase videos (or every video of a subject) from every layer of the store and refit the "
                           "adapter without them; the receipt goes to the erasure log (`erasures` view)")
    p.add_argument("--video", nargs="+", metavar="ID", help="video ids to erase")
    p.add_argument("--subject", nargs="+", metavar="ID", help="erase every video whose manifest row has this subject_id")
    p.add_argument("--file", metavar="F", help="a file of video ids, one a line")
    p.add_argument("--reason", help="why (required; kept in the erasure log: do not name the person)")
    p.add_argument("--policy", choices=("retire", "serve_until_refit"),
                   help="what serves until the refit passes both gates: 'retire' the versions fitted on these videos "
                        "now, or 'serve_until_refit' (the current version, their rows removed, retired once a version "
                        "fitted without them is current); default $SPLAVU_ERASURE_POLICY (retire)")
    p.set_defaults(fn=cmd_forget)

    p = add("fail-run", help="mark a run whose process is gone failed and free its pool slots "
                                        "(runs of this host are found and failed automatically)")
    p.add_argument("run_id")
    p.set_defaults(fn=cmd_fail_run)
    return ap


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    try:
        if args.cmd not in CREATES_STORE:
            _require_store(_store_root(args))
        rc = args.fn(args)
    except Exception as e:
        known = _expected_error(e)
        if known is None:
            if settings().traceback:
                raise
            # a bug, still one line: what broke (inside Dagster's wrapping) and how to see the rest
            cause = _innermost(e)
            print(f"splavu: error: unexpected {type(cause).__name__}: {_one_line(cause)} (a bug in splavu; "
                  f"SPLAVU_TRACEBACK=1 prints the traceback)", file=sys.stderr)
            return 1
        print(f"splavu: error: {_one_line(known)}", file=sys.stderr)
        return 2
    if "pipeline.runner" in sys.modules and (note := sys.modules["pipeline.runner"].instance_note()):
        print(note, file=sys.stderr)  # where the runs went, once per instance folder the CLI chose itself
    return rc


CREATES_STORE = ("synth", "ingest", "demo", "fail-run")  # every other command reads an existing store (fail-run: none)


def _require_store(root: str) -> None:
    if not FeatureStore(root).files.isdir(""):
        raise StoreError(f"no store at {root}: register a dataset first (splavu ingest NAME MANIFEST), "
                         f"or point --store / $SPLAVU_STORE at an existing store")


def _expected_error(e: BaseException) -> BaseException | None:
    """The user-facing error inside `e` (Dagster wraps what an asset raised), or None for a bug."""
    expected = [ManifestError, StoreError, PixelError, BenchmarkMismatch, ExtractError]
    # these two are raised only by code that imported their module: recognised without importing it (seconds)
    if "splavu_core.aam.training_data" in sys.modules:
        expected.append(sys.modules["splavu_core.aam.training_data"].TrainingDataError)
    if "dagster" in sys.modules:
        expected.append(sys.modules["dagster"].Failure)
    seen = set()
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        if isinstance(e, tuple(expected)):
            return e
        e = getattr(e, "user_exception", None) or e.__cause__
    return None


def _innermost(e: BaseException) -> BaseException:
    """What was raised first under Dagster's wrapping (user_exception) and `raise ... from` chains."""
    seen = {id(e)}
    while (inner := getattr(e, "user_exception", None) or e.__cause__) is not None and id(inner) not in seen:
        seen.add(id(inner))
        e = inner
    return e


def _one_line(e: BaseException) -> str:
    if isinstance(e, ManifestError):
        return str(e)  # one problem per line, each with its row and column
    text = e.description if hasattr(e, "description") and e.description else str(e)
    return "; ".join(part.strip() for part in str(text).splitlines() if part.strip())


if __name__ == "__main__":
    sys.exit(main())
