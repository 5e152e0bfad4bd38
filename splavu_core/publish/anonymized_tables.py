"""Publishing anonymized feature tables from cached latents, and the bookkeeping around them.

    <root>/anonymized/<aam_version>/<shard>.parquet   one row per clip, `feature` = f_A(raw clip latent)
    <root>/aam_versions.parquet                       every recorded AAM version; exactly one is current
    <root>/.trash/                                    local roots: where deletions go first (rename, then rmtree)

The root may be an object store (storefs.py): tables are written with one PUT each (atomic per
object), deletions remove objects directly (no rename there), and the aam_versions lock is a lease.

Publishing needs only the cached raw latents and a saved adapter: the frozen encoder is never
loaded (this module must not import transformers or the encoders). Three guards stand between the
raw latents and a published table: the adapter must belong to the store's encoder, it must not be
the identity (a fresh AAM is f_A(x) == x bit for bit, so it would publish the raw latents), and no
published row may equal any raw row of the shard exactly.

Retention: `apply_retention` keeps the newest N versions plus the current one; `purge_raw_latents`
(opt-in, twice) deletes raw shards only once a complete anonymized table exists for each of them.
"""
from __future__ import annotations

import time
from datetime import datetime, timezone

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from splavu_core.store.feature_store import FeatureStore
from splavu_core.store.fs import join
from splavu_core.store.ledger import PublishError, current_version, read_versions, versions_path
from splavu_core.tasks.features import VideoFeatures
from splavu_core.tasks.loading import chosen_shards, group_videos, load_raw_features, shard_manifest_rows

CHUNK_ROWS = 16384         # adapter batch: bounded memory (12 MB at D=192); batch-invariant anyway (aam/model.py)
IDENTITY_EPS = 1e-6        # max |f(x) - x| over a shard at or below this: the adapter is the identity
INDEX_COLUMNS = ("video_id", "clip_index", "start_frame", "end_frame", "start_s", "end_s", "split")



def anonymized_schema(dim: int) -> pa.Schema:
    return pa.schema([("video_id", pa.string()), ("clip_index", pa.int32()), ("start_frame", pa.int32()),
                      ("end_frame", pa.int32()), ("start_s", pa.float64()), ("end_s", pa.float64()),
                      ("split", pa.string()), ("feature", pa.list_(pa.float32(), dim)),
                      ("aam_version", pa.string()), ("encoder_fingerprint", pa.string()),
                      ("created_at", pa.timestamp("us", tz="UTC"))])


# ---------------------------------------------------------------- paths

def anonymized_key(version: str, shard: str | None = None) -> str:
    return join("anonymized", version, f"{shard}.parquet") if shard else join("anonymized", version)


def anonymized_dir(store: FeatureStore, version: str):
    return store.loc(anonymized_key(version))


def anonymized_path(store: FeatureStore, version: str, shard: str):
    return store.loc(anonymized_key(version, shard))


def _now() -> datetime:
    return datetime.now(timezone.utc)


# ---------------------------------------------------------------- guards

def feature_matrix(table: pa.Table) -> np.ndarray:
    """The `feature` column (fixed-size or plain list of float32) as an (N, D) float32 array."""
    col = table.column("feature").combine_chunks()
    n = len(col)
    if n == 0:
        size = getattr(col.type, "list_size", 0)
        return np.zeros((0, size), np.float32)
    if col.null_count:
        raise PublishError(f"feature column has {col.null_count} null rows")
    flat = col.flatten().to_numpy(zero_copy_only=False).astype(np.float32, copy=False)
    return flat.reshape(n, -1)


def _row_hashes(a: np.ndarray, chunk: int = 4096) -> np.ndarray:
    """(N,) uint64: a vectorised multiplicative hash of each row's float32 bit pattern.
    Equal rows hash equal (-0.0 is folded into +0.0 first); collisions are re-checked exactly."""
    a = np.ascontiguousarray(a, np.float32)
    mult = np.random.default_rng(0x5EED).integers(1, 2 ** 63, a.shape[1], dtype=np.uint64) | np.uint64(1)
    out = np.empty(len(a), np.uint64)
    for s in range(0, len(a), chunk):
        bits = (a[s:s + chunk] + np.float32(0)).view(np.uint32).astype(np.uint64)  # (c, D)
        out[s:s + chunk] = (bits * mult).sum(axis=1)  # wraps mod 2**64, which is what we want
    return out


def assert_no_raw_latents(table: pa.Table, raw_clips: np.ndarray) -> None:
    """Raise if any published feature row equals (bit for bit, as float32) any raw latent row.

    Exact equality via row hashes, not np.allclose per pair: O(N) instead of O(N^2)."""
    pub = feature_matrix(table)
    raw = np.asarray(raw_clips, np.float32)
    if len(pub) == 0 or len(raw) == 0:
        return
    if pub.shape[1] != raw.shape[1]:
        return  # different widths cannot be equal rows
    h_pub, h_raw = _row_hashes(pub), _row_hashes(raw)
    candidates = np.flatnonzero(np.isin(h_pub, h_raw))
    if not len(candidates):
        return
    by_hash: dict[int, list[int]] = {}
    for j in np.flatnonzero(np.isin(h_raw, h_pub[candidates])):
        by_hash.setdefault(int(h_raw[j]), []).append(int(j))
    zero = np.float32(0)
    leaks = [i for i in candidates
             if any(np.array_equal(pub[i] + zero, raw[j] + zero) for j in by_hash.get(int(h_pub[i]), []))]
    if leaks:
        where = ""
        if "video_id" in table.column_names and "clip_index" in table.column_names:
            i = leaks[0]
            where = f"; first: video {table['video_id'][i].as_py()!r} clip {table['clip_index'][i].as_py()}"
        raise PublishError(f"{len(leaks)} of {len(pub)} published feature rows equal a raw latent row{where}: "
                           f"refusing to publish raw latents")


def assert_not_identity(raw: np.ndarray, anonymized: np.ndarray, eps: float = IDENTITY_EPS) -> float:
    """Raise if max |f(x) - x| <= eps over the shard; return that maximum otherwise (NaN for an empty shard or
    a narrower feature: a k < D projection is not the identity by construction, AAMConfig checks k < D)."""
    if len(raw) == 0 or np.shape(anonymized)[1] != np.shape(raw)[1]:
        return float("nan")
    diff = float(np.max(np.abs(np.asarray(anonymized, np.float32) - np.asarray(raw, np.float32))))
    if diff <= eps:
        raise PublishError(f"adapter is the identity (max |f(x)-x| = {diff:.3g} <= {eps:g}); refusing to publish "
                           f"raw latents. A fresh AAM is the identity by construction: train it first.")
    return diff


# ---------------------------------------------------------------- anonymizing one shard

def _load_checked_adapter(store: FeatureStore, adapter_dir):
    from splavu_core.aam.io import load_adapter  # torch + safetensors only; never the encoder

    try:
        adapter, cfg, meta = load_adapter(adapter_dir, storage_options=getattr(store.files, "storage_options", None))
    except FileNotFoundError as e:
        raise PublishError(f"no AAM adapter at {adapter_dir} ({e}): train aam_model first") from e
    want, have = store.encoder_fingerprint(), meta.get("encoder_fingerprint")
    if have != want:
        raise PublishError(f"adapter {adapter_dir} (version {meta['version']}) was trained on latents of encoder "
                           f"{have!r}, but the store {store.root} holds latents of encoder {want!r}; refusing to mix them")
    if cfg.oracle:
        raise PublishError(f"adapter {adapter_dir} (version {meta['version']}) is the oracle diagnostic, trained with "
                           f"private-attribute labels: it is never published")
    return adapter, cfg, meta


def run_adapter(adapter, cfg, clips: np.ndarray, video_ids: np.ndarray, clip_index: np.ndarray,
                 chunk: int = CHUNK_ROWS) -> np.ndarray:
    """f_A over a shard's clips, row order kept. Lone clips (N, D) unless a clip's output depends on its video's
    other clips (cfg.whole_videos: clip attention, recentring), in which case whole videos go in as padded (B, T, D)."""
    import torch

    from splavu_core.threads import intra_op_threads

    out = np.empty((len(clips), cfg.out_dim), np.float32)           # (N, k) for a keep adapter
    # one thread: the default adapter over 100k clips took 0.09-0.28 s on 2 threads, 0.04-0.06 s on one (2 shared
    # cores), with the same output bits (checked for the default and the previous default adapters)
    with torch.no_grad(), intra_op_threads(1):
        if not cfg.whole_videos:
            for s in range(0, len(clips), chunk):
                out[s:s + chunk] = adapter(torch.from_numpy(clips[s:s + chunk])).numpy()
            return out
        # group rows by video, in clip order; batch videos until ~chunk clips
        order = np.lexsort((clip_index, video_ids.astype(str)))
        bounds = np.flatnonzero(np.r_[True, video_ids[order][1:] != video_ids[order][:-1], True])
        groups = [order[a:b] for a, b in zip(bounds[:-1], bounds[1:])]
        i = 0
        while i < len(groups):
            batch, n = [], 0
            while i < len(groups) and (not batch or n + len(groups[i]) <= chunk):
                batch.append(groups[i])
                n += len(groups[i])
                i += 1
            T = max(len(g) for g in batch)
            x = np.zeros((len(batch), T, clips.shape[1]), np.float32)
            mask = np.zeros((len(batch), T), bool)
            for b, g in enumerate(batch):
                x[b, :len(g)], mask[b, :len(g)] = clips[g], True
            y = adapter(torch.from_numpy(x), torch.from_numpy(mask)).numpy()
            for b, g in enumerate(batch):
                out[g] = y[b, :len(g)]
    return out


def published_rows(store: FeatureStore, version: str, shard: str) -> int | None:
    """Rows of anonymized/<version>/<shard>.parquet from its footer; None when absent or unreadable."""
    try:
        return store.files.parquet_metadata(anonymized_key(version, shard)).num_rows
    except Exception:  # absent or unreadable: treat as absent, it gets rewritten
        return None


def anonymize_shard(store: FeatureStore, shard: str, adapter_dir) -> dict:
    """Write <root>/anonymized/<aam_version>/<shard>.parquet from the shard's cached clip latents.

    Skipped when that file already holds as many rows as the shard has committed clips."""
    t0 = time.perf_counter()
    adapter, cfg, meta = _load_checked_adapter(store, adapter_dir)
    version, fp = meta["version"], meta["encoder_fingerprint"]
    out = anonymized_path(store, version, shard)
    commit = store.committed(shard)
    if commit is None:
        raise PublishError(f"shard {shard!r} has no committed latents in {store.loc('latents')}: "
                           f"materialise clip_latents for it first")
    base = {"shard": shard, "version": version, "path": str(out), "dim": cfg.out_dim}
    if published_rows(store, version, shard) == commit["clips"]:
        return {**base, "rows": commit["clips"], "seconds": time.perf_counter() - t0, "skipped": True}

    # under the shard's commit lock: an erasure rewriting this shard (forget.py) cannot interleave between the read
    # of its latents and the write of its table (which would publish rows of erased videos again)
    with store.lock(f"shard-{shard}"):
        data = store.read_shard(shard, with_static=False)
        clips = np.ascontiguousarray(data.clips, np.float32)
        if clips.shape[1] != cfg.dim:
            raise PublishError(f"shard {shard!r} has {clips.shape[1]}-d latents, adapter {adapter_dir} expects {cfg.dim}")
        index = data.index.select(list(INDEX_COLUMNS))
        vids = index["video_id"].to_numpy(zero_copy_only=False)
        feats = run_adapter(adapter, cfg, clips, vids, index["clip_index"].to_numpy())
        if not np.isfinite(feats).all():
            raise PublishError(f"adapter {adapter_dir} produced non-finite features on shard {shard!r}")
        max_change = assert_not_identity(clips, feats)

        table = _anonymized_table(index, feats, version, fp)
        assert_no_raw_latents(table, clips)
        store.files.write_parquet(anonymized_key(version, shard), table)
    change = {} if np.isnan(max_change) else {"max_abs_change": max_change}  # none for a narrower (keep) table
    return {**base, "rows": table.num_rows, **change, "seconds": time.perf_counter() - t0,
            "skipped": False}


def _anonymized_table(index: pa.Table, feats: np.ndarray, version: str, fp: str) -> pa.Table:
    n, d = feats.shape
    feature = pa.FixedSizeListArray.from_arrays(pa.array(feats.reshape(-1), pa.float32()), d)
    created = pa.array(np.full(n, np.datetime64(_now().replace(tzinfo=None), "us")), pa.timestamp("us", tz="UTC"))
    cols = [index[c] for c in INDEX_COLUMNS] + [feature, pa.array([version] * n, pa.string()),
                                                pa.array([fp] * n, pa.string()), created]
    return pa.Table.from_arrays(cols, schema=anonymized_schema(d))


# ---------------------------------------------------------------- retention

def published_shards(store: FeatureStore, version: str) -> set[str]:
    """Shards with a file in anonymized/<version>/ (complete or not: see published_rows)."""
    return {k.rsplit("/", 1)[-1][:-len(".parquet")] for k in store.files.glob(anonymized_key(version), ".parquet")}



def retention_victims(store: FeatureStore, keep: int) -> list[str]:
    """The versions apply_retention(store, keep) would delete tables of now (the caller un-names them first)."""
    rows = sorted(read_versions(store).to_pylist(), key=lambda r: r["created_at"], reverse=True)
    kept = {r["version"] for r in rows[:keep]} | {r["version"] for r in rows if r["is_current"]}
    return [r["version"] for r in rows if r["version"] not in kept and store.files.isdir(anonymized_key(r["version"]))]


def apply_retention(store: FeatureStore, keep: int) -> dict:
    """Delete anonymized/<version>/ of all recorded versions but the newest `keep` (by created_at)
    and the current one. Folders of versions not in aam_versions (e.g. a publication in progress)
    are never touched. A table is also kept when it is the last copy of a shard whose raw latents
    were purged (deleting it would lose that shard for good)."""
    assert keep >= 1, f"keep must be >= 1, got {keep}"
    with store.lock("aam_versions"):
        rows = sorted(read_versions(store).to_pylist(), key=lambda r: r["created_at"], reverse=True)
        kept = {r["version"] for r in rows[:keep]} | {r["version"] for r in rows if r["is_current"]}
        recorded = {r["version"] for r in rows}
        raw = set(store.committed_shards())
        covered = set().union(*(published_shards(store, v) for v in kept)) if kept else set()
        deleted, protected, freed = [], [], 0
        for r in rows:
            v = r["version"]
            d = anonymized_key(v)
            if v in kept or not store.files.isdir(d):
                continue
            for shard in sorted(published_shards(store, v)):
                if shard not in raw and shard not in covered:
                    protected.append(f"{v}/{shard}")
                    covered.add(shard)  # one copy is enough
                    continue
                freed += store.files.delete(anonymized_key(v, shard))
            if not store.files.listdir(d):
                store.files.delete(d)
            deleted.append(v)
    on_disk = {v for v in store.files.listdir("anonymized") if store.files.isdir(anonymized_key(v))}
    return {"deleted": deleted, "kept": sorted(kept), "protected": protected, "bytes_freed": freed,
            "untracked": sorted(on_disk - recorded)}


def purge_raw_latents(store: FeatureStore, shards: list[str], version: str, *, allow_retraining: bool = True) -> dict:
    """Delete the raw latent folders of `shards` (opt-in; irreversible without re-running the encoder).

    Refuses, deleting nothing, unless every shard has a complete anonymized table for `version`
    (rows == committed clips in its _COMMIT.json). Refuses too while `allow_retraining` is True
    (the default): training a new AAM, and every raw-latent baseline, needs these raw latents, so
    the caller must pass allow_retraining=False to say the store will never be retrained."""
    if allow_retraining:
        raise PublishError("purge_raw_latents: refusing while allow_retraining=True: a new AAM (and any raw baseline) "
                           "is trained on these raw latents. Pass allow_retraining=False to confirm they are no longer "
                           "needed.")
    problems = []
    for shard in shards:
        commit = store.committed(shard)
        out = anonymized_path(store, version, shard)
        if commit is None:
            problems.append(f"{shard} (no committed raw latents)")
        elif not store.files.isfile(anonymized_key(version, shard)):
            problems.append(f"{shard} (no anonymized table {out})")
        elif (n := published_rows(store, version, shard)) is None:
            problems.append(f"{shard} ({out} is not readable Parquet)")
        elif n != commit["clips"]:
            problems.append(f"{shard} ({out} holds {n} rows, the shard has {commit['clips']} clips)")
    if problems:
        raise PublishError(f"purge_raw_latents: nothing deleted; these shards still need their raw latents for "
                           f"AAM version {version}: " + "; ".join(problems))
    freed = sum(store.delete_shard(s) for s in shards)
    return {"purged": list(shards), "version": version, "bytes_freed": freed}


# ---------------------------------------------------------------- reading

def _read_parquet(store: FeatureStore, key: str) -> pa.Table:
    try:
        return store.files.read_parquet(key)
    except Exception as e:
        raise PublishError(f"{store.loc(key)}: unreadable Parquet ({type(e).__name__}: {e})") from e


def _version_or_current(store: FeatureStore, version: str | None) -> str:
    version = version or current_version(store)
    if version is None:
        raise PublishError(f"no current AAM version in {versions_path(store)}: record one (record_version) or pass version=")
    return version


def _anonymized_files(store: FeatureStore, version: str, shards=None) -> list[str]:
    """Keys of the anonymized tables of `version` (all, or those of `shards`)."""
    if shards is None:
        files = sorted(store.files.glob(anonymized_key(version), ".parquet"))
        if not files:
            raise PublishError(f"AAM version {version} has no anonymized tables in {anonymized_dir(store, version)}")
        return files
    files = [anonymized_key(version, s) for s in shards]
    missing = [str(store.loc(k)) for k in files if not store.files.isfile(k)]
    if missing:
        raise PublishError(f"AAM version {version}: missing anonymized tables {missing}")
    return files


def read_anonymized(store: FeatureStore, version: str | None = None, shards: list[str] | None = None) -> pa.Table:
    """All rows of the anonymized tables of `version` (default: the current one), shards in name order.
    A file that does not read raises naming it; pass shards= to read around it."""
    version = _version_or_current(store, version)
    tables = []
    for key in _anonymized_files(store, version, shards):
        t = _read_parquet(store, key)
        got = set(pc.unique(t["aam_version"]).to_pylist()) if t.num_rows else {version}
        if got != {version}:
            raise PublishError(f"{store.loc(key)}: holds rows of AAM versions {sorted(got)}, expected only {version}")
        tables.append(t)
    return pa.concat_tables(tables)


def load_video_features(store: FeatureStore, source: str = "raw", version: str | None = None,
                        datasets: list[str] | None = None, shards: list[str] | None = None) -> list[VideoFeatures]:
    """Every video of the chosen shards as VideoFeatures, from raw latents or an anonymized table.

    n_frames is the end of the video's last clip (frames after it were never encoded), fps is
    end_frame / end_s of its first clip."""
    if source not in ("raw", "anonymized"):
        raise ValueError(f"source must be 'raw' or 'anonymized', got {source!r}")
    if source == "raw":
        return load_raw_features(store, datasets=datasets, shards=shards)
    version = _version_or_current(store, version)
    videos = []
    for shard in chosen_shards(store, sorted(published_shards(store, version)), source, datasets, shards):
        index = _read_parquet(store, anonymized_key(version, shard))
        videos += group_videos(shard, index, feature_matrix(index), shard_manifest_rows(store, shard))
    return videos
