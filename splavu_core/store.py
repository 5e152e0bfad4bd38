"""The feature store on disk: one root, raw latents per shard (Zarr), tables (Parquet).

    <root>/store.json                        encoder fingerprint + provenance (one encoder per store)
    <root>/datasets/<name>.json              registered dataset: manifest path, shard size
    <root>/manifests/<shard>.parquet         the validated manifest rows of one shard
    <root>/latents/<shard>/                  RAW, sensitive; committed atomically (rename)
        latents.zarr   clips (N, D), static (V, K, D), provenance in attributes
        clips.parquet  index: video_id, clip_index, start/end frame, start/end s, split
        static.parquet video_id, k, frame_index (row order = static's first axis)
        quarantine.parquet   videos that could not be used, with the reason
        _COMMIT.json   marker: provenance, manifest hash, counts
    <root>/anonymized/<aam_version>/<shard>.parquet   published features
    <root>/aam/<aam_version>/                adapter.safetensors + adapter.json

A shard directory exists only once complete: it is written under latents/.staging and renamed
into place, so a killed process leaves nothing half-written that readers could see.
"""
from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import uuid
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

CLIP_INDEX_SCHEMA = pa.schema([("video_id", pa.string()), ("clip_index", pa.int32()), ("start_frame", pa.int32()),
                               ("end_frame", pa.int32()), ("start_s", pa.float64()), ("end_s", pa.float64()),
                               ("split", pa.string())])
STATIC_INDEX_SCHEMA = pa.schema([("video_id", pa.string()), ("k", pa.int32()), ("frame_index", pa.int32())])
QUARANTINE_SCHEMA = pa.schema([("video_id", pa.string()), ("path", pa.string()), ("error", pa.string()),
                               ("when", pa.timestamp("us", tz="UTC")), ("shard", pa.string())])


class StoreError(Exception):
    pass


def default_root() -> str:
    return os.environ.get("SPLAVU_STORE", "./store")


@dataclass
class ShardLatents:
    clips: np.ndarray          # (N, D) float32
    index: pa.Table            # CLIP_INDEX_SCHEMA, one row per clip
    static: np.ndarray         # (V, K, D) float32
    static_index: pa.Table     # STATIC_INDEX_SCHEMA, V*K rows
    quarantine: pa.Table       # QUARANTINE_SCHEMA


def table_hash(table: pa.Table) -> str:
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as w:
        w.write_table(table)
    return hashlib.sha256(sink.getvalue().to_pybytes()).hexdigest()[:16]


def write_parquet_atomic(table: pa.Table, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex[:8]}.part")
    pq.write_table(table, tmp, compression="zstd")
    os.replace(tmp, path)


class FeatureStore:
    def __init__(self, root: str | os.PathLike | None = None):
        self.root = Path(root or default_root())

    @contextmanager
    def lock(self, name: str):
        """Advisory lock (POSIX flock) serialising read-modify-write of one small table of this store."""
        self.root.mkdir(parents=True, exist_ok=True)
        with open(self.root / f".{name}.lock", "a") as f:
            fcntl.flock(f, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(f, fcntl.LOCK_UN)

    # ---------------------------------------------------------------- encoder identity
    @property
    def meta_path(self) -> Path:
        return self.root / "store.json"

    def encoder_fingerprint(self) -> str | None:
        if not self.meta_path.is_file():
            return None
        return json.loads(self.meta_path.read_text())["encoder_fingerprint"]

    def claim(self, provenance: dict) -> None:
        """Bind this store to one encoder; refuse to append latents of another."""
        fp = provenance["encoder_fingerprint"]
        have = self.encoder_fingerprint()
        if have is None:
            self.root.mkdir(parents=True, exist_ok=True)
            tmp = self.meta_path.with_suffix(f".{uuid.uuid4().hex[:8]}.part")
            tmp.write_text(json.dumps(provenance, indent=1, sort_keys=True) + "\n")
            try:  # first writer wins; a concurrent second one must agree with it
                os.link(tmp, self.meta_path)
            except FileExistsError:
                pass
            finally:
                tmp.unlink()
            have = self.encoder_fingerprint()
        if have != fp:
            raise StoreError(f"store {self.root} holds latents of encoder {have}; refusing to append latents of "
                             f"encoder {fp}. Use another store root (SPLAVU_STORE) for a different encoder.")

    # ---------------------------------------------------------------- manifests of shards
    def shard_manifest_path(self, shard: str) -> Path:
        return self.root / "manifests" / f"{shard}.parquet"

    def read_shard_manifest(self, shard: str) -> pa.Table:
        p = self.shard_manifest_path(shard)
        if not p.is_file():
            raise StoreError(f"shard {shard!r} has no manifest at {p}: materialise video_manifest first")
        return pq.read_table(p)

    # ---------------------------------------------------------------- raw latents
    def shard_dir(self, shard: str) -> Path:
        return self.root / "latents" / shard

    def committed(self, shard: str) -> dict | None:
        marker = self.shard_dir(shard) / "_COMMIT.json"
        return json.loads(marker.read_text()) if marker.is_file() else None

    def committed_shards(self) -> list[str]:
        d = self.root / "latents"
        if not d.is_dir():
            return []
        return sorted(p.name for p in d.iterdir() if not p.name.startswith(".") and (p / "_COMMIT.json").is_file())

    def write_shard(self, shard: str, data: ShardLatents, provenance: dict, manifest_hash: str) -> dict:
        """Write all of a shard under .staging, then rename it into place (atomic on POSIX)."""
        import zarr

        self.claim(provenance)
        staging_root = self.root / "latents" / ".staging"
        staging_root.mkdir(parents=True, exist_ok=True)
        for stale in staging_root.glob(f"{shard}.*"):  # left by a killed writer of this shard
            shutil.rmtree(stale, ignore_errors=True)
        tmp = staging_root / f"{shard}.{os.getpid()}.{uuid.uuid4().hex[:8]}"
        tmp.mkdir()
        n, d = data.clips.shape
        assert data.clips.dtype == np.float32 and np.isfinite(data.clips).all(), f"shard {shard}: non-finite latents"
        assert data.index.num_rows == n, f"shard {shard}: {data.index.num_rows} index rows for {n} clips"
        group = zarr.open_group(str(tmp / "latents.zarr"), mode="w", zarr_format=3)
        group.attrs.update({"provenance": provenance, "shard": shard, "manifest_hash": manifest_hash})
        group.create_array("clips", data=data.clips, chunks=(min(max(n, 1), 1024), d))
        group.create_array("static", data=data.static, chunks=(min(max(len(data.static), 1), 256),) + data.static.shape[1:])
        pq.write_table(data.index, tmp / "clips.parquet", compression="zstd")
        pq.write_table(data.static_index, tmp / "static.parquet", compression="zstd")
        pq.write_table(data.quarantine, tmp / "quarantine.parquet", compression="zstd")
        marker = {"shard": shard, "encoder_fingerprint": provenance["encoder_fingerprint"],
                  "manifest_hash": manifest_hash, "clips": n, "dim": d, "static_videos": int(len(data.static)),
                  "videos": len(set(data.index.column("video_id").to_pylist())), "quarantined": data.quarantine.num_rows}
        (tmp / "_COMMIT.json").write_text(json.dumps(marker, indent=1, sort_keys=True) + "\n")
        final = self.shard_dir(shard)
        if final.exists():  # replacing an older version of the shard: move it aside first
            old = staging_root / f"{shard}.old.{uuid.uuid4().hex[:8]}"
            os.rename(final, old)
            os.rename(tmp, final)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.rename(tmp, final)
        return marker

    def read_shard(self, shard: str, with_static: bool = True) -> ShardLatents:
        import zarr

        d = self.shard_dir(shard)
        if not (d / "_COMMIT.json").is_file():
            raise StoreError(f"shard {shard!r} has no committed latents in {self.root / 'latents'}: "
                             f"materialise clip_latents for it first")
        group = zarr.open_group(str(d / "latents.zarr"), mode="r")
        fp = group.attrs["provenance"]["encoder_fingerprint"]
        if fp != self.encoder_fingerprint():
            raise StoreError(f"shard {shard!r} was written by encoder {fp}, but the store {self.root} belongs to "
                             f"{self.encoder_fingerprint()}")
        empty = np.zeros((0, 0, 0), np.float32)
        return ShardLatents(clips=group["clips"][:], index=pq.read_table(d / "clips.parquet"),
                            static=group["static"][:] if with_static else empty,
                            static_index=pq.read_table(d / "static.parquet"),
                            quarantine=pq.read_table(d / "quarantine.parquet"))

    def provenance(self) -> dict:
        if not self.meta_path.is_file():
            raise StoreError(f"{self.root} holds no latents yet (no store.json)")
        return json.loads(self.meta_path.read_text())
