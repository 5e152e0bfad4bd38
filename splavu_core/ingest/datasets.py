"""Datasets: what is registered in a store, which task each dataset serves, and the shards it is cut into.

Three parts, one module (they were registrations.py, roles.py and registry.py):

- reading registrations: <root>/datasets/<name>.json, one per dataset;
- roles: which registered dataset serves which task. A dataset is registered with the roles it serves
  (`splavu ingest NAME MANIFEST --roles ar,privacy`) and its registration JSON records them. Training, evaluation,
  ablations and the Dagster assets ask this module for the dataset of each task instead of assuming a name. Without
  --roles, a dataset named after a role (the synthetic benchmark's `ar`, `tad`, `ad`, `privacy`, `bias_f`,
  `bias_m`, `gait`) serves that role, so the demo works unchanged. Static clips (one frame repeated) feed only the
  AAM's privacy loss, which reads the training videos of datasets with a training role; other datasets never get
  them, decided here when a dataset is registered;
- registering and sharding: a shard is a contiguous block of manifest rows (`<dataset>-<nnn>`), the unit of
  parallelism and of crash-safety. Registering validates the whole manifest first, so a bad row is reported before
  any video is decoded.
"""
from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa

from splavu_core.ingest.manifest import Manifest, load_manifest
from splavu_core.store.feature_store import FeatureStore, StoreError
from splavu_core.store.forget_records import ForgottenVideoError, forgotten, readmit
from splavu_core.store.fs import join

# ==================================================================== registrations

def registration_key(name: str) -> str:
    return join("datasets", f"{name}.json")


def _registration(store: FeatureStore, name: str) -> dict | None:
    try:
        return store.files.read_json(registration_key(name))
    except FileNotFoundError:
        return None


def registered(store: FeatureStore) -> dict[str, dict]:
    return {key.rsplit("/", 1)[-1][:-len(".json")]: store.files.read_json(key)
            for key in sorted(store.files.glob("datasets", ".json"))}


def registration(store: FeatureStore, name: str) -> dict:
    reg = _registration(store, name)
    if reg is None:
        raise StoreError(f"dataset {name!r} is not registered in {store.root} (run `splavu ingest`)")
    return reg


# ==================================================================== roles

@dataclass(frozen=True)
class Role:
    name: str
    what: str
    needs: str                 # manifest columns, as a user reads them
    trains: bool               # the AAM co-trains on it (so its training videos get static clips)
    aliases: tuple[str, ...] = ()


ROLES: dict[str, Role] = {r.name: r for r in (
    Role("ar", "action recognition", "action (train, val, test)", True, ("action_recognition", "action")),
    Role("tad", "temporal action detection", "segments (train, test)", True, ("detection", "temporal_detection")),
    Role("ad", "anomaly detection", "anomaly (0/1; train and test), anomaly_intervals (test)", True,
         ("anomaly", "anomaly_detection")),
    Role("privacy", "privacy evaluation", "attr_<name> (0/1; train and test)", False, ("privacy_evaluation",)),
    Role("bias_f", "bias", "action, group (train, test)", False, ("bias",)),
    Role("bias_m", "bias, mirrored split", "action, group (train, test)", False),
    Role("gait", "gait (identity across walks)", "subject_id", False),
)}
TRAINING_ROLES = tuple(n for n, r in ROLES.items() if r.trains)
_ALIASES = {a: r.name for r in ROLES.values() for a in (r.name, *r.aliases)}


class RoleError(StoreError):
    """A role cannot be resolved (unknown, ambiguous, or no data); the message says how to fix it."""


def parse_roles(text: str | list[str] | tuple[str, ...]) -> tuple[str, ...]:
    """'ar,privacy' (or a list; long names such as action_recognition too) -> canonical role names."""
    items = text.split(",") if isinstance(text, str) else list(text)
    out = []
    for item in (i.strip().lower() for i in items):
        if not item:
            continue
        if item not in _ALIASES:
            raise RoleError(f"unknown role {item!r}; choose from {', '.join(ROLES)}")
        out.append(_ALIASES[item])
    return tuple(dict.fromkeys(out))


def default_roles(name: str) -> tuple[str, ...]:
    """A dataset named after a role serves it (the synthetic benchmark's names)."""
    return (name,) if name in ROLES else ()


def roles_of(reg: dict) -> tuple[str, ...]:
    """The roles of a registration (registrations written before roles existed: from the name)."""
    return tuple(reg["roles"]) if "roles" in reg else default_roles(reg["name"])


def gets_static_clips(roles) -> bool:
    return any(ROLES[r].trains for r in roles)


def suggested_roles(columns) -> tuple[str, ...]:
    """Roles a manifest's columns could serve (a hint for a dataset registered without roles)."""
    cols = set(columns)
    out = [r for r, need in (("ar", "action"), ("tad", "segments"), ("ad", "anomaly"), ("gait", "subject_id"))
           if need in cols]
    if any(c.startswith("attr_") for c in cols):
        out.append("privacy")
    return tuple(out)


def missing_columns(roles, columns) -> list[str]:
    """Problems with the manifest's columns for these roles (a role whose label column is absent)."""
    cols = set(columns)
    need = {"ar": ["action"], "tad": ["segments"], "ad": ["anomaly"], "bias_f": ["action", "group"],
            "bias_m": ["action", "group"], "gait": ["subject_id"]}
    out = [f"role {r!r} needs column(s) {[c for c in need.get(r, []) if c not in cols]}"
           for r in roles if any(c not in cols for c in need.get(r, []))]
    if "privacy" in roles and not any(c.startswith("attr_") for c in cols):
        out.append("role 'privacy' needs at least one attr_<name> column")
    return out


def describe_registration(reg: dict) -> str:
    """One line: the roles a registered dataset serves and whether it gets static clips (or a hint)."""
    roles = roles_of(reg)
    if not roles:
        hint = suggested_roles(load_manifest(reg["manifest"], check_files=False).to_arrow().column_names)
        return (f"roles: none, so no task reads it; its columns could serve {', '.join(hint) or 'no role'}: "
                f"re-run with --roles {','.join(hint) or 'ROLE'}")
    static = "static clips of its train videos (the AAM trains on it)" if reg.get("static_clips", gets_static_clips(
        roles)) else "no static clips (evaluation only)"
    return f"roles: {', '.join(f'{r} ({ROLES[r].what})' for r in roles)}; {static}"


def role_datasets(regs: dict[str, dict]) -> dict[str, str | None]:
    """role -> the registered dataset serving it (None: none). Two datasets with one role is an error."""
    by_role: dict[str, list[str]] = {r: [] for r in ROLES}
    for name, reg in regs.items():
        for r in roles_of(reg):
            by_role[r].append(name)
    both = {r: names for r, names in by_role.items() if len(names) > 1}
    if both:
        r, names = next(iter(both.items()))
        raise RoleError(f"datasets {names} all have role {r!r}; a role is served by one dataset: re-register "
                        f"one of them with other --roles (splavu ingest NAME MANIFEST --roles ...)")
    return {r: (names[0] if names else None) for r, names in by_role.items()}


def none_with(role: str) -> str:
    """The stand-in dataset name of a role nobody serves (never a valid dataset name, so it is skipped)."""
    return f"(no dataset with role {role})"


def task_datasets(store, overrides: dict[str, str] | None = None) -> dict[str, str]:
    """task -> dataset for every role: an explicit override, else the dataset registered with that role."""
    found = role_datasets(registered(store))
    overrides = {t: d for t, d in (overrides or {}).items() if d}
    out = {r: overrides.get(r) or found[r] or none_with(r) for r in ROLES}
    # the privacy attack on published action clips reads the AR dataset (its attr_* labels, evaluation only)
    out["clip_privacy"] = overrides.get("clip_privacy") or out["ar"]
    # re-identification links the same person across those clips' videos (their subject_id)
    out["reid"] = overrides.get("reid") or out["clip_privacy"]
    return out


# ---------------------------------------------------------------- what training can use

@dataclass
class TrainingPlan:
    tasks: tuple[str, ...]                 # utility tasks co-trained
    datasets: dict[str, str | None]        # ar / tad / ad -> dataset read (None: not read)
    selection: str                         # "val_ar" or "last"
    missing: dict[str, str]                # task -> why it has no data
    available: dict[str, str]              # every training task with labelled data -> its dataset
    requested: bool = False                # the tasks were chosen (--tasks), not every task with data

    def summary(self) -> str:
        used = ", ".join(f"{t} ({self.datasets[t]})" for t in self.tasks) or "no utility task"
        line = f"training on {used}"
        left = [t for t in TRAINING_ROLES if t not in self.tasks]
        if self.requested:
            if left:
                chosen = ",".join(self.tasks) or "''"
                line += f"; not on {', '.join(left)} (--tasks {chosen})"
        elif self.missing:
            line += "; without " + ", ".join(self.missing) + " (no labelled data: " + \
                    "; ".join(self.missing.values()) + ")"
        return line + ("" if self.selection == "val_ar" else "; model selection: last epoch (no AR val videos)")


def _labelled(reg: dict, task: str) -> str | None:
    """Why `task` cannot train on the dataset of `reg`, or None when its training videos carry the labels."""
    rows = load_manifest(reg["manifest"], check_files=False).rows
    train = [r for r in rows if r["split"] == "train"]
    if task == "ar":
        classes = {r.get("action") for r in train} - {None}
        return None if len(classes) >= 2 else f"{reg['name']!r} has {len(classes)} action class(es) in train"
    if task == "tad":
        return None if any(r.get("segments") for r in train) else f"{reg['name']!r} has no train videos with segments"
    labels = {r.get("anomaly") for r in train} - {None}
    return None if labels == {0, 1} else f"{reg['name']!r} lacks train videos with anomaly 0 and 1"


def _has_val(reg: dict) -> bool:
    return any(r["split"] == "val" and r.get("action") for r in load_manifest(reg["manifest"], check_files=False).rows)


def training_plan(store, tasks=None, overrides: dict[str, str] | None = None, selection: str = "") -> TrainingPlan:
    """The tasks training co-trains and the datasets it reads. tasks None: every training task whose labelled
    data is registered. A requested task without data raises RoleError saying how to add it or drop it."""
    regs = registered(store)
    found = role_datasets(regs)
    overrides = {t: d for t, d in (overrides or {}).items() if d}
    datasets, missing = {}, {}
    for t in TRAINING_ROLES:
        name = overrides.get(t) or found[t]
        if name is None:
            missing[t] = f"no dataset has role {t}"
        elif name not in regs:
            missing[t] = f"dataset {name!r} is not registered"
        elif (why := _labelled(regs[name], t)) is not None:
            missing[t] = why
        else:
            datasets[t] = name
    if tasks is None:
        chosen = tuple(t for t in TRAINING_ROLES if t in datasets)
        if not chosen:
            raise RoleError("nothing to train on: " + "; ".join(missing.values()) + ". Register a dataset with a "
                            "training role, e.g. splavu ingest NAME MANIFEST --roles ar (manifest column 'action')")
    else:
        chosen = parse_roles(tasks)
        bad = [t for t in chosen if t not in TRAINING_ROLES]
        if bad:
            raise RoleError(f"task(s) {bad} cannot be co-trained; training tasks are {', '.join(TRAINING_ROLES)}")
        lacking = [t for t in chosen if t not in datasets]
        if lacking:
            t = lacking[0]
            usable = ",".join(x for x in chosen if x in datasets) or "''"
            raise RoleError(f"task {t!r} has no labelled data ({missing[t]}): register a dataset with "
                            f"`splavu ingest NAME MANIFEST --roles {t}` (its manifest needs {ROLES[t].needs}), or train "
                            f"without it: --tasks {usable}")
    if not selection:
        selection = "val_ar" if "ar" in datasets and _has_val(regs[datasets["ar"]]) else "last"
    if selection == "val_ar" and "ar" not in datasets:
        raise RoleError(f"selection 'val_ar' needs a dataset with role ar and val videos ({missing['ar']}); "
                        f"use selection 'last'")
    used = {t: (datasets.get(t) if t in chosen or (t == "ar" and selection == "val_ar") else None)
            for t in TRAINING_ROLES}
    return TrainingPlan(tasks=chosen, datasets=used, selection=selection,
                        missing={t: missing[t] for t in TRAINING_ROLES if t in missing and t not in chosen},
                        available=datasets, requested=tasks is not None)


# ==================================================================== registering and sharding

NAME = re.compile(r"^[a-z0-9][a-z0-9_]*$")
DEFAULT_SHARD_SIZE = 256


def dataset_of(shard: str) -> str:
    name, _, num = shard.rpartition("-")
    if not name or not num.isdigit():
        raise StoreError(f"bad shard key {shard!r}: expected <dataset>-<nnn>")
    return name


def register_dataset(store: FeatureStore, name: str, manifest_path: str | os.PathLike,
                     shard_size: int = DEFAULT_SHARD_SIZE, roles=None, allow_forgotten: bool = False) -> list[str]:
    """Validate `manifest_path` and record it under `name` with the roles it serves (None: from the name,
    see the roles above); return the dataset's shard keys. A manifest listing erased videos (store/forget_records.py)
    is refused unless allow_forgotten, which re-admits them (logged in the erasure log)."""
    if not NAME.match(name):
        raise StoreError(f"dataset name {name!r}: use lowercase letters, digits and '_'")
    if shard_size < 1:
        raise StoreError(f"--shard-size must be >= 1 (videos per shard), got {shard_size}")
    roles = default_roles(name) if roles is None else parse_roles(roles)
    m = load_manifest(manifest_path)
    columns = list(m.to_arrow().column_names)
    if problems := missing_columns(roles, columns):
        raise RoleError(f"{manifest_path}: " + "; ".join(problems) + f" (its columns: {columns})")
    back = forgotten(store, [r["video_id"] for r in m.rows])
    if back and not allow_forgotten:
        rows = [i + 1 for i, r in enumerate(m.rows) if r["video_id"] in back]
        raise ForgottenVideoError(
            f"{manifest_path}: {len(back)} video(s) were erased from this store by `splavu forget` (data row(s) "
            f"{', '.join(map(str, rows[:10]))}{' ...' if len(rows) > 10 else ''}): remove those rows, or ingest with "
            f"--allow-forgotten to bring them back on purpose (recorded in the erasure log); a dataset registered "
            f"already needs no new ingest: its extraction skips them")
    n = len(m.rows)
    shards = [f"{name}-{i:03d}" for i in range((n + shard_size - 1) // shard_size)]
    reg = {"name": name, "manifest": str(Path(manifest_path).resolve()), "shard_size": shard_size,
           "videos": n, "shards": shards, "attributes": list(m.attributes), "roles": list(roles),
           "static_clips": gets_static_clips(roles)}
    old = _registration(store, name)
    if old is not None and old["manifest"] != reg["manifest"]:
        raise StoreError(f"dataset {name!r} is already registered from {old['manifest']}; "
                         f"choose another name for {reg['manifest']}")
    if back:  # only once nothing else can refuse the registration
        readmit(store, back, reason=f"--allow-forgotten on ingest of dataset {name}")
    store.files.put_atomic(registration_key(name), (json.dumps(reg, indent=1) + "\n").encode())
    return shards


def static_clips(reg: dict) -> bool:
    """Whether the dataset's training videos get static clips (registrations without the field: by role)."""
    return bool(reg["static_clips"]) if "static_clips" in reg else gets_static_clips(roles_of(reg))


def dataset_manifest(store: FeatureStore, name: str) -> Manifest:
    reg = _registration(store, name)
    if reg is None:
        raise StoreError(f"dataset {name!r} is not registered in {store.root} (run `splavu ingest`)")
    return load_manifest(reg["manifest"])


def shard_rows(store: FeatureStore, shard: str, log=None) -> tuple[Manifest, list[dict]]:
    """The validated manifest and the rows of one shard, without erased videos (log(message) says how many)."""
    name = dataset_of(shard)
    reg = _registration(store, name)
    if reg is None or shard not in reg["shards"]:
        raise StoreError(f"shard {shard!r} is not part of a registered dataset in {store.root}")
    m = dataset_manifest(store, name)
    i = reg["shards"].index(shard)
    rows = m.rows[i * reg["shard_size"]:(i + 1) * reg["shard_size"]]
    # erased videos (tombstones) never come back through a re-extraction; the shard's boundaries stay where they were
    gone = forgotten(store, [r["video_id"] for r in rows])
    if gone and log:
        log(f"{shard}: {len(gone)} erased video(s) skipped (`splavu forget` tombstones; `splavu ingest NAME MANIFEST "
            f"--allow-forgotten` re-admits them)")
    return m, [r for r in rows if r["video_id"] not in gone]


def write_shard_manifest(store: FeatureStore, shard: str) -> pa.Table:
    m, rows = shard_rows(store, shard)
    sub = Manifest(path=m.path, root=m.root, rows=rows, attributes=m.attributes).to_arrow()
    # what the catalog's `videos` view shows about roles: which tasks read the video, does it get static clips
    reg = registration(store, dataset_of(shard))
    sub = sub.append_column("roles", pa.array([",".join(roles_of(reg))] * len(rows), pa.string()))
    sub = sub.append_column("static_clips", pa.array([static_clips(reg) and r["split"] == "train" for r in rows]))
    sub = sub.replace_schema_metadata({"dataset_root": str(m.root), "manifest": str(m.path)})
    store.write_shard_manifest_table(shard, sub)
    return sub
