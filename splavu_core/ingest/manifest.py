"""Dataset manifests: how any dataset (synthetic or a user's own) enters the store.

A dataset is a folder of videos plus a manifest (CSV or Parquet), one row per video. Validation
checks everything before any video is opened and reports every problem with its row and column.
Paths that resolve outside the dataset folder are refused, never read.
"""
from __future__ import annotations

import csv
import json
import math
import os
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

REQUIRED = ("video_id", "path", "split")
OPTIONAL = ("action", "segments", "anomaly", "anomaly_intervals", "subject_id", "group")
SPLITS = ("train", "val", "select", "test")  # select: scored only by the publish rule (its operating point)
MAX_REPORTED = 20


class ManifestError(ValueError):
    """Invalid manifest; the message lists each problem with its row and column."""

    def __init__(self, manifest: str, problems: list[str]):
        self.manifest, self.problems = manifest, problems
        more = f"\n  ... and {len(problems) - MAX_REPORTED} more" if len(problems) > MAX_REPORTED else ""
        super().__init__(f"{manifest}: {len(problems)} problem(s)\n  " + "\n  ".join(problems[:MAX_REPORTED]) + more)


@dataclass
class Manifest:
    path: Path                 # the manifest file
    root: Path                 # the dataset folder (paths are relative to it)
    rows: list[dict]           # validated rows, typed: segments/anomaly_intervals parsed, attr_* as int
    attributes: tuple[str, ...]  # private attribute names (without the attr_ prefix)

    @property
    def name(self) -> str:
        return self.root.name

    def video_path(self, row: dict) -> Path:
        return self.root / row["path"]

    def to_arrow(self) -> pa.Table:
        cols = {"video_id": [r["video_id"] for r in self.rows], "path": [r["path"] for r in self.rows],
                "split": [r["split"] for r in self.rows]}
        present = {k for r in self.rows for k, v in r.items() if v is not None}
        for c in OPTIONAL:
            if c in present:
                vals = [r.get(c) for r in self.rows]
                cols[c] = [json.dumps(v) if c in ("segments", "anomaly_intervals") and v is not None else v for v in vals]
        for a in self.attributes:
            cols[f"attr_{a}"] = [r.get(f"attr_{a}") for r in self.rows]
        return pa.table(cols)


def _read_rows(path: Path) -> list[dict]:
    if path.suffix.lower() == ".parquet":
        return pq.read_table(path).to_pylist()
    if path.suffix.lower() in (".csv", ".tsv"):
        with open(path, newline="") as f:
            return list(csv.DictReader(f, delimiter="\t" if path.suffix.lower() == ".tsv" else ","))
    raise ManifestError(str(path), [f"unsupported manifest type {path.suffix!r}: use .csv or .parquet"])


def _blank(v) -> bool:
    return v is None or (isinstance(v, str) and v.strip() == "") or (isinstance(v, float) and math.isnan(v))


def _inside(root_real: str, path: str) -> bool:
    return os.path.commonpath([root_real, path]) == root_real


def load_manifest(path: str | os.PathLike, check_files: bool = True) -> Manifest:
    """Read and validate a manifest; raise ManifestError listing every problem."""
    path = Path(path)
    if not path.is_file():
        raise ManifestError(str(path), ["manifest file not found"])
    root = path.parent
    root_real = os.path.realpath(root)
    raw = _read_rows(path)
    problems: list[str] = []
    if not raw:
        raise ManifestError(str(path), ["manifest has no rows"])
    columns = list(raw[0].keys())
    missing = [c for c in REQUIRED if c not in columns]
    if missing:
        raise ManifestError(str(path), [f"missing required column(s) {missing}; found {columns}"])
    unknown = [c for c in columns if c not in REQUIRED + OPTIONAL and not c.startswith("attr_")]
    if unknown:
        problems.append(f"unknown column(s) {unknown}: expected {list(REQUIRED + OPTIONAL)} or attr_<name>")
    attributes = tuple(c[5:] for c in columns if c.startswith("attr_"))
    seen: dict[str, int] = {}
    rows = []
    for i, r in enumerate(raw, start=1):
        where = f"row {i}"
        vid = r.get("video_id")
        if _blank(vid):
            problems.append(f"{where}, column 'video_id': empty")
            vid = None
        else:
            vid = str(vid).strip()
            where = f"row {i} (video_id {vid!r})"
            if vid in seen:
                problems.append(f"{where}, column 'video_id': duplicate of row {seen[vid]}")
            seen.setdefault(vid, i)
        out = {"video_id": vid}
        split = r.get("split")
        split = None if _blank(split) else str(split).strip()
        if split not in SPLITS:
            problems.append(f"{where}, column 'split': {split!r} is not one of {list(SPLITS)}")
        out["split"] = split
        out["path"] = _check_path(r.get("path"), root, root_real, where, problems, check_files)
        for c in ("action", "subject_id", "group"):
            if c in r:
                out[c] = None if _blank(r[c]) else str(r[c]).strip()
        if "anomaly" in r:
            out["anomaly"] = _binary(r["anomaly"], where, "anomaly", problems, allow_blank=True)
        if "segments" in r:
            out["segments"] = _json_intervals(r["segments"], where, "segments", problems, labelled=True)
        if "anomaly_intervals" in r:
            out["anomaly_intervals"] = _json_intervals(r["anomaly_intervals"], where, "anomaly_intervals", problems, labelled=False)
        for a in attributes:
            out[f"attr_{a}"] = _binary(r[f"attr_{a}"], where, f"attr_{a}", problems, allow_blank=True)
        rows.append(out)
    if problems:
        raise ManifestError(str(path), problems)
    return Manifest(path=path, root=root, rows=rows, attributes=attributes)


def _check_path(p, root: Path, root_real: str, where: str, problems: list, check_files: bool):
    if _blank(p):
        problems.append(f"{where}, column 'path': empty")
        return None
    p = str(p).strip()
    if os.path.isabs(p) or p.startswith(("/", "\\")) or (len(p) > 1 and p[1] == ":"):
        problems.append(f"{where}, column 'path': {p!r} is absolute; refused (paths must be relative to {root})")
        return None
    if ".." in Path(p).parts:
        problems.append(f"{where}, column 'path': {p!r} contains '..'; refused (must stay inside {root})")
        return None
    real = os.path.realpath(root / p)  # follows symlinks: a link leading out is refused
    if not _inside(root_real, real):
        problems.append(f"{where}, column 'path': {p!r} resolves to {real}, outside the dataset folder; refused")
        return None
    if check_files and not os.path.isfile(real):
        problems.append(f"{where}, column 'path': file not found: {root / p}")
    return p


def _binary(v, where, col, problems, allow_blank):
    if _blank(v):
        if not allow_blank:
            problems.append(f"{where}, column {col!r}: empty")
        return None
    try:
        x = float(v)
    except (TypeError, ValueError):
        x = None
    if x not in (0.0, 1.0):
        problems.append(f"{where}, column {col!r}: {v!r} is not 0 or 1")
        return None
    return int(x)


def _json_intervals(v, where, col, problems, labelled):
    if _blank(v):
        return None
    if isinstance(v, (list, tuple)):
        items = list(v)
    else:
        try:
            items = json.loads(v)
        except json.JSONDecodeError as e:
            problems.append(f"{where}, column {col!r}: malformed JSON ({e.msg} at char {e.pos}): {str(v)[:80]!r}")
            return None
    shape = "[start_s, end_s, label]" if labelled else "[start_s, end_s]"
    if not isinstance(items, list):
        problems.append(f"{where}, column {col!r}: expected a JSON list of {shape}")
        return None
    out = []
    for k, it in enumerate(items):
        ok = isinstance(it, (list, tuple)) and len(it) == (3 if labelled else 2)
        if ok:
            try:
                s, e = float(it[0]), float(it[1])
                ok = 0 <= s < e and (not labelled or (isinstance(it[2], str) and it[2] != ""))
            except (TypeError, ValueError):
                ok = False
        if not ok:
            problems.append(f"{where}, column {col!r}: item {k} {it!r} is not {shape} with 0 <= start < end")
            continue
        out.append([s, e, it[2]] if labelled else [s, e])
    return out
