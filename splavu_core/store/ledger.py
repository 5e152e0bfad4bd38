"""The AAM version ledger: which versions exist, which one is current, the gates' verdicts, refusals,
promotions (automatic or forced, with the reason) and rollbacks.

    <root>/aam_versions.parquet   one row per recorded version; at most one is_current; `promotion` says how the
                                  current/once-current version got there ("gate" or "forced: <reason>")
    <root>/aam_verdicts.json      {version: {"privacy": {passed, why, at, ...}, "utility": {...}}}: the last
                                  verdict of each gate (measured on validation splits, splavu_core.evaluation.gates)
    <root>/aam_promotions.json    {version: iso time}: versions made current once (by the gate or by hand)
    <root>/aam_refusals.json      {version: {"why", "at"}}: versions a gate kept from becoming current
    <root>/aam_ledger_log.json    [{"at", "action", "version", "previous", "reason"}]: promote / rollback history

This is a bottom-layer module: it imports only the store (no publish, no evaluation, no catalog), so publish.py,
catalog.py, neighbors.py and the CLI read verdicts here without pulling in the evaluation suite. The verdict
rules themselves (budget_verdict, utility_verdict) are pure functions on measurement dicts and live here too.
"""
from __future__ import annotations

import json
import math
from datetime import datetime, timezone

import pyarrow as pa

from splavu_core.settings import settings
from splavu_core.store.feature_store import FeatureStore, StoreError

VERSIONS_KEY = "aam_versions.parquet"
PROMOTIONS_FILE = "aam_promotions.json"  # versions made current (automatically or by hand), and when
REFUSALS_FILE = "aam_refusals.json"      # versions a gate kept from becoming current, and why
VERDICTS_FILE = "aam_verdicts.json"      # the last verdict of each gate per version
LOG_FILE = "aam_ledger_log.json"         # promotions and rollbacks, in order

VERSIONS_SCHEMA = pa.schema([("version", pa.string()), ("encoder_fingerprint", pa.string()),
                             ("config", pa.string()), ("metrics", pa.string()),
                             ("created_at", pa.timestamp("us", tz="UTC")), ("is_current", pa.bool_()),
                             ("promotion", pa.string())])



class PublishError(StoreError):
    """A version cannot be published, recorded or promoted (re-exported by splavu_core.publish.anonymized_tables)."""


def _now() -> datetime:
    return datetime.now(timezone.utc)


def versions_path(store: FeatureStore):
    return store.loc(VERSIONS_KEY)


# ---------------------------------------------------------------- the versions table

def read_versions(store: FeatureStore) -> pa.Table:
    """aam_versions.parquet as a table with VERSIONS_SCHEMA (a file written before a column existed gets nulls)."""
    if not store.files.isfile(VERSIONS_KEY):
        return VERSIONS_SCHEMA.empty_table()
    try:
        t = store.files.read_parquet(VERSIONS_KEY)
    except Exception as e:
        raise PublishError(f"{versions_path(store)}: unreadable Parquet ({e})") from e
    for f in VERSIONS_SCHEMA:
        if f.name not in t.column_names:
            t = t.append_column(f, pa.nulls(t.num_rows, f.type))
    return t.select(VERSIONS_SCHEMA.names).cast(VERSIONS_SCHEMA)


def write_versions(store: FeatureStore, rows: list[dict]) -> pa.Table:
    # at most one current; none until a version is promoted (published everywhere and through both gates)
    assert sum(bool(r["is_current"]) for r in rows) <= 1, "more than one current AAM version"
    table = pa.Table.from_pylist([{k: r.get(k) for k in VERSIONS_SCHEMA.names} for r in rows], schema=VERSIONS_SCHEMA)
    store.files.write_parquet(VERSIONS_KEY, table)
    return table


def record_version(store: FeatureStore, version: str, meta: dict, metrics: dict | None = None,
                   make_current: bool = True) -> pa.Table:
    """Add (or update) `version` in <root>/aam_versions.parquet; returns the new table.

    `meta` needs encoder_fingerprint and config (the adapter's JSON sidecar fits). Re-recording a
    version keeps its first created_at (retention orders by it) and replaces config/metrics.
    With make_current=False the version is only recorded: it becomes current when promoted."""
    fp = meta.get("encoder_fingerprint")
    if store.encoder_fingerprint() is not None and fp != store.encoder_fingerprint():
        raise PublishError(f"AAM version {version} belongs to encoder {fp!r}, but the store {store.root} holds "
                           f"latents of encoder {store.encoder_fingerprint()!r}")
    if meta.get("version") not in (None, version):
        raise PublishError(f"meta describes AAM version {meta['version']}, not {version}")
    with store.lock("aam_versions"):
        rows = read_versions(store).to_pylist()
        old = next((r for r in rows if r["version"] == version), None)
        row = {"version": version, "encoder_fingerprint": fp,
               "config": json.dumps(meta.get("config", {}), sort_keys=True),
               "metrics": json.dumps(metrics or {}, sort_keys=True, default=float),
               "created_at": old["created_at"] if old else _now(),
               "is_current": bool(old and old["is_current"]), "promotion": old["promotion"] if old else None}
        rows = [r for r in rows if r["version"] != version] + [row]
        if make_current:
            for r in rows:
                r["is_current"] = r["version"] == version
        return write_versions(store, rows)


def set_current(store: FeatureStore, version: str, promotion: str | None = None) -> None:
    """Make an already recorded version the current one (no gate here: see promote())."""
    with store.lock("aam_versions"):
        rows = read_versions(store).to_pylist()
        if version not in {r["version"] for r in rows}:
            raise PublishError(f"AAM version {version} is not recorded in {versions_path(store)}")
        for r in rows:
            r["is_current"] = r["version"] == version
            if r["version"] == version and promotion is not None:
                r["promotion"] = promotion
        write_versions(store, rows)


def current_version(store: FeatureStore) -> str | None:
    t = read_versions(store)
    cur = t.filter(t["is_current"])["version"].to_pylist()
    return cur[0] if cur else None


def newest_version(store: FeatureStore) -> str | None:
    """The most recently recorded version (by created_at), whether or not it is current."""
    rows = read_versions(store).to_pylist()
    if not rows:
        return None
    return max(enumerate(rows), key=lambda ir: (ir[1]["created_at"], ir[0]))[1]["version"]


def created_at(store: FeatureStore, version: str | None) -> datetime:
    rows = [r for r in read_versions(store).to_pylist() if r["version"] == version]
    return rows[0]["created_at"] if rows else datetime.min.replace(tzinfo=timezone.utc)


# ---------------------------------------------------------------- promotions, refusals, verdicts

def _read_json(store: FeatureStore, key: str, default):
    try:
        return store.files.read_json(key)
    except FileNotFoundError:
        return default


def promoted_versions(store: FeatureStore) -> dict[str, str]:
    return _read_json(store, PROMOTIONS_FILE, {})


def _mark_promoted(store: FeatureStore, version: str) -> None:
    done = promoted_versions(store)
    done[version] = _now().isoformat()
    store.files.write_json(PROMOTIONS_FILE, done)


def refused_versions(store: FeatureStore) -> dict[str, dict]:
    """{version: {"why", "at"}} of versions a gate refused (the last verdict of each)."""
    return _read_json(store, REFUSALS_FILE, {})


def record_refusal(store: FeatureStore, version: str, why: str) -> None:
    with store.lock("aam_refusals"):
        done = refused_versions(store)
        done[version] = {"why": why, "at": _now().isoformat()}
        store.files.write_json(REFUSALS_FILE, done)


def clear_refusal(store: FeatureStore, version: str) -> None:
    with store.lock("aam_refusals"):
        done = refused_versions(store)
        if done.pop(version, None) is not None:
            store.files.write_json(REFUSALS_FILE, done)


def read_verdicts(store: FeatureStore, version: str | None = None) -> dict:
    """All recorded gate verdicts {version: {gate: {...}}}, or those of one version ({} when none)."""
    v = _read_json(store, VERDICTS_FILE, {})
    return v if version is None else v.get(version, {})


def record_verdict(store: FeatureStore, version: str, gate: str, passed: bool, why: str, **extra) -> dict:
    """Record the verdict of `gate` ('privacy' | 'utility') on `version`; returns it."""
    verdict = {"passed": bool(passed), "why": why, "at": _now().isoformat(), **extra}
    with store.lock("aam_verdicts"):
        allv = read_verdicts(store)
        allv.setdefault(version, {})[gate] = json.loads(json.dumps(verdict, default=float))
        store.files.write_json(VERDICTS_FILE, allv)
    return verdict


def approved_versions(store: FeatureStore) -> list[str]:
    """Versions analysts may read: the current one and every one made current before.
    A version never promoted (refused by a gate, or still rolling out) stays out of the catalog."""
    cur = current_version(store)
    return sorted(set(promoted_versions(store)) | ({cur} if cur else set()))


def ledger_log(store: FeatureStore) -> list[dict]:
    return _read_json(store, LOG_FILE, [])


def _log(store: FeatureStore, action: str, version: str, previous: str | None, reason: str) -> None:
    log = ledger_log(store)
    log.append({"at": _now().isoformat(), "action": action, "version": version, "previous": previous,
                "reason": reason})
    store.files.write_json(LOG_FILE, log)


def gates_passed(store: FeatureStore, version: str) -> tuple[bool, str]:
    """Did both recorded gates pass for `version`? (False with the reasons when one failed or was never run.)"""
    v = read_verdicts(store, version)
    missing = [g for g in ("privacy", "utility") if g not in v]
    failed = [f"{g}: {v[g]['why']}" for g in ("privacy", "utility") if g in v and not v[g]["passed"]]
    if failed:
        return False, "; ".join(failed)
    if missing:
        return False, f"gate(s) {missing} not run on version {version}"
    return True, f"privacy: {v['privacy']['why']}; utility: {v['utility']['why']}"


def promote(store: FeatureStore, version: str, *, force: bool = False, reason: str = "",
            require_verdicts: bool = True) -> str:
    """Make `version` current by hand. A version whose recorded verdicts do not both pass is promoted only with
    force=True and a non-empty reason; the reason is kept in aam_versions.promotion and in the ledger log.
    Returns the previous current version's id ('' when none). Raises PublishError."""
    recorded = read_versions(store)["version"].to_pylist()
    if version not in recorded:
        raise PublishError(f"AAM version {version!r} is not recorded in {versions_path(store)} "
                           f"(known: {recorded or 'none'})")
    if version in retired_versions(store):
        raise PublishError(f"AAM version {version} was retired: it was fitted on videos erased by `splavu forget` "
                           f"({refused_versions(store).get(version, {}).get('why', 'see aam_ledger_log.json')})")
    ok, why = gates_passed(store, version) if require_verdicts else (True, "verdicts not required")
    if not ok and not force:
        raise PublishError(f"version {version} did not pass the gates ({why}); promote it anyway only with "
                           f"--force --reason TEXT")
    if force and not ok and not reason.strip():
        raise PublishError("a forced promotion needs --reason TEXT (kept in the version ledger)")
    with store.lock("aam_promotions"):
        prev = current_version(store)
        label = "gate" if ok else f"forced: {reason.strip()}"
        set_current(store, version, promotion=label)
        _mark_promoted(store, version)
        _log(store, "promote" if ok else "force-promote", version, prev, reason.strip() or why)
    return prev or ""


def rollback(store: FeatureStore, reason: str = "") -> tuple[str, str]:
    """Make the version that was current before the present one current again (from the ledger log, else the
    newest other version that was ever promoted). Returns (from, to). Raises PublishError when there is none."""
    cur = current_version(store)
    if cur is None:
        raise PublishError("no AAM version is current: nothing to roll back")
    candidates = [e["previous"] for e in reversed(ledger_log(store))
                  if e["version"] == cur and e["action"] in ("promote", "force-promote", "auto-promote")
                  and e.get("previous")]
    promoted = promoted_versions(store)
    if not candidates:
        others = sorted((p for p in promoted if p != cur), key=lambda p: promoted[p], reverse=True)
        candidates = others
    recorded = set(read_versions(store)["version"].to_pylist()) - retired_versions(store)
    target = next((c for c in candidates if c in recorded and c != cur), None)
    if target is None:
        raise PublishError(f"version {cur} is current and no earlier version was ever current: nothing to roll back to")
    with store.lock("aam_promotions"):
        set_current(store, target)
        _log(store, "rollback", target, cur, reason or f"rolled back from {cur}")
    return cur, target


def retired_versions(store: FeatureStore) -> set[str]:
    """Versions retired for good (fitted on erased videos, forget.py): never current again."""
    return {e["version"] for e in ledger_log(store) if e["action"] == "retire"}


def retire_versions(store: FeatureStore, versions, why: str) -> str | None:
    """Take `versions` out of service for good: not current, not once-promoted (so neither rollback nor the catalog's
    anonymized_features_all reaches them), refused with `why`, logged. Returns the previously current version."""
    versions = set(versions)
    with store.lock("aam_promotions"):
        prev = current_version(store)
        with store.lock("aam_versions"):
            rows = read_versions(store).to_pylist()
            for r in rows:
                r["is_current"] = bool(r["is_current"]) and r["version"] not in versions
            write_versions(store, rows)
        done = promoted_versions(store)
        if versions & set(done):
            store.files.write_json(PROMOTIONS_FILE, {v: t for v, t in done.items() if v not in versions})
        for v in sorted(versions):
            record_refusal(store, v, why)
            _log(store, "retire", v, prev, why)
    return prev


def log_erasure_override(store: FeatureStore, version: str, reason: str) -> None:
    """A version fitted on erased videos kept in service on purpose (`splavu forget --keep-fitted-versions`)."""
    with store.lock("aam_promotions"):
        _log(store, "erasure-override", version, current_version(store), reason)


def log_auto_promotion(store: FeatureStore, version: str, previous: str | None, why: str) -> None:
    _mark_promoted(store, version)
    _log(store, "auto-promote", version, previous, why)


# ---------------------------------------------------------------- the verdict rules (pure)

def privacy_threshold(threshold: float | None = None) -> float:
    return settings().privacy_budget if threshold is None else float(threshold)


def utility_fraction(fraction: float | None = None) -> float:
    return settings().utility_gate if fraction is None else float(fraction)


def budget_verdict(measure: dict, threshold: float) -> tuple[bool, str]:
    """Does the measured leakage removal meet `threshold` on close-ups AND on action clips AND the linkage removed
    on re-identification, each by the strongest attacker of the suite? (passed, reason). Where the measure carries
    an interval (leakage_removed_ci_low), its LOWER end must meet the budget."""
    parts = [(name, measure[name]) for name in ("closeups", "clips", "linking")
             if isinstance(measure.get(name), dict) and "skipped" not in measure[name]]
    if not parts:  # a measure of one dataset only
        return _verdict_one(measure, threshold)
    verdicts = [(name, *_verdict_one(m, threshold)) for name, m in parts]
    ok = all(v[1] for v in verdicts)
    why = "; ".join(f"{name}: {reason}" for name, _, reason in verdicts)
    for name, what in (("clips", "action clips"), ("linking", "re-identification")):
        if isinstance(measure.get(name), dict) and "skipped" in measure[name]:
            why += f"; {what} not measured ({measure[name]['skipped']})"
    return ok, why


def _verdict_one(measure: dict, threshold: float) -> tuple[bool, str]:
    """(passed, why) of one privacy part; every reason ends with its state: passed, FAILED or undecidable (and says
    "no signal" when raw is not above chance). An undecidable part (its interval holds the budget) is not passed: the
    gate cannot vouch for the version, so it is not made current (docs/evaluation.md, "Power before verdicts"); the
    reason says what would decide it. The budget is never lowered to let a version through."""
    lr = measure["leakage_removed"]
    what = "linkage removed" if measure.get("metric") == "rank1" else "leakage removed"
    by = f" (strongest attacker: {measure['strongest_anonymized']})" if measure.get("strongest_anonymized") else ""
    if threshold <= 0:  # no removal required: the gate is off, whatever was measured (a part without signal too)
        shown = f"{lr:.3f}" if lr is not None else "none measurable (no signal)"
        return True, f"privacy budget off (budget {threshold:g}; {what} {shown}): passed"
    if lr is None:  # raw features do not leak above chance: pass only if the anonymized ones do not either
        ci = measure.get("anonymized_cmap_ci")
        low = ci[0] if ci else measure["anonymized_cmap"]
        ok = low <= measure["chance_cmap"]
        name = "rank-1" if measure.get("metric") == "rank1" else "cMAP"
        raw_ci = measure.get("raw_cmap_ci")
        raw = f"{measure['raw_cmap']:.4f}" + (f" [{raw_ci[0]:.4f}, {raw_ci[1]:.4f}]" if raw_ci else "")
        return ok, (f"no signal: raw {name} {raw} is not above chance {measure['chance_cmap']:.4f} beyond its "
                    f"interval{_on(measure)}, so there is nothing measurable to remove; anonymized {name} "
                    f"{measure['anonymized_cmap']:.4f} ({'lower end ' if ci else ''}{low:.4f} {'<=' if ok else '>'} "
                    f"chance): {'passed' if ok else 'FAILED'}" + ("" if measure.get("n_videos") is None else
                                                                 "; more validation videos would show whether "
                                                                 "there is leakage to remove"))
    low = measure.get("leakage_removed_ci_low")
    if low is None:
        ok = lr >= threshold
        return ok, f"{what} {lr:.3f}{by} {'>=' if ok else '<'} budget {threshold:g}: {'passed' if ok else 'FAILED'}"
    high = measure.get("leakage_removed_ci_high")
    if low >= threshold:
        return True, f"{what} {lr:.3f} (95% CI low {low:.3f}){by} >= budget {threshold:g}: passed"
    if high is not None and high >= threshold:
        return False, (f"{what} {lr:.3f} [{low:.3f}, {high:.3f}]{by}{_on(measure)} holds the budget {threshold:g}: "
                       f"undecidable; {power_advice(measure, threshold)}")
    return False, f"{what} {lr:.3f} (95% CI low {low:.3f}){by} < budget {threshold:g}: FAILED; {WIDTH_ADVICE}"


# The gate's one piece of advice about the configuration: the publish rule already picked the candidate most likely
# to pass on this store, so it points at the rule's record, which says what holds the family back.
WIDTH_ADVICE = ("the publish rule's record (`splavu curve`, reports/operating_point.json) shows every candidate on "
                "the selection split and what holds the family back")


def _on(measure: dict) -> str:
    n, people = measure.get("n_videos"), measure.get("n_subjects")
    if not n:
        return ""
    return f" on {n} validation videos" + (f" of {people} people" if people else "")


def power_advice(measure: dict, threshold: float) -> str:
    """What would decide an interval that holds the budget. The interval's half-width shrinks about as
    1/sqrt(validation videos); when the point estimate clears the budget, the videos (and people, at this store's
    videos per person) that would bring the lower end up to it; otherwise more data would most likely confirm a
    fail, and another width is the step (WIDTH_ADVICE)."""
    lr, low, n = measure["leakage_removed"], measure["leakage_removed_ci_low"], measure.get("n_videos")
    if lr <= threshold or not n:
        return (f"its estimate {lr:.3f} is {'below' if lr <= threshold else 'above'} the budget; {WIDTH_ADVICE}, "
                f"and more validation videos narrow the interval")
    needed = math.ceil(n * ((lr - low) / (lr - threshold)) ** 2)
    more = max(1, needed - n)
    people = measure.get("n_subjects")
    who = f" of about {max(1, math.ceil(more * people / n))} more people" if people else ""
    return f"about {more} more validation videos{who} would decide it (the interval narrows as 1/sqrt(videos))"


# A retention interval wider than this judges nothing (the demo must judge AD to +-0.15, benchmark v3).
UTILITY_DECIDABLE_WIDTH = 0.3


def retention_kept(retention: float, ci_high: float, fraction: float) -> bool:
    """The utility gate's rule for one task: refused when the share kept is below `fraction` and the loss is beyond
    the noise (upper end below 1), or when even the upper end is below `fraction`."""
    return not ((retention < fraction and ci_high < 1.0) or ci_high < fraction)


def retention_state(retention: float, ci_low: float, ci_high: float, fraction: float) -> str:
    """'lost' (retention_kept says no), 'undecidable' (the interval holds both `fraction` and 1, so it cannot tell a
    material loss from none, or it is wider than UTILITY_DECIDABLE_WIDTH) or 'kept'."""
    if not retention_kept(retention, ci_high, fraction):
        return "lost"
    if (ci_low < fraction and ci_high >= 1.0) or ci_high - ci_low > UTILITY_DECIDABLE_WIDTH:
        return "undecidable"
    return "kept"


def retention_advice(m: dict, fraction: float) -> str:
    """How many validation videos would decide an undecidable retention: its half-width shrinks about as
    1/sqrt(videos) and must fall below the distance from the estimate to `fraction` (to show it kept) or to 1 (to
    show a loss), and to half of UTILITY_DECIDABLE_WIDTH."""
    ret, lo, hi, n = m["retention"], m["retention_ci_low"], m["retention_ci_high"], m.get("n_videos")
    half = (hi - lo) / 2
    room = min(ret - fraction if ret >= fraction else 1.0 - ret, UTILITY_DECIDABLE_WIDTH / 2)
    if not n or room <= 0:
        return "the estimate sits at the floor: more validation videos narrow the interval"
    more = max(1, math.ceil(n * (half / room) ** 2) - n)
    return f"about {more} more validation videos would decide it (on {n})"


def utility_verdict(measures: dict[str, dict], fraction: float) -> tuple[bool, str]:
    """Every seen task keeps `fraction` of its above-chance utility, read by raw's strongest reader.

    measures: task -> {"raw", "anon", "chance", "retention", "retention_ci_low", "retention_ci_high", "reader",
    "n_videos"?, "skipped"?}. A task fails when its retention is below `fraction` and the loss is beyond the noise
    (the upper end of its 95% interval below 1: a loss shown, and a material one), or when the upper end itself is
    below `fraction`, or when its anonymized value is not above chance beyond its interval (a version at chance
    never passes). On sets sized so the interval is at most 0.14 wide, a 10% loss is refused and a 2% loss passes
    (tests/test_utility_gate.py). A task whose interval cannot decide (retention_state) is said to be undecidable,
    with the videos that would decide it, and does not refuse the version: the utility gate refuses a loss it can
    see; the privacy gate, which protects people, fails closed instead. A task whose raw features are not above
    chance has nothing to retain and is skipped (said so). fraction <= 0 turns the gate off (every task passes)."""
    if fraction <= 0:
        return True, f"utility gate off (threshold {fraction:g})"
    parts, ok = [], True
    for task, m in measures.items():
        if m.get("skipped"):
            parts.append(f"{task}: not measured ({m['skipped']})")
            continue
        if m.get("no_signal"):
            parts.append(f"{task}: raw features at chance, nothing to retain")
            continue
        ret, hi = m["retention"], m["retention_ci_high"]
        lo = m.get("retention_ci_low", float("nan"))
        at_chance = m.get("anon_at_chance", False)
        state = retention_state(ret, lo, hi, fraction)
        passed = state != "lost" and not at_chance
        ok = ok and passed
        tail = "; anonymized at chance" if at_chance else ""
        reader = f" by {m['reader']}" if m.get("reader") else ""
        why = (f"undecidable, does not refuse; {retention_advice(m, fraction)}" if state == "undecidable" else
               "kept" if state == "kept" else "lost beyond the noise")
        if at_chance and state != "lost":
            why = "failed"
        parts.append(f"{task}: retention{reader} {ret:.3f} [{lo:.3f}, {hi:.3f}] {why} "
                     f"({'>=' if passed else '<'} {fraction:g}){tail}")
    if not parts:
        return False, "no seen task could be measured"
    return ok, "; ".join(parts)
