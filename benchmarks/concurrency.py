"""Analysts querying while the store changes under them (prints JSON): N reader processes run `splavu sql` and
`splavu neighbors` in a loop for M seconds during each of three operations on a small store.

    python benchmarks/concurrency.py --store STORE [--readers 3] [--seconds 20] [--keep-gates]
    python benchmarks/concurrency.py --tiny [--readers 3] [--seconds 20]      # builds a tiny store first

STORE is copied to a temporary folder first (it is never written); it needs extracted latents of an `ar` dataset
with subject ids (`make demo`'s store, or --tiny: the tiny synthetic benchmark through a tiny random VideoMAE, as
the test suite builds it). Setup, untimed: AAM v1 trained and published (current), v2 trained (another keep width).
Then, each with the readers running:

    reanonymize   `splavu publish --version v2`: every shard published, both gates, v2 promoted, catalog rebuilt
    promote       `splavu promote v1 --force --reason ...`: v1 current again, catalog rebuilt
    forget        `splavu forget --subject S` of a training subject: v1 and v2 retired, the refit published through
                  both gates, checked, receipted

Unless --keep-gates, both gates are set to let any version through (SPLAVU_PRIVACY_BUDGET / SPLAVU_UTILITY_GATE =
-1): on a tiny random encoder no version could pass, and this measures the mechanics, not the anonymizer.

Each reader runs, in turn, (1) `splavu sql` over anonymized_features: rows, shards and AAM versions seen, rows of
the erased subject's videos; (2) `splavu sql` over anonymized_features_all, clips and videos: rows of the erased
videos; (3) `splavu neighbors` of a video that stays: erased videos among its neighbours. It calls the CLI's main()
in-process (no interpreter start per query) with the CLI's own output and exit status. Per operation the JSON has:

    queries              by command
    retried_silently     queries the store changed under once, answered on the retry (no message)
    errors               by kind: retry_message (the one-line "the store changed while this query ran" after the
                         one retry), no_current_version (neighbors while the refit is not yet current: an answer,
                         one line), raw (anything else: a DuckDB or Python error text, an unexpected error)
    multiline_errors     error outputs longer than one line
    half_published       answers of anonymized_features missing shards of the version they show
    mixed_versions       answers of anonymized_features with more than one AAM version
    stale_after          queries started after the operation returned that still showed the version before it
    erased_seen_during   answers holding an erased video's rows while `forget` ran (allowed: not yet erased)
    erased_seen_after    answers holding one after `forget` returned (must be 0)
"""
from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

RETRY = "the store changed while this"
NO_CURRENT = "no AAM version is current"


# ---------------------------------------------------------------- one reader process

def reader(args: dict) -> None:
    """Query until the stop file appears; one JSON line per query on stdout."""
    from pipeline.cli import main
    from splavu_core.serve import analyst, neighbors

    store, erased, video = args["store"], args["erased"], args["video"]
    ids = ", ".join("'" + v.replace("'", "''") + "'" for v in erased)
    current = ("SELECT aam_version, count(*) AS n, count(DISTINCT shard) AS shards, "
               f"count(*) FILTER (WHERE video_id IN ({ids})) AS erased FROM anonymized_features GROUP BY ALL")
    others = (f"SELECT (SELECT count(*) FROM anonymized_features_all WHERE video_id IN ({ids})) "
              f"+ (SELECT count(*) FROM clips WHERE video_id IN ({ids})) "
              f"+ (SELECT count(*) FROM videos WHERE video_id IN ({ids})) AS erased")
    commands = [("sql", ["sql", current, "--format", "json"]), ("sql", ["sql", others, "--format", "json"]),
                ("neighbors", ["neighbors", video, "--k", "5", "--format", "json"])]
    print("ready", flush=True)
    i = 0
    while not os.path.exists(args["stop"]):
        kind, argv = commands[i % len(commands)]
        i += 1
        out, err = io.StringIO(), io.StringIO()
        retried = retries(analyst, neighbors)
        t0 = time.time()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                rc = main(["--store", store, *argv])
            except BaseException as e:  # noqa: BLE001  (a crash is a result here)
                rc, _ = 99, err.write(f"{type(e).__name__}: {e}\n")
        row = {"cmd": kind, "q": (i - 1) % len(commands), "t0": t0, "t1": time.time(), "rc": rc,
               "err": err.getvalue() if rc else "",
               "retried": retries(analyst, neighbors) - retried}
        if rc == 0:
            try:
                row["out"] = json.loads(out.getvalue() or "[]")
            except json.JSONDecodeError:
                row["out"], row["rc"], row["err"] = None, 98, f"unparsable output: {out.getvalue()[:200]}"
        print(json.dumps(row), flush=True)
        time.sleep(args["pause"])


def retries(*modules) -> int:
    """Retries the serving modules made in this process so far (0 for a checkout without the counters)."""
    return sum(sum(getattr(m, "RETRIED", {}).values()) for m in modules)


# ---------------------------------------------------------------- the parent

def cli(*argv) -> str:
    """The CLI in this process; its output goes to stderr (stdout is the JSON). Returns what it printed."""
    from pipeline.cli import main

    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        rc = main(list(argv))
    sys.stderr.write(buf.getvalue())
    if rc != 0:
        raise SystemExit(f"splavu {' '.join(argv[:3])} ... failed with {rc}")
    return buf.getvalue()


def build_tiny(root: Path) -> None:
    """The tiny synthetic benchmark through a tiny random VideoMAE, ingested and extracted (as tests/conftest.py)."""
    import torch
    from transformers import VideoMAEConfig, VideoMAEModel

    from splavu_core.ingest.synth.datasets import generate

    bench, ckpt = root / "bench", root / "videomae"
    generate(bench, "tiny", seed=0, workers=2, benchmark="v1")
    torch.manual_seed(0)
    VideoMAEModel(VideoMAEConfig(image_size=32, patch_size=16, num_frames=16, tubelet_size=4, hidden_size=32,
                                 num_hidden_layers=1, num_attention_heads=2, intermediate_size=64,
                                 use_mean_pooling=False)).save_pretrained(ckpt)
    (ckpt / "preprocessor_config.json").write_text(json.dumps({
        "do_resize": True, "size": {"shortest_edge": 32}, "do_center_crop": True,
        "crop_size": {"height": 32, "width": 32}, "do_rescale": True, "rescale_factor": 1 / 255,
        "do_normalize": True, "image_mean": [0.5] * 3, "image_std": [0.5] * 3}))
    for name in ("ar", "tad", "ad", "privacy"):
        cli("--store", str(root / "store"), "ingest", name, str(bench / name / "manifest.csv"), "--shard-size", "64")
    cli("--store", str(root / "store"), "extract", "--checkpoint", str(ckpt))


def subject_and_video(store) -> tuple[str, list[str], str]:
    """A training subject of the `ar` dataset (its videos, in every dataset), and a video of another that stays."""
    rows = [r for s in store.committed_shards() for r in store.read_shard_manifest(s).to_pylist()]
    ar_train = [r for r in rows if r["video_id"].startswith("ar_") and r["split"] == "train" and r.get("subject_id")]
    subject = str(ar_train[0]["subject_id"])
    erased = sorted({r["video_id"] for r in rows if str(r.get("subject_id")) == subject})
    stays = next(r["video_id"] for r in ar_train if r["video_id"] not in erased)
    return subject, erased, stays


def expected_shards(store, version: str) -> int:
    from splavu_core.publish.anonymized_tables import published_rows

    return sum(1 for s in store.committed_shards() if (published_rows(store, version, s) or 0) > 0)


def run_operation(name: str, op, store, n: int, seconds: float, erased: list[str], video: str, work: Path,
                  pause: float = 0.0) -> dict:
    from splavu_core.store.ledger import current_version

    stop = work / f"stop-{name}"
    before = current_version(store)
    spec = json.dumps({"store": str(store.root), "erased": erased, "video": video, "stop": str(stop), "pause": pause})
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    procs = [subprocess.Popen([sys.executable, __file__, "--reader", spec], stdout=subprocess.PIPE, text=True,
                              env=env, cwd=work) for _ in range(n)]
    for p in procs:
        assert p.stdout.readline().strip() == "ready", "a reader did not start"
    time.sleep(min(1.0, seconds / 4))  # readers in their loop before the operation starts
    t_start = time.time()
    op()
    t_end = time.time()
    after = current_version(store)
    shards = {v: expected_shards(store, v) for v in {before, after} if v}
    time.sleep(max(0.0, t_start + seconds - time.time(), 1.0))  # and a while after it returned
    stop.write_text("stop")
    rows = [json.loads(line) for p in procs for line in p.communicate(timeout=120)[0].splitlines() if line.strip()]
    return {"seconds": round(t_end - t_start, 2), "version_before": before, "version_after": after,
            **tally(rows, t_start, t_end, before, after, shards, set(erased) if name == "forget" else set())}


def tally(rows: list[dict], t_start: float, t_end: float, before, after, shards: dict, erased: set) -> dict:
    out = {"queries": {}, "retried_silently": 0, "errors": {"retry_message": 0, "no_current_version": 0, "raw": 0},
           "multiline_errors": 0,
           "half_published": 0, "mixed_versions": 0, "stale_after": 0, "erased_seen_during": 0, "erased_seen_after": 0,
           "raw_examples": [], "retry_examples": [], "max_query_s": 0.0}
    for r in rows:
        out["queries"][r["cmd"]] = out["queries"].get(r["cmd"], 0) + 1
        out["max_query_s"] = max(out["max_query_s"], round(r["t1"] - r["t0"], 3))
        started_after = r["t0"] > t_end
        out["retried_silently"] += bool(r["retried"]) and r["rc"] == 0
        if r["rc"] != 0:
            err = r["err"].strip()
            if err.count("\n"):
                out["multiline_errors"] += 1
            kind = "retry_message" if RETRY in err else "no_current_version" if NO_CURRENT in err else "raw"
            out["errors"][kind] += 1
            if kind != "no_current_version" and len(out[f"{kind.split('_')[0]}_examples"]) < 3:
                out[f"{kind.split('_')[0]}_examples"].append(err[:400])
            if kind == "no_current_version" and started_after and after:
                out["stale_after"] += 1  # a version is current by now
            continue
        res = r["out"]
        hit = 0
        if r["cmd"] == "neighbors":
            hit = sum(1 for x in res if x["video_id"] in erased)
        elif r["q"] == 0:
            versions = {x["aam_version"]: x for x in res}
            hit = sum(x["erased"] for x in res)
            if len(versions) > 1:
                out["mixed_versions"] += 1
            for v, x in versions.items():
                if v in shards and x["shards"] < shards[v]:
                    out["half_published"] += 1
            if started_after and set(versions) != ({after} if after else set()):
                out["stale_after"] += 1
        else:
            hit = res[0]["erased"] if res else 0
        if erased and hit:
            out["erased_seen_after" if started_after else "erased_seen_during"] += 1
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--store", help="a store with extracted latents (copied first; never written)")
    ap.add_argument("--tiny", action="store_true", help="build a tiny store first instead")
    ap.add_argument("--readers", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=20.0, help="per operation, at least (readers run until the "
                                                                 "operation returned and a second more)")
    ap.add_argument("--pause", type=float, default=0.0, help="seconds a reader waits between its queries (0: none)")
    ap.add_argument("--ops", default="reanonymize,promote,forget", help="operations to run, in this order")
    ap.add_argument("--keep-gates", action="store_true", help="leave SPLAVU_PRIVACY_BUDGET / SPLAVU_UTILITY_GATE as set")
    ap.add_argument("--config", default='{"tasks": ["ar"]}', help="v1's training config (JSON); v2: the same with "
                                                                  "another keep width")
    ap.add_argument("--reader", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.reader:
        return reader(json.loads(a.reader))
    if not (a.store or a.tiny):
        ap.error("--store STORE or --tiny")
    work = Path(tempfile.mkdtemp(prefix="splavu-concurrency-"))
    os.environ["DAGSTER_HOME"] = str(work / "dagster_home")
    Path(os.environ["DAGSTER_HOME"]).mkdir()
    shutil.copy(REPO / "dagster.yaml", os.environ["DAGSTER_HOME"])
    if not a.keep_gates:
        os.environ["SPLAVU_PRIVACY_BUDGET"] = os.environ["SPLAVU_UTILITY_GATE"] = "-1"
    try:
        t0 = time.time()
        if a.tiny:
            build_tiny(work)
        else:
            shutil.copytree(a.store, work / "store", ignore=shutil.ignore_patterns("catalog.duckdb*", ".catalog.*"))
        from splavu_core.store.feature_store import FeatureStore

        root = str(work / "store")
        store = FeatureStore(root)
        config = json.loads(a.config)
        cli("--store", root, "train", "--config", json.dumps(config))
        cli("--store", root, "publish")
        from splavu_core.store.ledger import current_version, newest_version

        v1 = current_version(store)
        assert v1, "v1 did not become current: run with the gates lowered (the default) or a store where it passes"
        cli("--store", root, "train", "--config", json.dumps({**config, "keep": int(config.get("keep", 11)) - 3,
                                                             "operating_point": "as_given"}))  # another version
        v2 = newest_version(store)
        assert v2 != v1
        subject, erased, video = subject_and_video(store)
        setup_s = time.time() - t0
        ops = {"reanonymize": lambda: cli("--store", root, "publish", "--version", v2),
               "promote": lambda: cli("--store", root, "promote", v1, "--force", "--reason", "load test"),
               "forget": lambda: cli("--store", root, "forget", "--subject", subject, "--reason", "load test")}
        unknown = set(a.ops.split(",")) - set(ops)
        if unknown:
            ap.error(f"--ops: unknown {sorted(unknown)}; choose from {', '.join(ops)}")
        results = {name: run_operation(name, ops[name], store, a.readers, a.seconds, erased, video, work, a.pause)
                   for name in a.ops.split(",")}
        totals = {"queries": sum(sum(r["queries"].values()) for r in results.values()),
                  "retried_silently": sum(r["retried_silently"] for r in results.values()),
                  **{k: sum(r["errors"][k] for r in results.values()) for k in ("retry_message", "raw",
                                                                                  "no_current_version")},
                  **{k: sum(r[k] for r in results.values()) for k in ("multiline_errors", "half_published",
                                                                       "mixed_versions", "stale_after",
                                                                       "erased_seen_after", "erased_seen_during")}}
        print(json.dumps({"readers": a.readers, "seconds": a.seconds, "pause": a.pause, "store": "tiny" if a.tiny else a.store,
                          "erased_videos": len(erased), "setup_s": round(setup_s, 1), "operations": results,
                          "totals": totals, "machine": f"{platform.machine()}, {os.cpu_count()} cores"}, indent=1))
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
