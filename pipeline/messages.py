"""What `splavu` prints: the lines each command writes from what its workflow returned, and an error as one line.

Plain functions of plain values (metadata values, run results, store records), so the CLI only parses and prints and
each line can be tested without running a command. Importing this module loads neither Dagster nor torch.
"""
from __future__ import annotations

import json
import sys

from splavu_core.extract.decode import ExtractError
from splavu_core.ingest.manifest import ManifestError
from splavu_core.ingest.masks import PixelError
from splavu_core.ingest.synth.datasets import BenchmarkMismatch
from splavu_core.store.feature_store import StoreError
from splavu_core.store.ledger import read_verdicts, refused_versions

# ---------------------------------------------------------------- synth, extract

def synth_lines(summary: dict, benchmark: str, scale: str, seed: int, out: str, seconds: float) -> list[str]:
    """The benchmark written: one row per dataset."""
    return [f"synthetic benchmark {benchmark} ({scale}, seed {seed}) in {out}  [{seconds:.0f} s]",
            f"{'dataset':10s} {'videos':>7s} {'clips':>7s} {'frames':>8s}  splits",
            *(f"{name:10s} {s['videos']:7d} {s['clips']:7d} {s['frames']:8d}  {json.dumps(s['splits'])}"
              for name, s in summary.items())]


def extract_line(row: dict) -> str:
    """One extracted shard (runner.extract_shards' row); clips/s counts every clip encoded, static ones included."""
    speed = "(already extracted)" if row["skipped"] else f"{row['clips_per_s']:.0f} clips/s"
    return (f"  {row['shard']:14s} videos {row['videos']:5d}  clips {row['clips']:6d} + static "
            f"{row['static_clips']:5d}  quarantined {row['quarantined']:3d}  {speed}")


def extracted_line(rows: list[dict], seconds: float) -> str:
    """The demo's extraction, all shards together."""
    return (f"  {sum(x['clips'] for x in rows)} clip latents + {sum(x['static_clips'] for x in rows)} static, "
            f"{sum(x['quarantined'] for x in rows)} quarantined [{seconds:.0f} s]")


# ---------------------------------------------------------------- the demo's own lines

def demo_start_lines(names, left_out: dict[str, str]) -> list[str]:
    return [f"1/6 synthesising the benchmark: {', '.join(names)} (only videos not already there)",
            *(f"  not in this demo: {group} ({why})" for group, why in left_out.items())]


def demo_end_lines(sql: str, table: str, stages: dict, seconds: float) -> list[str]:
    """The analyst's query and its answer, the stages' wall times, the total."""
    return ["6/6 an analyst's query (read-only DuckDB catalog):", f"  splavu sql \"{sql}\"", table,
            "\nstages (wall s): " + ", ".join(f"{k} {'—' if v is None else f'{v:.0f}'}" for k, v in stages.items()),
            f"done in {seconds:.0f} s; `splavu sql`, `splavu neighbors`, `dagster dev` to explore"]


# ---------------------------------------------------------------- train

def train_lines(md: dict, table: bool = False) -> list[str]:
    """A fit of aam_model (its metadata values): the publish rule's choice (with its candidates when `table`), what
    was fitted, and what a fresh critic still matches."""
    out = []
    if table and "operating_point_candidates" in md:
        out.append("  the publish rule's candidates on the selection split:")
        out += [f"  {line}" for line in md["operating_point_candidates"].splitlines()]
    out.append(f"  operating point: {md.get('operating_point_why', md['operating_point'])}")
    out.append(f"  {train_line(md)}")
    if "pair_matching_chance" in md:
        out.append(f"  {pair_matching_line(md)}")
    return out


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


def curve_lines(md: dict, checks: list[dict]) -> list[str]:
    """The choose_operating_point run (runner.run_curve): the candidates, the pick and why, its check, the record."""
    out = [md["operating_point_candidates"]] if "operating_point_candidates" in md else []
    out.append(f"operating point: {md.get('operating_point_why', md['operating_point'])}")
    out += [f"check {c['name']} {'passed' if c['passed'] else 'warns'}: {c['description']}" for c in checks]
    return out + [f"record: {md['path']} (+ .png); {md['seconds']:.0f} s"]


# ---------------------------------------------------------------- publish, gates, evaluate

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


def promoted_line(version: str, before: str | None, gates: tuple[bool, str], reason: str | None) -> str:
    """`splavu promote`: the version now current, past the gates or forced past them (gates: ledger.gates_passed)."""
    ok, why = gates
    how = "passed both gates" if ok else f"FORCED past the gates ({why}); reason: {reason}"
    return f"AAM version {version} is now current (was {before or 'none'}): {how}"


def retired_line(version: str) -> str:
    """A version served under erasure policy serve_until_refit, retired now that one fitted without them is current."""
    return (f"AAM version {version} retired: it was fitted on erased videos and served (policy serve_until_refit) "
            f"until a version fitted without them became current")


def version_state(store, version: str, current: str | None) -> str:
    """Whether the version scored is the current one, and if not, which is and why it was refused."""
    if version == current:
        return "the current version"
    refused = refused_versions(store).get(version)
    return f"NOT current (current: {current or 'none'}){'; refused: ' + refused['why'] if refused else ''}"


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


# ---------------------------------------------------------------- forget

def forget_lines(event: tuple, store) -> list[str]:
    """One step of `splavu forget` (runner.forget's events): a request run by the `forget` job and what it did, the
    videos erased before, the user's own files (splavu does not touch them), the request's policy."""
    from splavu_core import forget as fg  # here: it loads torch, which the other commands' lines never need

    kind, *values = event
    if kind == "request":
        request_id, note = values
        return [f"erasure request {request_id}{f' ({note})' if note else ''}: the `forget` job"]
    if kind == "ran":
        return _run_lines(values[0], store, fg.not_current_line)
    if kind == "nothing else":
        return ["nothing else to erase: the request above was this one"]
    if kind == "already":
        return [f"video {values[0]!r} was erased already (it has a tombstone)"]
    if kind == "erasing":
        targets, files, manifests = values
        return [f"erasing {len(targets)} video(s) from {store.root}. Your own files are not touched; delete them "
                f"yourself (and their rows in {', '.join(manifests) or 'your manifests'}, or keep the rows: the "
                f"tombstones skip them):", *(f"  {f}" for f in files)]
    return [f"policy {values[0]}: {fg.POLICIES[values[0]]}"]


def _run_lines(out: dict, store, not_current_line) -> list[str]:
    """What a `forget` run did (runner.run_forget's values): rows and files removed per layer, the check, then the
    refit, its publish and gates, and the check after it."""
    lines = []
    summary = out.get("forget_request", {}).get("summary", {})
    if "forget_request" in out:
        md = out["forget_request"]
        lines += [f"  {layer:15s} {t['items']:4d} item(s)  rows removed {t['rows_removed']:7d}  files removed "
                  f"{t['files_removed']:4d}  bytes rewritten {t['bytes_written']:10d}" for layer, t in md["layers"].items()]
        lines += [f"  {md['fitted']}", f"  check: {md['check']}"]
        if summary["refit_config"] is not None:
            lines.append("refitting the adapter without them (it was the current version and was fitted on them)")
    if "aam_model" in out:
        lines.append(f"  {train_line(out['aam_model'])}")
    refit = out.get("forget_refit", {})
    if refit.get("refit") == "done":
        version = refit["version"]
        lines.append(f"  {publish_summary({'version': version, 'shards': refit['shards']})}")
        lines += [f"  {line}" for line in gate_lines(store, version)]
        if not refit["current"]:
            lines.append(f"  {not_current_line(version, refit['why'], summary.get('policy', 'retire'))}")
        lines.append(f"  check after the refit: {refit['check']}")
    return lines


# ---------------------------------------------------------------- errors

def error_line(e: BaseException) -> tuple[int, str]:
    """(exit code, the one line on stderr): 2 and the message for an expected error (a bad manifest, a missing store,
    a refused request, ...); 1 and what broke, inside Dagster's wrapping, for anything else (a bug)."""
    known = _expected_error(e)
    if known is not None:
        return 2, f"splavu: error: {_one_line(known)}"
    cause = _innermost(e)
    return 1, (f"splavu: error: unexpected {type(cause).__name__}: {_one_line(cause)} (a bug in splavu; "
               f"SPLAVU_TRACEBACK=1 prints the traceback)")


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
