"""Datasets registered in a store and the shards they are cut into.

A shard is a contiguous block of manifest rows (`<dataset>-<nnn>`), the unit of parallelism and
of crash-safety. Registering validates the whole manifest first, so a bad row is reported before
any video is decoded.
"""
from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pyarrow as pa

from .erasure import ForgottenVideoError, forgotten, readmit
from .manifest import Manifest, load_manifest
from .registrations import _registration, registered, registration, registration_key  # noqa: F401  (re-exported)
from .roles import RoleError, default_roles, gets_static_clips, missing_columns, parse_roles, roles_of
from .store import FeatureStore, StoreError

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
    see roles.py); return the dataset's shard keys. A manifest listing erased videos (erasure.py) is refused
    unless allow_forgotten, which re-admits them (logged in the erasure log)."""
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
    store.fs.put_atomic(registration_key(name), (json.dumps(reg, indent=1) + "\n").encode())
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
