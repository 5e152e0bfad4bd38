"""Dataset roles: which registered dataset serves which task.

A dataset is registered with the roles it serves (`splavu ingest NAME MANIFEST --roles ar,privacy`) and
its registration JSON records them. Training, evaluation, ablations and the Dagster assets ask this
module for the dataset of each task instead of assuming a name. Without --roles, a dataset named after
a role (the synthetic benchmark's `ar`, `tad`, `ad`, `privacy`, `bias_f`, `bias_m`, `gait`) serves that
role, so the demo works unchanged.

Static clips (one frame repeated) feed only the AAM's privacy loss, which reads the training videos of
datasets with a training role; other datasets never get them, decided here when a dataset is registered.
"""
from __future__ import annotations

from dataclasses import dataclass

from .manifest import load_manifest
from .registrations import registered
from .store import StoreError


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
