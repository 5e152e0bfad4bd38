"""Nearest clips by cosine in an AAM version's anonymized table, at analyst speed (`splavu neighbors`).

A DuckDB `array_cosine_similarity` scan over the Parquet tables reads and converts every feature on
every query (664 ms over 100k clips). Instead each version gets an index, written when it is
published (`write_index`, called after publishing and by the feature_catalog asset), read-only after:

    <catalog dir>/neighbors/<version>/      (the store root for a local store; catalog.catalog_dir)
        features.npy   (N, D) float32, rows L2-normalised: the version's PUBLISHED anonymized features only
        id_hash.npy    (N,)   uint64 hash of each row's video_id (finding a video's rows)
        norms.npy      (N,)   the rows' norms (the query is the mean of a video's un-normalised clips)
        proj.npy       (N, R) the rows in the basis of their top-R singular vectors
        resid.npy      (N,)   the norm of what that basis leaves out of each row
        basis.npy      (D, R)
        ids.arrow      dataset, video_id, clip_index, split (Arrow IPC, memory-mapped)
        index.json     the shards (and their tables' sizes) it was built from; used only while they match

The search is exact. With q = B b + q_r, a row's score is x·q = p·b + x_r·q_r and |x_r·q_r| <= |x_r| |q_r|,
so ub = p·b + resid |q_r| bounds every score while scanning only the (N, R) projection. The rows with
the highest bounds are scored exactly; the k-th best exact score t then rules out every row with
ub < t, and the remaining rows are scored exactly too (benchmarks/neighbors.py measures it).

An index goes with its version: `prune_indexes` deletes the index of a version whose tables are gone
(retention), and one whose shards changed is rebuilt, or bypassed (read from Parquet) until it is.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from .publish import (_features, anonymized_key, current_version, published_shards, read_anonymized, read_versions,
                      refused_versions)
from .registry import dataset_of
from .store import FeatureStore, StoreError

RANK = 16          # projection width: the only part scanned in full (N x 16 float32)
FIRST_EXACT = 256  # rows scored exactly to set the pruning threshold
ARRAYS = ("features", "norms", "proj", "resid", "basis", "id_hash")


class NeighborsError(StoreError):
    pass


def index_dir(store: FeatureStore, version: str) -> Path:
    from .catalog import catalog_dir

    return catalog_dir(store) / "neighbors" / version


def _shard_files(store: FeatureStore, version: str) -> dict[str, int]:
    """shard -> byte size of its table: one listing, so checking an index's freshness reads no footer."""
    return {key.rsplit("/", 1)[-1][:-len(".parquet")]: size for key, size in sorted(store.fs.walk(anonymized_key(version)))
            if key.endswith(".parquet") and key.count("/") == 2 and not key.rsplit("/", 1)[-1].startswith(".")}


# ---------------------------------------------------------------- writing

def _arrays(table: pa.Table, rank: int) -> dict[str, np.ndarray]:
    feats = _features(table).astype(np.float32, copy=False)
    norms = np.linalg.norm(feats, axis=1).astype(np.float32)
    unit = feats / np.maximum(norms, 1e-12)[:, None]
    gram = unit.T @ unit  # uncentred: the basis captures the features' common direction too
    _, vecs = np.linalg.eigh(gram.astype(np.float64))
    basis = np.ascontiguousarray(vecs[:, ::-1][:, :min(rank, unit.shape[1])], np.float32)
    proj = unit @ basis
    resid = np.sqrt(np.maximum(1.0 - (proj.astype(np.float64) ** 2).sum(1), 0.0)).astype(np.float32)
    return {"features": unit, "norms": norms, "proj": np.ascontiguousarray(proj), "resid": resid, "basis": basis,
            "id_hash": _hashes(table["video_id"].to_pylist())}


def _hashes(video_ids) -> np.ndarray:
    """uint64 per id: finding a video's rows is one integer comparison over N, not N string comparisons."""
    return np.frombuffer(b"".join(hashlib.blake2b(v.encode(), digest_size=8).digest() for v in video_ids), np.uint64)


def _ids(table: pa.Table) -> pa.Table:
    # one chunk: `take` on a many-chunk column first concatenates it (12 ms a call at 1M rows)
    return table.select(["dataset", "video_id", "clip_index", "split"]).combine_chunks()


def _read_version(store: FeatureStore, version: str) -> tuple[pa.Table, dict[str, int]]:
    """The version's published rows (with a `dataset` column) and the size of each shard's table."""
    rows = _shard_files(store, version)
    if not rows:
        raise NeighborsError(f"AAM version {version} has no published tables: run `splavu publish --version {version}`")
    parts = []
    for shard in rows:
        t = read_anonymized(store, version, [shard]).select(["video_id", "clip_index", "split", "feature"])
        parts.append(t.append_column("dataset", pa.array([dataset_of(shard)] * t.num_rows, pa.string())))
    return pa.concat_tables(parts), rows


def write_index(store: FeatureStore, version: str, rank: int = RANK) -> dict:
    """(Re)write the neighbour index of `version` from its published tables; atomic (folder rename)."""
    t0 = time.perf_counter()
    table, rows = _read_version(store, version)
    final = index_dir(store, version)
    tmp = final.parent / f".tmp-{version}-{uuid.uuid4().hex[:8]}"
    tmp.mkdir(parents=True)
    try:
        for name, arr in _arrays(table, rank).items():
            np.save(tmp / f"{name}.npy", arr)
        ids = _ids(table)
        with pa.OSFile(str(tmp / "ids.arrow"), "wb") as f, pa.ipc.new_file(f, ids.schema) as w:
            w.write_table(ids, max_chunksize=max(1, ids.num_rows))
        meta = {"version": version, "shards": rows, "rows": table.num_rows, "rank": rank,
                "built_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
        (tmp / "index.json").write_text(json.dumps(meta, indent=1) + "\n")
        if final.exists():  # open memory maps of the old files stay valid after the unlink
            old = final.parent / f".old-{version}-{uuid.uuid4().hex[:8]}"
            os.replace(final, old)
            shutil.rmtree(old, ignore_errors=True)
        os.replace(tmp, final)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return {**meta, "path": str(final), "seconds": time.perf_counter() - t0}


def prune_indexes(store: FeatureStore) -> list[str]:
    """Delete the indexes of versions that have no published tables any more; returns those versions."""
    base = index_dir(store, "x").parent
    gone = []
    for d in sorted(base.glob("*")) if base.is_dir() else []:
        if d.name.startswith("."):
            continue
        if not published_shards(store, d.name):
            shutil.rmtree(d, ignore_errors=True)
            gone.append(d.name)
    return gone


def refresh_indexes(store: FeatureStore) -> dict:
    """Write a missing or stale index for every recorded version with tables; prune the rest."""
    written, refused = [], refused_versions(store)
    for v in read_versions(store)["version"].to_pylist():
        if v in refused and v != current_version(store):  # a refused table is not for analysts: no index
            continue
        if published_shards(store, v) and not _fresh(store, v):
            written.append(write_index(store, v)["version"])
    return {"written": written, "pruned": prune_indexes(store)}


def _fresh(store: FeatureStore, version: str) -> bool:
    try:
        meta = json.loads((index_dir(store, version) / "index.json").read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return False
    return meta.get("shards") == _shard_files(store, version)


# ---------------------------------------------------------------- searching

@dataclass
class Index:
    version: str
    features: np.ndarray
    norms: np.ndarray
    proj: np.ndarray
    resid: np.ndarray
    basis: np.ndarray
    id_hash: np.ndarray
    ids: pa.Table
    from_index: bool           # False: built in memory from Parquet (no index written yet, or stale)

    @classmethod
    def open(cls, store: FeatureStore, version: str) -> "Index":
        d = index_dir(store, version)
        if _fresh(store, version):
            # what every query scans is read into memory (~80 bytes a row); the features stay memory-mapped,
            # only the rows scored exactly are touched
            arrays = {n: np.load(d / f"{n}.npy", mmap_mode="r" if n == "features" else None) for n in ARRAYS}
            ids = pa.ipc.open_file(pa.memory_map(str(d / "ids.arrow"))).read_all()
            return cls(version=version, ids=ids, from_index=True, **arrays)
        table, _ = _read_version(store, version)
        return cls(version=version, ids=_ids(table), from_index=False, **_arrays(table, RANK))

    def rows_of(self, video_id: str, dataset: str | None) -> np.ndarray:
        rows = np.flatnonzero(self.id_hash == _hashes([video_id])[0])
        ids = self.ids.take(pa.array(rows, pa.int64()))  # a hash collision is checked here
        keep = pc.equal(ids["video_id"], video_id)
        if dataset:
            keep = pc.and_(keep, pc.equal(ids["dataset"], dataset))
        return rows[keep.to_numpy(zero_copy_only=False)]

    def search(self, q: np.ndarray, k: int, exclude: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Exact top-k rows by cosine with q, leaving out `exclude`; (rows, similarities), best first."""
        n = len(self.norms)
        q = np.asarray(q, np.float32) / max(float(np.linalg.norm(q)), 1e-12)
        b = q @ self.basis
        q_r = float(np.sqrt(max(1.0 - float(b @ b), 0.0)))
        ub = self.proj @ b
        ub += q_r * self.resid
        ub[exclude] = -np.inf
        k = min(k, n - len(exclude))
        if k <= 0:
            return np.zeros(0, np.int64), np.zeros(0, np.float32)
        m = max(FIRST_EXACT, 4 * k)
        first = np.argpartition(ub, n - m)[n - m:] if m < n else np.arange(n)
        first = np.sort(first[np.isfinite(ub[first])])
        exact = self.features[first] @ q
        t = np.partition(exact, len(exact) - k)[len(exact) - k] - 1e-6  # float slack: never prune a tie
        rest = np.flatnonzero(ub >= t)
        cand = np.union1d(first, rest) if len(rest) < n // 2 else np.flatnonzero(np.isfinite(ub))
        scores = self.features[cand] @ q if len(cand) < n // 2 else (self.features @ q)[cand]
        self.last_scored = len(cand)  # rows scored exactly (the benchmark reports it)
        top = np.argsort(-scores, kind="stable")[:k]
        return cand[top], scores[top]


def refuse_if_refused(store: FeatureStore, version: str) -> None:
    """A version the privacy budget refused stays out of analysts' reach, here as in the catalog."""
    refused = refused_versions(store).get(version)
    if refused and version != current_version(store):
        raise NeighborsError(f"AAM version {version} was refused by the privacy budget ({refused['why']}): its table "
                             f"is not for analysts. The data engineer inspects it outside the catalog "
                             f"(publish.read_anonymized); train a version that passes, then `splavu publish`.")


def neighbors(store: FeatureStore, video_id: str, k: int = 10, reduce: str = "mean", dataset: str | None = None,
              version: str | None = None, index: Index | None = None) -> pa.Table:
    """The k clips of `version`'s anonymized table (default: the current one) most cosine-similar to the mean
    (or first) clip of `video_id`, its own clips left out: video_id, clip_index, split, similarity, dataset."""
    if reduce not in ("mean", "first"):
        raise NeighborsError(f"reduce must be 'mean' or 'first', got {reduce!r}")
    if k < 1:
        raise NeighborsError(f"--k must be >= 1, got {k}")
    if index is None or (version and version != index.version):
        version = version or current_version(store)
        if version is None:
            raise NeighborsError(explain_no_current(store))
        known = read_versions(store)["version"].to_pylist()
        if version not in known:
            raise NeighborsError(f"AAM version {version!r} is not recorded in {store.root} (known: {known or 'none'})")
        index = Index.open(store, version)
    version = index.version
    refuse_if_refused(store, version)
    own = index.rows_of(video_id, dataset)
    if len(own) == 0:
        raise NeighborsError(explain_missing_video(store, video_id, dataset, version))
    found = sorted(set(index.ids["dataset"].take(own).to_pylist()))
    if len(found) > 1:
        raise NeighborsError(f"video {video_id!r} is in several datasets {found}: pass --dataset")
    own = own[np.argsort(index.ids["clip_index"].take(own).to_numpy())]
    feats = np.asarray(index.features[own], np.float32) * np.asarray(index.norms[own], np.float32)[:, None]
    q = feats.mean(0) if reduce == "mean" else feats[0]
    rows, sims = index.search(q, k, own)
    ids = index.ids.take(pa.array(rows, pa.int64()))
    return pa.table({"video_id": ids["video_id"], "clip_index": ids["clip_index"], "split": ids["split"],
                     "similarity": pa.array(sims.astype(np.float64)), "dataset": ids["dataset"]})


# ---------------------------------------------------------------- explaining an empty answer

def _budget_reason(store: FeatureStore, version: str) -> str | None:
    """Why a gate refused `version`, from the version ledger (None: not measured / passed)."""
    from .ledger import budget_verdict, privacy_threshold, read_verdicts

    verdicts = read_verdicts(store, version)
    label = {"privacy": "the privacy budget", "utility": "the utility gate"}
    failed = [f"refused by {label.get(gate, gate)} ({v['why']})" for gate, v in verdicts.items()
              if not v.get("passed", True)]
    if failed:
        return "; ".join(failed)
    if verdicts:
        return None
    try:  # a store gated before the ledger recorded verdicts: the cached privacy measurement
        measure = store.fs.read_json(f"reports/privacy_budget/{version}.json")["measure"]
    except (FileNotFoundError, KeyError, ValueError):
        return None
    ok, why = budget_verdict(measure, privacy_threshold())
    return None if ok else f"refused by the privacy budget ({why})"


def version_status(store: FeatureStore) -> list[str]:
    """One phrase per recorded version: shards published, current or why not."""
    from .registry import registered

    all_shards = {s for reg in registered(store).values() for s in reg["shards"]} | set(store.committed_shards())
    out = []
    for r in sorted(read_versions(store).to_pylist(), key=lambda r: r["created_at"], reverse=True):
        v = r["version"]
        done = len(published_shards(store, v) & all_shards)
        state = "current" if r["is_current"] else (_budget_reason(store, v) or
                                                   ("not published everywhere" if done < len(all_shards) else "not current"))
        out.append(f"{v} ({r['created_at']:%Y-%m-%d %H:%M}, {done}/{len(all_shards)} shards published, {state})")
    return out


def explain_no_current(store: FeatureStore) -> str:
    status = version_status(store)
    if not status:
        return (f"no AAM version in {store.root}, so there is no anonymized table to search: "
                f"run `splavu train`, then `splavu publish`")
    newest = status[0].split(" ", 1)[0]
    meanwhile = (f"a refused version's table is not for analysts" if newest in refused_versions(store)
                 else f"meanwhile search a version explicitly: --version {newest}")
    return (f"no AAM version is current, so the current anonymized table is empty. Versions: {'; '.join(status)}. "
            f"It fills when a version is published to every shard and passes the privacy budget (train a stronger "
            f"AAM, or set $SPLAVU_PRIVACY_BUDGET, then `splavu publish`); {meanwhile}")


def explain_missing_video(store: FeatureStore, video_id: str, dataset: str | None, version: str) -> str:
    from .manifest import load_manifest
    from .registry import registered

    where = [name for name, reg in registered(store).items() if (dataset in (None, name)) and any(
        r["video_id"] == video_id for r in load_manifest(reg["manifest"], check_files=False).rows)]
    of = f" of dataset {dataset!r}" if dataset else ""
    if not where:
        return f"no video {video_id!r}{of} is registered in {store.root} (splavu sql \"SELECT video_id FROM videos\")"
    return (f"video {video_id!r} (dataset {where[0]!r}) is not in the anonymized table of AAM version {version}: "
            f"its shard has no latents or is not published with that version yet (splavu extract; splavu publish)")
