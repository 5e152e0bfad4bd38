"""Nearest clips by cosine in an AAM version's anonymized table (`splavu neighbors`).

A DuckDB `array_cosine_similarity` scan over the Parquet tables reads and converts every feature on
every query. Instead each version's published rows are written once, when it is published
(`write_index`, called after publishing and by the feature_catalog asset), read-only after:

    <catalog dir>/neighbors/<version>/      (the store root for a local store; catalog.catalog_dir)
        features.npy   (N, D) float32, rows L2-normalised: the version's PUBLISHED anonymized features only
                       (D is whatever width the published rows have)
        norms.npy      (N,)   the rows' norms (the query is the mean of a video's un-normalised clips)
        id_hash.npy    (N,)   uint64 hash of each row's video_id (finding a video's rows)
        ids.arrow      dataset, video_id, clip_index, split (Arrow IPC, memory-mapped)
        ivf.faiss      only for tables of $SPLAVU_ANN_MIN_ROWS rows or more (or when asked): the approximate index
        index.json     the shards (and their tables' sizes) it was built from; used only while they match

Two searches (benchmarks/neighbors.py measures both, side by side):

- exact (the default): the memory-mapped rows times the query, BLOCK rows at a time (one BLAS matrix-vector
  product per block, so memory stays bounded at any N), the top k of each block kept by argpartition.
- approximate: faiss IndexIVFScalarQuantizer (inner product, 8-bit codes: N x D bytes more on disk); the
  `nprobe` nearest of its lists are scanned and their best RERANK candidates re-scored exactly from the
  float32 rows, so only the choice of candidates is approximate. Its recall depends on the rows having
  structure (clustered rows: 1.0 at nprobe 8; isotropic random rows: far lower; see docs/history.md).

An index goes with its version: `prune_indexes` deletes the index of a version whose tables are gone
(retention), and one whose shards changed is rebuilt, or bypassed (read from Parquet) until it is.
"""
from __future__ import annotations

import hashlib
import json
import math
import os
import shutil
import time
import uuid
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from splavu_core.ingest.datasets import dataset_of, registered
from splavu_core.ingest.manifest import load_manifest
from splavu_core.publish.anonymized_tables import anonymized_key, feature_matrix, published_shards, read_anonymized
from splavu_core.serve.catalog import catalog_dir
from splavu_core.settings import settings
from splavu_core.store.feature_store import FeatureStore, StoreError
from splavu_core.store.ledger import (
    budget_verdict,
    current_version,
    privacy_threshold,
    read_verdicts,
    read_versions,
    refused_versions,
)

RETRIED = Counter()  # searches this process retried, by what it met (benchmarks/concurrency.py)
BLOCK = 1 << 18        # rows per matrix-vector product of the exact search (1 MB of scores a block)
RERANK = 128           # candidates the approximate search re-scores exactly
MODES = ("auto", "exact", "approximate")


class NeighborsError(StoreError):
    pass


def index_dir(store: FeatureStore, version: str) -> Path:
    return catalog_dir(store) / "neighbors" / version


def _shard_files(store: FeatureStore, version: str) -> dict[str, int]:
    """shard -> byte size of its table: one listing, so checking an index's freshness reads no footer."""
    return {key.rsplit("/", 1)[-1][:-len(".parquet")]: size for key, size in sorted(store.files.walk(anonymized_key(version)))
            if key.endswith(".parquet") and key.count("/") == 2 and not key.rsplit("/", 1)[-1].startswith(".")}


# ---------------------------------------------------------------- writing

def _arrays(table: pa.Table) -> dict[str, np.ndarray]:
    feats = feature_matrix(table).astype(np.float32, copy=False)
    norms = np.linalg.norm(feats, axis=1).astype(np.float32)
    unit = np.ascontiguousarray(feats / np.maximum(norms, 1e-12)[:, None], np.float32)
    return {"features": unit, "norms": norms, "id_hash": _hashes(table["video_id"].to_pylist())}


def _hashes(video_ids) -> np.ndarray:
    """uint64 per id: finding a video's rows is one integer comparison over N, not N string comparisons."""
    return np.frombuffer(b"".join(hashlib.blake2b(v.encode(), digest_size=8).digest() for v in video_ids), np.uint64)


def _ids(table: pa.Table) -> pa.Table:
    # one chunk: `take` on a many-chunk column first concatenates it (12 ms a call at 1M rows)
    return table.select(["dataset", "video_id", "clip_index", "split"]).combine_chunks()


def default_lists(n: int) -> int:
    """IVF lists: the power of two nearest sqrt(N) (1,024 at 1M rows), at least 1."""
    return max(1, 2 ** round(math.log2(max(1.0, math.sqrt(n)))))


def build_ivf(unit: np.ndarray, nlist: int | None = None, seed: int = 0):
    """A faiss IVF index (inner product, 8-bit scalar quantizer) over L2-normalised rows; k-means on a fixed sample
    of 64 rows per list."""
    import faiss  # here: a 0.4 s import that only the approximate mode (tables past $SPLAVU_ANN_MIN_ROWS) needs

    n, d = unit.shape
    nlist = min(nlist or default_lists(n), n)
    index = faiss.IndexIVFScalarQuantizer(faiss.IndexFlatIP(d), d, nlist, faiss.ScalarQuantizer.QT_8bit,
                                          faiss.METRIC_INNER_PRODUCT)
    sample = unit if n <= 64 * nlist else unit[np.sort(np.random.default_rng(seed).choice(n, 64 * nlist, replace=False))]
    index.cp.seed = seed
    index.train(np.ascontiguousarray(sample, np.float32))
    for s in range(0, n, BLOCK):
        index.add(np.ascontiguousarray(unit[s:s + BLOCK], np.float32))
    return index


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


def write_index(store: FeatureStore, version: str, approximate: bool | None = None, nlist: int | None = None) -> dict:
    """(Re)write the neighbour index of `version` from its published tables; atomic (folder rename).
    approximate: also write the faiss IVF index (None: when the table has $SPLAVU_ANN_MIN_ROWS rows or more)."""
    t0 = time.perf_counter()
    table, rows = _read_version(store, version)
    approximate = table.num_rows >= settings().ann_min_rows if approximate is None else approximate
    final = index_dir(store, version)
    tmp = final.parent / f".tmp-{version}-{uuid.uuid4().hex[:8]}"
    tmp.mkdir(parents=True)
    try:
        arrays = _arrays(table)
        for name, arr in arrays.items():
            np.save(tmp / f"{name}.npy", arr)
        ids = _ids(table)
        with pa.OSFile(str(tmp / "ids.arrow"), "wb") as f, pa.ipc.new_file(f, ids.schema) as w:
            w.write_table(ids, max_chunksize=max(1, ids.num_rows))
        ivf = None
        if approximate:
            import faiss  # see build_ivf

            ivf = build_ivf(arrays["features"], nlist)
            faiss.write_index(ivf, str(tmp / "ivf.faiss"))
        meta = {"version": version, "build": uuid.uuid4().hex, "shards": rows, "rows": table.num_rows,
                "dim": int(arrays["features"].shape[1]),
                "ivf_lists": ivf.nlist if ivf is not None else None,
                "built_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
        (tmp / "index.json").write_text(json.dumps(meta, indent=1) + "\n")
        old = None
        if final.exists():  # open memory maps of the old files stay valid after the unlink
            old = final.parent / f".old-{version}-{uuid.uuid4().hex[:8]}"
            os.replace(final, old)
        os.replace(tmp, final)  # the folder is missing only between these two renames (Index.open retries)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
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
        if published_shards(store, v) and not index_is_fresh(store, v):
            written.append(write_index(store, v)["version"])
    return {"written": written, "pruned": prune_indexes(store)}


def _index_meta(d: Path) -> dict | None:
    try:
        return json.loads((d / "index.json").read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return None


class _Rebuilt(Exception):
    """The index was rewritten while it was being read."""


def index_is_fresh(store: FeatureStore, version: str) -> bool:
    meta = _index_meta(index_dir(store, version))
    return meta is not None and meta.get("shards") == _shard_files(store, version)


# ---------------------------------------------------------------- searching

def exact_top_k(features: np.ndarray, q: np.ndarray, k: int, exclude: np.ndarray | None = None,
                block: int = BLOCK) -> tuple[np.ndarray, np.ndarray]:
    """The k rows of `features` with the highest dot product with q, `exclude` left out: (rows, scores), best
    first, ties by row. `features` may be memory-mapped: it is read `block` rows at a time, and after the first
    block only the rows scoring at least the k-th best so far are looked at again."""
    excl = np.sort(np.asarray(exclude if exclude is not None else [], np.int64))
    best_r, best_s = np.zeros(0, np.int64), np.zeros(0, np.float32)
    for s in range(0, len(features), block):
        sc = np.asarray(features[s:s + block]) @ q
        sc[excl[(excl >= s) & (excl < s + len(sc))] - s] = -np.inf
        sel = np.flatnonzero(sc >= best_s[-1]) if len(best_s) == k else np.flatnonzero(np.isfinite(sc))
        if len(sel) > k:
            sel = sel[np.argpartition(sc[sel], len(sel) - k)[len(sel) - k:]]
        rows, scores = np.concatenate([best_r, sel + s]), np.concatenate([best_s, sc[sel]])
        order = np.lexsort((rows, -scores))[:k]
        best_r, best_s = rows[order], scores[order]
    return best_r, best_s


@dataclass
class Index:
    version: str
    features: np.ndarray       # (N, D) float32, unit rows (memory-mapped when read from disk)
    norms: np.ndarray
    id_hash: np.ndarray
    ids: pa.Table
    from_index: bool           # False: built in memory from Parquet (no index written yet, or stale)
    ivf: object = None         # faiss IVF index (approximate search), when the version has one

    @classmethod
    def open(cls, store: FeatureStore, version: str) -> "Index":
        """The version's index when it is up to date, else its rows read from the Parquet tables. An index rewritten
        while it is read (write_index swaps the folder) is read again: every file of one build, or none."""
        for _ in range(3):
            try:
                index = cls._read_index(store, version)
            except (FileNotFoundError, _Rebuilt):
                time.sleep(0.05)
                continue
            if index is not None:
                return index
            break
        table, _ = _read_version(store, version)
        return cls(version=version, ids=_ids(table), from_index=False, **_arrays(table))

    @classmethod
    def _read_index(cls, store: FeatureStore, version: str) -> "Index | None":
        d = index_dir(store, version)
        meta = _index_meta(d)
        if meta is None or meta.get("shards") != _shard_files(store, version):
            return None
        ivf = None
        if (d / "ivf.faiss").is_file():
            import faiss  # see build_ivf

            ivf = faiss.read_index(str(d / "ivf.faiss"))
        index = cls(version=version, features=np.load(d / "features.npy", mmap_mode="r"),
                    norms=np.load(d / "norms.npy"), id_hash=np.load(d / "id_hash.npy"),
                    ids=pa.ipc.open_file(pa.memory_map(str(d / "ids.arrow"))).read_all(), from_index=True, ivf=ivf)
        if _index_meta(d) != meta or len(index.features) != index.ids.num_rows:
            raise _Rebuilt(version)
        return index

    @property
    def dim(self) -> int:
        return int(self.features.shape[1])

    def rows_of(self, video_id: str, dataset: str | None) -> np.ndarray:
        rows = np.flatnonzero(self.id_hash == _hashes([video_id])[0])
        ids = self.ids.take(pa.array(rows, pa.int64()))  # a hash collision is checked here
        keep = pc.equal(ids["video_id"], video_id)
        if dataset:
            keep = pc.and_(keep, pc.equal(ids["dataset"], dataset))
        return rows[keep.to_numpy(zero_copy_only=False)]

    def search(self, q: np.ndarray, k: int, exclude: np.ndarray, mode: str = "exact",
               nprobe: int = 8) -> tuple[np.ndarray, np.ndarray]:
        """Top-k rows by cosine with q, leaving out `exclude`; (rows, similarities), best first.
        mode "exact": every row scored; "approximate": the IVF index's candidates, re-scored exactly."""
        q = np.asarray(q, np.float32) / max(float(np.linalg.norm(q)), 1e-12)
        if mode == "exact":
            return exact_top_k(self.features, q, k, exclude)
        if self.ivf is None:
            raise NeighborsError(f"AAM version {self.version} has no approximate index (tables of "
                                 f"{settings().ann_min_rows:,}+ rows get one; `splavu publish` writes it): search it exactly")
        self.ivf.nprobe = int(nprobe)
        want = max(RERANK, k) + len(exclude)  # the own clips come back too, and are dropped
        _, cand = self.ivf.search(q[None, :], want)
        cand = np.setdiff1d(cand[0][cand[0] >= 0], exclude)
        return _rescore(self.features, cand, q, k)


def _rescore(features: np.ndarray, cand: np.ndarray, q: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Exact scores of the candidate rows (sorted, so a memory map is read forward); top k, ties by row."""
    scores = np.asarray(features[cand]) @ q if len(cand) else np.zeros(0, np.float32)
    order = np.lexsort((cand, -scores))[:k]
    return cand[order], scores[order]


def refuse_if_refused(store: FeatureStore, version: str) -> None:
    """A version the privacy budget refused stays out of analysts' reach, here as in the catalog."""
    refused = refused_versions(store).get(version)
    if refused and version != current_version(store):
        raise NeighborsError(f"AAM version {version} was refused by the privacy budget ({refused['why']}): its table "
                             f"is not for analysts. The data engineer inspects it outside the catalog "
                             f"(publish.read_anonymized); train a version that passes, then `splavu publish`.")


def neighbors(store: FeatureStore, video_id: str, k: int = 10, reduce: str = "mean", dataset: str | None = None,
              version: str | None = None, index: Index | None = None, mode: str = "auto", nprobe: int = 8) -> pa.Table:
    """The k clips of `version`'s anonymized table (default: the current one) most cosine-similar to the mean
    (or first) clip of `video_id`, its own clips left out: video_id, clip_index, split, similarity, dataset.
    mode: "exact", "approximate" (the version's IVF index, `nprobe` lists), or "auto" (approximate when the
    version has an IVF index, i.e. a table of $SPLAVU_ANN_MIN_ROWS rows or more; else exact)."""
    if reduce not in ("mean", "first"):
        raise NeighborsError(f"reduce must be 'mean' or 'first', got {reduce!r}")
    if k < 1:
        raise NeighborsError(f"--k must be >= 1, got {k}")
    if mode not in MODES:
        raise NeighborsError(f"search mode must be one of {', '.join(MODES)}, got {mode!r}")
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
    if mode == "auto":
        mode = "approximate" if index.ivf is not None else "exact"
    rows, sims = index.search(q, k, own, mode=mode, nprobe=nprobe)
    ids = index.ids.take(pa.array(rows, pa.int64()))
    return pa.table({"video_id": ids["video_id"], "clip_index": ids["clip_index"], "split": ids["split"],
                     "similarity": pa.array(sims.astype(np.float64)), "dataset": ids["dataset"]})


def search(store: FeatureStore, video_id: str, k: int = 10, reduce: str = "mean", dataset: str | None = None,
           version: str | None = None, mode: str = "auto", nprobe: int = 8, note=lambda message: None) -> pa.Table:
    """`splavu neighbors`: neighbors() on `version` (default: the current one) through its index, note(message) when
    its Parquet tables have to be read instead. A version retired, re-published or switched while the search ran
    (its tables or index gone or replaced, the current version another) is searched again once, from the ledger;
    if the store changes again meanwhile, one line says so (StoreChangedError)."""
    for attempt in (0, 1):
        used = version or current_version(store)
        try:
            index = None
            if used in read_versions(store)["version"].to_pylist():  # else neighbors() explains what is missing
                refuse_if_refused(store, used)
                index = Index.open(store, used)
                if not index.from_index:
                    note(f"AAM version {used} has no up-to-date neighbour index, so its Parquet tables were read "
                         f"instead (slow); `splavu publish --version {used}` writes it")
            return neighbors(store, video_id, k=k, reduce=reduce, dataset=dataset, version=used, index=index,
                             mode=mode, nprobe=nprobe)
        except (FileNotFoundError, NeighborsError) as e:
            changed = isinstance(e, FileNotFoundError) or (version is None and current_version(store) != used)
            if not changed:
                raise
            if attempt == 0:
                RETRIED[type(e).__name__] += 1
                time.sleep(0.1)
                continue
            raise StoreChangedError(
                f"the store changed while this search ran, and again when it was retried (AAM version {used}: "
                f"{_first_line(e)}). A version being published, promoted or retired, or an erasure, rewrites its "
                f"tables and index; nothing is wrong with the request: run it again in a moment") from e


class StoreChangedError(NeighborsError):
    """The version's files changed under a search, twice."""


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__


# ---------------------------------------------------------------- explaining an empty answer

def _budget_reason(store: FeatureStore, version: str) -> str | None:
    """Why a gate refused `version`, from the version ledger (None: not measured / passed)."""
    verdicts = read_verdicts(store, version)
    label = {"privacy": "the privacy budget", "utility": "the utility gate"}
    failed = [f"refused by {label.get(gate, gate)} ({v['why']})" for gate, v in verdicts.items()
              if not v.get("passed", True)]
    if failed:
        return "; ".join(failed)
    if verdicts:
        return None
    try:  # a store gated before the ledger recorded verdicts: the cached privacy measurement
        measure = store.files.read_json(f"reports/privacy_budget/{version}.json")["measure"]
    except (FileNotFoundError, KeyError, ValueError):
        return None
    ok, why = budget_verdict(measure, privacy_threshold())
    return None if ok else f"refused by the privacy budget ({why})"


def version_status(store: FeatureStore) -> list[str]:
    """One phrase per recorded version: shards published, current or why not."""
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
            f"It fills when a version is published to every shard and passes both gates: `splavu publish` prints "
            f"what each gate is missing (an undecidable part: more validation videos; a failed one: a narrower keep "
            f"width, `splavu curve` then `splavu train --config '{{\"keep\": K}}'`; overriding a gate is recorded: "
            f"`splavu promote VERSION --force --reason TEXT`); {meanwhile}")


def explain_missing_video(store: FeatureStore, video_id: str, dataset: str | None, version: str) -> str:
    where = [name for name, reg in registered(store).items() if (dataset in (None, name)) and any(
        r["video_id"] == video_id for r in load_manifest(reg["manifest"], check_files=False).rows)]
    of = f" of dataset {dataset!r}" if dataset else ""
    if not where:
        return f"no video {video_id!r}{of} is registered in {store.root} (splavu sql \"SELECT video_id FROM videos\")"
    return (f"video {video_id!r} (dataset {where[0]!r}) is not in the anonymized table of AAM version {version}: "
            f"its shard has no latents or is not published with that version yet (splavu extract; splavu publish)")
