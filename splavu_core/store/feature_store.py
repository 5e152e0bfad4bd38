"""The feature store: one root, raw latents per shard (Zarr), tables (Parquet).

The root is a local folder or an fsspec URL (s3://bucket/prefix, memory://name); storefs.py says
how each operation maps onto either. The layout is the same on both, except inside latents/<shard>/:

    <root>/store.json                        encoder fingerprint + provenance (one encoder per store)
    <root>/datasets/<name>.json              registered dataset: manifest path, shard size
    <root>/manifests/<shard>.parquet         the validated manifest rows of one shard, WITHOUT private labels
                                             (attr_*, subject_id, group)
    <root>/labels/<shard>.parquet            video_id + attr_*, subject_id, group of one shard: private, read by the
                                             evaluation through read_shard_manifest, never by the analysts' catalog
    <root>/latents/<shard>/                  RAW, sensitive
        _COMMIT.json   marker: provenance, manifest hash, counts (+ "data" on object stores)
        latents.zarr   clips (N, D), static (V, K, D), provenance in attributes
        clips.parquet  index: video_id, clip_index, start/end frame, start/end s, split
        static.parquet video_id, k, frame_index (row order = static's first axis)
        quarantine.parquet   videos that could not be used, with the reason
    <root>/anonymized/<aam_version>/<shard>.parquet   published features
    <root>/aam/<aam_version>/                adapter.safetensors + adapter.json
    <root>/_locks/<name>.json                object stores only: the lease of a held lock

Crash-safe shard commit, two ways:

- Local folder (rename commit, unchanged): the shard is written under latents/.staging/ and
  renamed into place, so latents/<shard>/ exists only once complete and its files are the data.
- Object store (marker commit): there is no rename, and a prefix cannot appear at once. Every object
  of an attempt goes under the immutable prefix latents/<shard>/attempts/<attempt-id>/ (the four data
  files above), then one PUT of latents/<shard>/_COMMIT.json names it ("data": "attempts/<id>"). That
  PUT is the commit: readers find data only through the marker, so a writer killed before it leaves an
  attempt nothing names (invisible); a replaced shard switches with the marker, all at once. Writers of
  one shard are serialised by the lease `shard-<shard>`; under it, the next writer deletes every attempt
  the marker does not name (killed writers' debris, and the generation replaced last time: the one just
  replaced is kept until then, so readers that resolved the old marker can finish). A reader re-reads the
  marker after reading and retries if it changed, so it never returns a mix of two generations, and
  never data of an attempt deleted under it (deletion only follows a newer marker).

Why not the marker on local disk too: the rename already gives the same guarantee, keeps the layout
users, tests and the catalog's glob views rely on (latents/*/clips.parquet), and keeps reruns
byte-identical file for file. Readers handle both (no "data" key: the shard folder itself).
"""
from __future__ import annotations

import json
import os
import shutil
import time
import uuid
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from splavu_core.settings import settings
from splavu_core.store.fs import StoreError, StoreFS, join, open_root

CLIP_INDEX_SCHEMA = pa.schema([("video_id", pa.string()), ("clip_index", pa.int32()), ("start_frame", pa.int32()),
                               ("end_frame", pa.int32()), ("start_s", pa.float64()), ("end_s", pa.float64()),
                               ("split", pa.string())])
STATIC_INDEX_SCHEMA = pa.schema([("video_id", pa.string()), ("k", pa.int32()), ("frame_index", pa.int32())])
QUARANTINE_SCHEMA = pa.schema([("video_id", pa.string()), ("path", pa.string()), ("error", pa.string()),
                               ("when", pa.timestamp("us", tz="UTC")), ("shard", pa.string())])
COMMIT_FILE = "_COMMIT.json"
READ_RETRIES = 5  # a reader that sees the marker change under it this often in a row gives up


def default_root() -> str:
    return settings().store


@dataclass
class ShardLatents:
    clips: np.ndarray          # (N, D) float32
    index: pa.Table            # CLIP_INDEX_SCHEMA, one row per clip
    static: np.ndarray         # (V, K, D) float32
    static_index: pa.Table     # STATIC_INDEX_SCHEMA, V*K rows
    quarantine: pa.Table       # QUARANTINE_SCHEMA


def write_parquet_atomic(table: pa.Table, path: Path) -> None:
    """A local Parquet file, replaced atomically (temp file + os.replace). Stores use store.files.write_parquet."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex[:8]}.part")
    pq.write_table(table, tmp, compression="zstd")
    os.replace(tmp, path)


PRIVATE_PREFIX = "attr_"  # private-attribute ground truth: evaluation only, never in an analyst-readable file
# who is who, and the perceived-gender group: a subject_id links a person's videos without any attacker, so both are
# private like attr_* (labels/), read by evaluation (re-id, gait, bias, the validation carve) and `forget --subject`
PRIVATE_COLUMNS = ("subject_id", "group")


def is_private_column(name: str) -> bool:
    """A manifest column no analyst may read: attr_* and PRIVATE_COLUMNS."""
    return name.startswith(PRIVATE_PREFIX) or name in PRIVATE_COLUMNS


def labels_key(shard: str) -> str:
    return join("labels", f"{shard}.parquet")


def split_private_labels(table: pa.Table) -> tuple[pa.Table, pa.Table | None]:
    """(the table without its private columns (attr_*, subject_id, group), video_id + those columns or None when
    there are none)."""
    private = [n for n in table.column_names if is_private_column(n)]
    if not private:
        return table, None
    public = table.drop_columns(private)
    return public.replace_schema_metadata(table.schema.metadata), table.select(["video_id", *private])


class FeatureStore:
    def __init__(self, root: str | os.PathLike | None = None, storage_options: dict | None = None):
        self.files: StoreFS = open_root(root or default_root(), storage_options)
        self.root = self.files.loc()  # a Path for a local root (as before), the URL string for an object store
        self._fingerprint: str | None = None

    @property
    def local(self) -> bool:
        return self.files.local

    def loc(self, *parts):
        """Where a key lives, for messages and tools: a Path (local root) or a URL string (object store)."""
        return self.files.loc(join(*parts))

    def lock(self, name: str, on_wait=None):
        """Serialise read-modify-write of one small table of this store: flock locally, a lease on object stores."""
        return self.files.lock(name, on_wait=on_wait)

    # ---------------------------------------------------------------- encoder identity
    @property
    def meta_path(self):
        return self.loc("store.json")

    def encoder_fingerprint(self) -> str | None:
        if self._fingerprint is None:  # store.json never changes once written (first writer wins): cache it
            try:
                self._fingerprint = self.files.read_json("store.json")["encoder_fingerprint"]
            except FileNotFoundError:
                return None
        return self._fingerprint

    def claim(self, provenance: dict) -> None:
        """Bind this store to one encoder; refuse to append latents of another."""
        fp = provenance["encoder_fingerprint"]
        have = self.encoder_fingerprint()
        if have is None:
            body = (json.dumps(provenance, indent=1, sort_keys=True) + "\n").encode()
            # first writer wins (link locally, If-None-Match on S3); a concurrent second one must agree with it
            self.files.put_if_absent("store.json", body)
            have = self.encoder_fingerprint()
        if have != fp:
            raise StoreError(f"store {self.root} holds latents of encoder {have}; refusing to append latents of "
                             f"encoder {fp}. Use another store root (SPLAVU_STORE) for a different encoder.")

    # ---------------------------------------------------------------- manifests of shards
    def shard_manifest_path(self, shard: str):
        return self.loc("manifests", f"{shard}.parquet")

    def read_shard_manifest(self, shard: str) -> pa.Table:
        """The shard's manifest rows WITH their private columns (attr_*, subject_id, group; joined from
        labels/<shard>.parquet)."""
        key = join("manifests", f"{shard}.parquet")
        if not self.files.isfile(key):
            raise StoreError(f"shard {shard!r} has no manifest at {self.loc(key)}: materialise video_manifest first")
        table = self.files.read_parquet(key)
        lkey = labels_key(shard)
        if not self.files.isfile(lkey):
            return table  # no private labels, or a store written before they were split off
        labels = self.files.read_parquet(lkey)
        at = pc.index_in(table["video_id"], value_set=labels["video_id"])
        if at.null_count:
            raise StoreError(f"{self.loc(lkey)} lacks rows of {at.null_count} video(s) of {self.loc(key)}: re-materialise "
                             f"video_manifest for shard {shard!r}")
        for name in labels.column_names[1:]:
            if name in table.column_names:  # a manifest not yet split again after a crash: its own column stands
                continue
            table = table.append_column(labels.schema.field(name), labels[name].take(at))
        return table

    def write_shard_manifest_table(self, shard: str, table: pa.Table) -> None:
        """The manifest without attr_* (what the catalog's `videos` view reads) and the labels in labels/
        (outside every path the analysts' connection may open). Labels first: a crash in between leaves the old
        manifest, which the next write (or the catalog build's migration) splits again."""
        public, labels = split_private_labels(table)
        if labels is not None:
            self.files.write_parquet(labels_key(shard), labels)
        elif self.files.isfile(labels_key(shard)):
            self.files.delete(labels_key(shard))
        self.files.write_parquet(join("manifests", f"{shard}.parquet"), public)

    def migrate_private_labels(self) -> list[str]:
        """Split the private columns out of manifests written before labels/ existed (or before subject_id and group
        were private); returns the shards rewritten. Labels already split off are kept and joined first."""
        done = []
        for key in self.files.match("manifests/*.parquet"):
            if any(is_private_column(n) for n in self.files.parquet_schema(key).names):
                shard = key.rsplit("/", 1)[-1][:-len(".parquet")]
                self.write_shard_manifest_table(shard, self.read_shard_manifest(shard))
                done.append(shard)
        return done

    # ---------------------------------------------------------------- raw latents
    def shard_dir(self, shard: str):
        return self.loc("latents", shard)

    def committed(self, shard: str) -> dict | None:
        try:
            return self.files.read_json(join("latents", shard, COMMIT_FILE))
        except FileNotFoundError:
            return None

    def committed_shards(self) -> list[str]:
        return [s for s in self.files.listdir("latents")
                if not s.startswith(".") and self.files.isfile(join("latents", s, COMMIT_FILE))]

    def shard_data_key(self, shard: str, marker: dict) -> str:
        """The key of the folder holding a committed shard's files: the shard folder, or the attempt its marker names."""
        return join("latents", shard, marker.get("data", ""))

    def shard_file(self, shard: str, name: str, marker: dict | None = None) -> str | None:
        """The key of one committed file of a shard (clips.parquet, ...), or None if the shard is not committed."""
        marker = marker if marker is not None else self.committed(shard)
        return join(self.shard_data_key(shard, marker), name) if marker else None

    def produce_shard(self, shard: str, provenance: dict, manifest_hash: str, extract: Callable[[], ShardLatents],
                      on_wait: Callable[[str], None] | None = None) -> tuple[dict, bool]:
        """Commit `extract()` as the shard unless it is committed already from this manifest and encoder.
        Returns (marker, skipped). On a local store producers of one shard take turns (a lock the kernel frees
        if its holder dies), so a second one, e.g. of another Dagster instance, waits and then skips the work.
        On an object store only the commit is serialised (a lease would expire in such long waits)."""
        with self._producing(shard, on_wait):
            done = self.committed(shard)
            if (done and done["manifest_hash"] == manifest_hash
                    and done["encoder_fingerprint"] == provenance["encoder_fingerprint"]):
                return done, True
            return self.write_shard(shard, extract(), provenance, manifest_hash), False

    @contextmanager
    def _producing(self, shard: str, on_wait):
        if not self.files.local:
            yield
            return
        with self.lock(f"produce-{shard}", on_wait=on_wait):
            yield

    def write_shard(self, shard: str, data: ShardLatents, provenance: dict, manifest_hash: str) -> dict:
        """Write all of a shard and commit it atomically (see the module docstring); returns the marker."""
        marker = self._new_marker(shard, data, provenance, manifest_hash)
        if self.files.local:
            return self._commit_by_rename(shard, data, provenance, manifest_hash, marker)
        return self._commit_by_marker(shard, data, provenance, manifest_hash, marker)

    def _new_marker(self, shard: str, data: ShardLatents, provenance: dict, manifest_hash: str) -> dict:
        self.claim(provenance)
        n, d = data.clips.shape
        assert data.clips.dtype == np.float32 and np.isfinite(data.clips).all(), f"shard {shard}: non-finite latents"
        assert data.index.num_rows == n, f"shard {shard}: {data.index.num_rows} index rows for {n} clips"
        return {"shard": shard, "encoder_fingerprint": provenance["encoder_fingerprint"],
                "manifest_hash": manifest_hash, "clips": n, "dim": d, "static_videos": int(len(data.static)),
                "videos": len(set(data.index.column("video_id").to_pylist())), "quarantined": data.quarantine.num_rows}

    @contextmanager
    def rewriting(self, shard: str, on_wait=None):
        """Hold a committed shard's write locks (extraction's and the commit's, in their order) for a read-modify-write
        (erasure, splavu_core/forget.py): no extraction or publish of the shard interleaves. Yields
        commit(data, provenance, manifest_hash) -> marker, the normal atomic commit; on object stores it then deletes
        the replaced attempt at once instead of keeping it for readers (a reader on it retries on the new marker)."""
        with self._producing(shard, on_wait), self.lock(f"shard-{shard}", on_wait=on_wait):
            def commit(data: ShardLatents, provenance: dict, manifest_hash: str) -> dict:
                marker = self._new_marker(shard, data, provenance, manifest_hash)
                if self.files.local:
                    return self._commit_by_rename_locked(shard, data, provenance, manifest_hash, marker)
                marker = self._commit_by_marker_locked(shard, data, provenance, manifest_hash, marker)
                self._gc_attempts(shard, keep={marker["data"]})
                return marker
            yield commit

    def shard_provenance(self, shard: str, marker: dict | None = None) -> dict:
        """The provenance a committed shard's arrays were written with (latents.zarr attributes)."""
        import zarr  # here: only latent arrays need it

        key = self.shard_data_key(shard, marker or self.committed(shard))
        group = zarr.open_group(self.files.zarr_store(join(key, "latents.zarr"), read_only=True), mode="r")
        return dict(group.attrs["provenance"])

    def _write_files(self, key: str, shard: str, data: ShardLatents, provenance: dict, manifest_hash: str) -> None:
        import zarr  # here: only latent arrays need it (the catalog and CLI do not)

        n, d = data.clips.shape
        group = zarr.open_group(self.files.zarr_store(join(key, "latents.zarr")), mode="w", zarr_format=3)
        group.attrs.update({"provenance": provenance, "shard": shard, "manifest_hash": manifest_hash})
        group.create_array("clips", data=data.clips, chunks=(min(max(n, 1), 1024), d))
        group.create_array("static", data=data.static, chunks=(min(max(len(data.static), 1), 256),) + data.static.shape[1:])
        self.files.write_parquet(join(key, "clips.parquet"), data.index)
        self.files.write_parquet(join(key, "static.parquet"), data.static_index)
        self.files.write_parquet(join(key, "quarantine.parquet"), data.quarantine)

    def _commit_by_rename(self, shard, data, provenance, manifest_hash, marker) -> dict:
        with self.lock(f"shard-{shard}"):  # writers of a shard take turns: what is in staging now is a dead one's
            return self._commit_by_rename_locked(shard, data, provenance, manifest_hash, marker)

    def _commit_by_rename_locked(self, shard, data, provenance, manifest_hash, marker) -> dict:
        staging_key = join("latents", ".staging")
        staging_root = self.files.loc(staging_key)
        staging_root.mkdir(parents=True, exist_ok=True)
        for stale in staging_root.glob(f"{shard}.*"):  # left by a killed writer of this shard
            shutil.rmtree(stale, ignore_errors=True)
        tmp_key = join(staging_key, f"{shard}.{os.getpid()}.{uuid.uuid4().hex[:8]}")
        tmp = self.files.loc(tmp_key)
        tmp.mkdir()
        self._write_files(tmp_key, shard, data, provenance, manifest_hash)
        (tmp / COMMIT_FILE).write_text(json.dumps(marker, indent=1, sort_keys=True) + "\n")
        final = self.files.loc(join("latents", shard))
        if final.exists():  # replacing an older version of the shard: move it aside first
            old = staging_root / f"{shard}.old.{uuid.uuid4().hex[:8]}"
            os.rename(final, old)
            os.rename(tmp, final)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.rename(tmp, final)
        return marker

    def _commit_by_marker(self, shard, data, provenance, manifest_hash, marker) -> dict:
        with self.lock(f"shard-{shard}"):
            return self._commit_by_marker_locked(shard, data, provenance, manifest_hash, marker)

    def _commit_by_marker_locked(self, shard, data, provenance, manifest_hash, marker) -> dict:
        attempts = join("latents", shard, "attempts")
        current = self.committed(shard)
        self._gc_attempts(shard, keep={current.get("data")} if current else set())
        attempt = f"{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}-{uuid.uuid4().hex[:8]}"
        self._write_files(join(attempts, attempt), shard, data, provenance, manifest_hash)
        marker = {**marker, "data": join("attempts", attempt)}
        self.files.write_json(join("latents", shard, COMMIT_FILE), marker)  # the commit: one PUT
        return marker

    def _gc_attempts(self, shard: str, keep: set) -> int:
        """Delete the attempts of a shard not in `keep` (call with the shard's lease held); returns bytes freed."""
        attempts = join("latents", shard, "attempts")
        return sum(self.files.delete(join(attempts, a)) for a in self.files.listdir(attempts)
                   if join("attempts", a) not in keep)

    def delete_shard(self, shard: str) -> int:
        """Delete a shard's raw latents; returns the bytes freed. On object stores the marker goes first, so
        readers never resolve a half-deleted shard."""
        key = join("latents", shard)
        if self.files.local:
            return self.files.delete(key)
        with self.lock(f"shard-{shard}"):
            freed = self.files.delete(join(key, COMMIT_FILE))
            return freed + self.files.delete(key)

    def read_shard(self, shard: str, with_static: bool = True) -> ShardLatents:
        for _ in range(READ_RETRIES):
            marker = self.committed(shard)
            if marker is None:
                raise StoreError(f"shard {shard!r} has no committed latents in {self.loc('latents')}: "
                                 f"materialise clip_latents for it first")
            key = self.shard_data_key(shard, marker)
            try:
                out = self._read_files(shard, key, with_static)
            except Exception:  # object store: was the attempt replaced and deleted while we read it?
                if self.files.local or self.committed(shard) == marker:
                    raise
                continue
            if self.files.local or self.committed(shard) == marker:  # unchanged while we read: one generation
                if len(out.clips) != marker["clips"]:
                    raise StoreError(f"shard {shard!r}: {self.loc(key)} holds {len(out.clips)} clips, its marker "
                                     f"says {marker['clips']}")
                return out
        raise StoreError(f"shard {shard!r} was replaced {READ_RETRIES} times while being read; try again")

    def _read_files(self, shard: str, key: str, with_static: bool) -> ShardLatents:
        import zarr  # here: only latent arrays need it (the catalog and CLI do not)

        group = zarr.open_group(self.files.zarr_store(join(key, "latents.zarr"), read_only=True), mode="r")
        fp = group.attrs["provenance"]["encoder_fingerprint"]
        if fp != self.encoder_fingerprint():
            raise StoreError(f"shard {shard!r} was written by encoder {fp}, but the store {self.root} belongs to "
                             f"{self.encoder_fingerprint()}")
        empty = np.zeros((0, 0, 0), np.float32)
        return ShardLatents(clips=group["clips"][:], index=self.files.read_parquet(join(key, "clips.parquet")),
                            static=group["static"][:] if with_static else empty,
                            static_index=self.files.read_parquet(join(key, "static.parquet")),
                            quarantine=self.files.read_parquet(join(key, "quarantine.parquet")))

    def provenance(self) -> dict:
        try:
            return self.files.read_json("store.json")
        except FileNotFoundError:
            raise StoreError(f"{self.root} holds no latents yet (no store.json)") from None
