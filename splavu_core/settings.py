"""Every `SPLAVU_*` environment variable, in one typed, documented, frozen object.

    from splavu_core.settings import settings
    settings().privacy_budget        # float, from $SPLAVU_PRIVACY_BUDGET or 0.5

Nothing reads a `SPLAVU_*` variable anywhere else (tests/test_settings.py checks the source), and nothing reads one
when a module is imported: `settings()` reads the environment when it is called. It is parsed once per distinct set
of `SPLAVU_*` values (a cache keyed on them), so a process that changes its environment (a test's monkeypatch, the
CLI exporting --store) sees the change on the next call, and an unchanged environment is never parsed twice.
`read_settings(env)` parses any mapping (tests, `pipeline.executors.default_engine(env)`).

Two things Dagster needs as fixed values when the code location loads are built from `settings()` then: the
executor's default engine (pipeline/executors.py) and the re-anonymization schedule's cron and timezone
(pipeline/reanonymize.py).

A value that does not parse raises SettingsError (a ValueError) naming the variable and what it expected. Each
field's metadata (`env`, `doc`, `unit`) feeds the generated configuration reference,
docs/configuration.md (docs/gen_reference.py).
"""
from __future__ import annotations

import functools
import json
import os
from dataclasses import dataclass, field, fields
from types import MappingProxyType
from typing import Any, Callable, Mapping

PREFIX = "SPLAVU_"
DEFAULT_STORE = "./store"
DEFAULT_PRIVACY_BUDGET = 0.5  # share of above-chance leakage to remove, on the CI's lower end (<= 0: off)
DEFAULT_UTILITY_GATE = 0.95   # share of the raw features' above-chance utility a seen task must keep (<= 0: off)
DEFAULT_CRON = "0 3 * * *"
ENGINES = ("multiprocess", "in_process", "dask", "k8s")
DECODERS = ("decord", "nvdec", "auto")


class SettingsError(ValueError):
    """A `SPLAVU_*` variable holds a value its field cannot take; the message names the variable."""


def _setting(env: str, default: Any, doc: str, unit: str = "", parse: Callable[[str, str], Any] | None = None):
    """A field read from $`env`; `parse(name, raw)` turns a non-empty raw string into the value (None: the string)."""
    meta = {"env": env, "doc": doc, "unit": unit, "parse": parse}
    if isinstance(default, Mapping):  # a mapping is built per instance (dataclasses refuse a shared mutable default)
        return field(default_factory=lambda: MappingProxyType(dict(default)), metadata=meta)
    return field(default=default, metadata=meta)


def _float(name: str, raw: str) -> float:
    try:
        return float(raw)
    except ValueError:
        raise SettingsError(f"${name}={raw!r}: expected a number") from None


def _int(name: str, raw: str) -> int:
    try:
        return int(raw)
    except ValueError:
        raise SettingsError(f"${name}={raw!r}: expected an integer") from None


def _json_object(name: str, raw: str) -> Mapping:
    try:
        opts = json.loads(raw)
    except json.JSONDecodeError as e:
        raise SettingsError(f"${name} is not valid JSON ({e}); expected an object of fsspec options") from e
    if not isinstance(opts, dict):
        raise SettingsError(f"${name} must be a JSON object of fsspec options, got {type(opts).__name__}")
    return MappingProxyType(opts)


def _engine(name: str, raw: str) -> str:
    engine = raw.strip().lower().replace("-", "_")
    if engine not in ENGINES:
        raise SettingsError(f"{name}={raw!r}: expected one of {', '.join(ENGINES)}")
    return engine


def _count(name: str, raw: str) -> int:
    value = _int(name, raw)
    if value < 0:
        raise SettingsError(f"${name}={raw!r}: expected 0 or a positive integer")
    return value


def _decoder(name: str, raw: str) -> str:
    value = raw.strip().lower()
    if value not in DECODERS:
        raise SettingsError(f"${name}={raw!r}: expected one of {', '.join(DECODERS)}")
    return value


def _flag(name: str, raw: str) -> bool:
    value = raw.strip().lower()
    if value not in ("0", "1", "true", "false", "yes", "no"):
        raise SettingsError(f"${name}={raw!r}: expected 0 or 1")
    return value in ("1", "true", "yes")


ERASURE_POLICIES = ("retire", "serve_until_refit")


def _erasure_policy(name: str, raw: str) -> str:
    policy = raw.strip().lower()
    if policy not in ERASURE_POLICIES:
        raise SettingsError(f"${name}={raw!r}: expected one of {', '.join(ERASURE_POLICIES)}")
    return policy


def _upper(name: str, raw: str) -> str:
    return raw.upper()


def _stripped(name: str, raw: str) -> str:
    return raw.strip()


@dataclass(frozen=True)
class Settings:
    """What the environment sets. An unset or empty variable leaves the default."""

    # ---- the store
    store: str = _setting(
        "SPLAVU_STORE", DEFAULT_STORE,
        "Store root: a local path or an fsspec URL such as s3://bucket/prefix. `--store` overrides it.", "path or URL")
    storage_options: Mapping = _setting(
        "SPLAVU_STORAGE_OPTIONS", {},
        "fsspec options for an object-store root, as a JSON object (credentials and endpoint otherwise come from "
        "the standard AWS variables).", "JSON object", _json_object)
    catalog_dir: str | None = _setting(
        "SPLAVU_CATALOG_DIR", None,
        "Local folder for the DuckDB catalogs of object-store roots (unset: $XDG_CACHE_HOME/splavu/catalogs, "
        "else ~/.cache/splavu/catalogs). A local store keeps its catalog in its root.", "path")
    lock_ttl_s: float = _setting(
        "SPLAVU_LOCK_TTL_S", 60.0,
        "Lease length of a lock on an object store; a holder that stops renewing loses it after this long.",
        "seconds", _float)
    # ---- the gates
    privacy_budget: float = _setting(
        "SPLAVU_PRIVACY_BUDGET", DEFAULT_PRIVACY_BUDGET,
        "Privacy gate: share of the raw features' above-chance leakage the strongest attacker must lose, on the "
        "lower end of its 95% interval, for an AAM to be promoted. <= 0 turns the gate off.", "fraction", _float)
    utility_gate: float = _setting(
        "SPLAVU_UTILITY_GATE", DEFAULT_UTILITY_GATE,
        "Utility gate: share of the raw features' above-chance utility each seen task must keep, read by raw's "
        "strongest reader (below it with the interval's upper end below 1, a loss beyond the noise: refused). "
        "<= 0 turns the gate off.", "fraction", _float)
    # ---- erasure
    erasure_policy: str = _setting(
        "SPLAVU_ERASURE_POLICY", "retire",
        "What analysts are served after `splavu forget` erases videos the current AAM was fitted on, until the refit "
        "(by the publish rule) passes both gates: 'retire' (the versions fitted on them are retired at once: no "
        "table serves until the refit passes) or 'serve_until_refit' (the current version keeps serving with the "
        "erased rows removed from every table, and is retired as soon as a version fitted without them becomes "
        "current). A request can override it (`splavu forget --policy`, the forget job's config).",
        "retire or serve_until_refit", _erasure_policy)
    # ---- re-anonymization
    aam_retention: int = _setting(
        "SPLAVU_AAM_RETENTION", 0,
        "How many older AAM versions' published tables a re-anonymization keeps (0: keep all).", "versions", _int)
    reanonymize_cron: str = _setting(
        "SPLAVU_REANONYMIZE_CRON", DEFAULT_CRON,
        "Cron of the catch-all reanonymize_schedule (stopped by default). Read when the code location loads.",
        "cron expression")
    timezone: str = _setting(
        "SPLAVU_TIMEZONE", "UTC", "Timezone of reanonymize_schedule's cron. Read when the code location loads.",
        "IANA timezone")
    # ---- execution
    executor: str = _setting(
        "SPLAVU_EXECUTOR", "multiprocess",
        f"Default Dagster executor of every job: one of {', '.join(ENGINES)}. A run's config can pick another. "
        "Read when the code location loads.", "engine name", _engine)
    dask_scheduler: str = _setting(
        "SPLAVU_DASK_SCHEDULER", "",
        "dask executor: address of an existing dask.distributed scheduler (empty: a LocalCluster per run).",
        "address, e.g. tcp://scheduler:8786", _stripped)
    dagster_home: str | None = _setting(
        "SPLAVU_DAGSTER_HOME", None,
        "Dagster instance folder of the runs the `splavu` CLI launches when $DAGSTER_HOME is unset (which wins when "
        "set). Unset: `.dagster_home` in the project checkout the CLI runs from (the Makefile's, so `make`, the CLI "
        "and `dagster dev` with DAGSTER_HOME=$PWD/.dagster_home share it), else $XDG_STATE_HOME/splavu/dagster_home "
        "(~/.local/state/...).", "path")
    log_level: str | None = _setting(
        "SPLAVU_LOG_LEVEL", None,
        "Log level of Dagster's console logger in runs the CLI launches (unset: the command's own, WARNING).",
        "level name", _upper)
    traceback: bool = _setting(
        "SPLAVU_TRACEBACK", False,
        "`splavu` prints an unexpected error (a bug) as one `splavu: error:` line; set to 1 to get the traceback "
        "instead.", "0 or 1", _flag)
    # ---- extraction
    decode_workers: int | None = _setting(
        "SPLAVU_DECODE_WORKERS", None,
        "Video decoder processes per extraction (CPU decoding with decord): each decodes one video at a time on one "
        "core and hands its clips to the encoder through shared memory. Unset: the cores this process may use. 0: "
        "decode in threads of the extracting process instead (the older path; pixel baselines always "
        "do). The latents are the same bytes either way. The `encoder` concurrency pool stays the knob for GPUs.",
        "processes", _count)
    decoder: str = _setting(
        "SPLAVU_DECODER", "decord",
        f"Video decoder backend of extraction: one of {', '.join(DECODERS)}. `decord` decodes on the CPU (in "
        "`SPLAVU_DECODE_WORKERS` processes); `nvdec` decodes on the encoder's GPU with NVIDIA's PyNvVideoCodec, in "
        "the extraction's decode threads, and is refused with the reason on a machine without it; `auto` takes `nvdec` where the encoder runs on CUDA and PyNvVideoCodec works, else "
        "`decord`. The backends' pixels differ by colour-conversion rounding, so their latents differ slightly "
        "(the encoder fingerprint does not record the backend).", "backend name", _decoder)
    # ---- search
    ann_min_rows: int = _setting(
        "SPLAVU_ANN_MIN_ROWS", 10_000_000,
        "Published tables with at least this many rows also get a faiss IVF index (approximate search).",
        "rows", _int)
    # ---- bookkeeping and tests
    install_seconds: float | None = _setting(
        "SPLAVU_INSTALL_SECONDS", None,
        "Wall time of `make demo`'s setup step, set by the Makefile for the demo report's cost section.",
        "seconds", _float)
    forget_crash_after: int | None = _setting(
        "SPLAVU_FORGET_CRASH_AFTER", None,
        "Tests only: SIGKILL the process at this checkpoint of a forget request (crash-recovery tests).",
        "checkpoint number", _int)


SETTINGS_FIELDS = {f.metadata["env"]: f for f in fields(Settings)}


def env_name(attr: str) -> str:
    """The environment variable behind field `attr` (e.g. 'privacy_budget' -> 'SPLAVU_PRIVACY_BUDGET')."""
    return next(f.metadata["env"] for f in fields(Settings) if f.name == attr)


def read_settings(env: Mapping[str, str]) -> Settings:
    """The settings `env` (any mapping of variable names to strings) sets; SettingsError on a bad value."""
    values = {}
    for f in fields(Settings):
        raw = env.get(f.metadata["env"])
        if raw is None or raw == "":
            continue
        parse = f.metadata["parse"]
        values[f.name] = parse(f.metadata["env"], raw) if parse else raw
    return Settings(**values)


@functools.lru_cache(maxsize=8)
def _parsed(snapshot: tuple[tuple[str, str], ...]) -> Settings:
    return read_settings(dict(snapshot))


def settings() -> Settings:
    """The settings of this process's environment now (parsed once per distinct set of SPLAVU_* values)."""
    return _parsed(tuple(sorted((k, v) for k, v in os.environ.items() if k.startswith(PREFIX))))


def reload() -> Settings:
    """Forget every parsed environment and read this one again."""
    _parsed.cache_clear()
    return settings()
