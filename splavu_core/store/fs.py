"""Where a store's bytes live: a local folder or an fsspec URL, behind the few operations the store needs.

Root forms (`FeatureStore(root)`, `--store`, `$SPLAVU_STORE`):

    ./store, /data/store, file:///data/store    LocalFS: a POSIX folder (the layout and behaviour of before)
    s3://bucket/prefix                          ObjectFS over s3fs (AWS S3 or any S3-compatible server)
    memory://name                               ObjectFS over fsspec's in-process memory filesystem (tests)
    gs://..., az://..., ...                     ObjectFS; plain reads and writes work, but claim() and the
                                                locks refuse (no conditional writes are implemented for them)

Every operation takes a key relative to the root ("latents/ar-000/_COMMIT.json"). Credentials and
endpoints come from the standard places of the backend (for S3: AWS_ACCESS_KEY_ID / ..._SECRET_ACCESS_KEY,
AWS_ENDPOINT_URL_S3 or AWS_ENDPOINT_URL, AWS_PROFILE, instance roles) plus `$SPLAVU_STORAGE_OPTIONS`, a JSON
object of fsspec options (e.g. {"endpoint_url": "http://127.0.0.1:9000"}) or `storage_options=` in Python.

What differs between the two, and why:

- put_atomic: LocalFS writes a hidden temp file and os.replace()s it; ObjectFS does one PUT, which an
  object store applies atomically per object (a reader gets the old object or the new one, never a
  mix; a writer killed before the PUT completes leaves nothing).
- put_if_absent (create-if-absent, first writer wins): LocalFS writes a temp file and os.link()s it
  (fails if the name exists); on S3 a PUT with `If-None-Match: *`.
- lock(name): LocalFS takes a POSIX flock. Object stores have none, so ObjectFS takes a *lease*: the
  object `_locks/<name>.json` created with If-None-Match, renewed by a heartbeat thread with If-Match
  on its ETag, deleted with If-Match on release. A holder that dies leaves a lease that expires
  after `$SPLAVU_LOCK_TTL_S` (default 60 s); a waiter then takes it over with an If-Match PUT, so of
  several waiters exactly one wins. Expiry compares wall clocks: hosts must keep them in sync (NTP)
  to well under the TTL. A holder that stalls past its TTL loses the lease and its release raises.
- Parquet: written by serialising the whole table in memory and putting it with put_atomic (a PUT
  either lands whole or not at all; an fsspec output stream would commit a half-written file when
  closed by an exception); read through pyarrow's filesystem layer, `PyFileSystem(FSSpecHandler(fs))`.
  Not pyarrow's native S3FileSystem: the fsspec handler uses the very filesystem object (credentials,
  endpoint, options) that Zarr, DuckDB and the commit protocol use, and it works for memory:// in
  unit tests; the price is Python-level I/O, fine for index and feature tables.
- Zarr: LocalStore (a path, as before) or `zarr.storage.FsspecStore` for URLs.
- DuckDB: `con.register_filesystem(fs)` so read_parquet('s3://...') goes through the same fsspec
  filesystem (DuckDB's httpfs extension is not needed, nor downloadable offline).
"""
from __future__ import annotations

import fcntl
import glob
import hashlib
import json
import os
import re
import shutil
import socket
import threading
import time
import uuid
from contextlib import contextmanager
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from splavu_core.settings import SettingsError, settings

URL = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://")
CONDITIONAL_PROTOCOLS = ("s3", "s3a", "memory")   # where put_if_absent / leases are implemented
LOCKS_DIR = "_locks"


class StoreError(Exception):
    """Anything wrong with a store (re-exported by splavu_core.store.feature_store)."""


class StoreFSError(StoreError):
    """The storage layer refused or failed: bad root or options, unsupported conditional writes, a lost lock."""


def is_url(root) -> bool:
    return isinstance(root, str) and bool(URL.match(root))


def env_storage_options() -> dict:
    """$SPLAVU_STORAGE_OPTIONS (splavu_core.settings); a bad value is a StoreFSError naming it."""
    try:
        return dict(settings().storage_options)
    except SettingsError as e:
        raise StoreFSError(str(e)) from e


def open_root(root, storage_options: dict | None = None) -> "StoreFS":
    """The StoreFS of a local path or an fsspec URL."""
    if isinstance(root, str) and root.startswith("file://"):
        root = root[len("file://"):]
    if not is_url(root):
        return LocalFS(Path(root))
    opts = env_storage_options() if storage_options is None else storage_options
    return ObjectFS(str(root), opts)


def _check_key(rel: str) -> str:
    rel = rel.strip("/")
    if any(part in ("..", ".") for part in rel.split("/")):
        raise StoreFSError(f"store key {rel!r}: '.' and '..' are not allowed")
    return rel


def join(*parts) -> str:
    """A relative store key from parts ('latents', shard, 'clips.parquet')."""
    return _check_key("/".join(str(p).strip("/") for p in parts if str(p)))


def parquet_bytes(table: pa.Table) -> bytes:
    sink = pa.BufferOutputStream()
    pq.write_table(table, sink, compression="zstd")
    return sink.getvalue().to_pybytes()


class StoreFS:
    """The operations the store needs; keys are relative to the root ('' is the root itself)."""

    local: bool
    url: str
    protocol: str

    # --- locations (for messages, DuckDB, and tools handed a path)
    def loc(self, rel: str = ""):
        raise NotImplementedError

    def __str__(self) -> str:
        return self.url

    # --- reads
    def exists(self, rel: str) -> bool: ...
    def isfile(self, rel: str) -> bool: ...
    def isdir(self, rel: str) -> bool: ...
    def read_bytes(self, rel: str) -> bytes: ...
    def listdir(self, rel: str) -> list[str]: ...
    def walk(self, rel: str = "") -> list[tuple[str, int]]: ...

    def read_text(self, rel: str) -> str:
        return self.read_bytes(rel).decode()

    def read_json(self, rel: str):
        return json.loads(self.read_bytes(rel))

    def glob(self, rel_dir: str, suffix: str) -> list[str]:
        """Keys of the files directly under rel_dir whose name ends with suffix; hidden names (.*) skipped."""
        return [join(rel_dir, n) for n in self.listdir(rel_dir)
                if n.endswith(suffix) and not n.startswith(".") and self.isfile(join(rel_dir, n))]

    def size(self, rel: str) -> int:
        """Bytes of a file, or of everything under a prefix."""
        return sum(s for _, s in self.walk(rel))

    def match(self, pattern: str) -> list[str]:
        """Keys matching a glob pattern ('latents/*/clips.parquet'); `*` matches no hidden (.*) name."""
        raise NotImplementedError

    def duck_url(self, rel: str) -> str:
        """The key as DuckDB's read_parquet() finds it (an absolute path, or a URL of a registered filesystem)."""
        raise NotImplementedError

    def register_duckdb(self, con) -> None:
        """Make duck_url()s readable on this DuckDB connection."""

    # --- writes
    def put_atomic(self, rel: str, data: bytes) -> None: ...
    def put_if_absent(self, rel: str, data: bytes) -> bool: ...
    def delete(self, rel: str) -> int: ...

    def write_json(self, rel: str, obj) -> None:
        self.put_atomic(rel, (json.dumps(obj, indent=1, sort_keys=True, default=str) + "\n").encode())

    # --- tables and arrays
    @property
    def arrow_fs(self):
        raise NotImplementedError

    def arrow_path(self, rel: str) -> str:
        raise NotImplementedError

    def read_parquet(self, rel: str, columns: list[str] | None = None) -> pa.Table:
        return pq.read_table(self.arrow_path(rel), columns=columns, filesystem=self.arrow_fs)

    def parquet_metadata(self, rel: str):
        with self.arrow_fs.open_input_file(self.arrow_path(rel)) as f:
            return pq.ParquetFile(f).metadata

    def parquet_schema(self, rel: str) -> pa.Schema:
        with self.arrow_fs.open_input_file(self.arrow_path(rel)) as f:
            return pq.read_schema(f)

    def write_parquet(self, rel: str, table: pa.Table) -> None:
        self.put_atomic(rel, parquet_bytes(table))

    def zarr_store(self, rel: str, read_only: bool = False):
        raise NotImplementedError

    @contextmanager
    def lock(self, name: str, on_wait=None):
        """Exclusive lock `name` of this store; on_wait(message) is called once if it must wait for a holder."""
        raise NotImplementedError
        yield


# ==================================================================== a local folder

class LocalFS(StoreFS):
    local = True
    protocol = "file"

    def __init__(self, root: Path):
        self.root = Path(root)
        self.url = str(self.root)

    def loc(self, rel: str = "") -> Path:
        rel = _check_key(rel)
        return self.root / rel if rel else self.root

    def exists(self, rel):
        return self.loc(rel).exists()

    def isfile(self, rel):
        return self.loc(rel).is_file()

    def isdir(self, rel):
        return self.loc(rel).is_dir()

    def read_bytes(self, rel):
        return self.loc(rel).read_bytes()

    def match(self, pattern):
        root = str(self.root)
        return sorted(Path(p).relative_to(root).as_posix() for p in glob.glob(f"{root}/{_check_key(pattern)}"))

    def duck_url(self, rel):
        return str(self.loc(rel).resolve())

    def listdir(self, rel):
        d = self.loc(rel)
        return sorted(p.name for p in d.iterdir()) if d.is_dir() else []

    def walk(self, rel=""):
        base = self.loc(rel)
        if base.is_file():
            return [(_check_key(rel), base.stat().st_size)]
        out = []
        for dirpath, _, names in os.walk(base):
            for n in names:
                p = Path(dirpath) / n
                try:
                    size = p.stat().st_size
                except FileNotFoundError:  # removed while we walked (a writer's temp file)
                    continue
                out.append((p.relative_to(self.root).as_posix(), size))
        return sorted(out)

    def put_atomic(self, rel, data):
        path = self.loc(rel)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex[:8]}.part")
        try:
            tmp.write_bytes(data)
            os.replace(tmp, path)
        finally:
            tmp.unlink(missing_ok=True)

    def put_if_absent(self, rel, data):
        path = self.loc(rel)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex[:8]}.part")
        tmp.write_bytes(data)
        try:  # a hard link appears whole, and fails if the name exists: first writer wins
            os.link(tmp, path)
            return True
        except FileExistsError:
            return False
        finally:
            tmp.unlink()

    def delete(self, rel):
        """Rename out of every reader's glob into <root>/.trash first (atomic), then remove. Bytes freed."""
        path = self.loc(rel)
        if not path.exists():
            return 0
        size = self.size(rel)
        trash = self.root / ".trash"
        trash.mkdir(parents=True, exist_ok=True)
        dest = trash / f"{path.name}.{uuid.uuid4().hex[:8]}"
        os.rename(path, dest)
        if dest.is_dir():
            shutil.rmtree(dest, ignore_errors=True)
        else:
            dest.unlink(missing_ok=True)
        return size

    def write_parquet(self, rel, table):
        path = self.loc(rel)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex[:8]}.part")
        try:
            pq.write_table(table, tmp, compression="zstd")
            os.replace(tmp, path)
        finally:
            tmp.unlink(missing_ok=True)

    def read_parquet(self, rel, columns=None):
        return pq.read_table(self.loc(rel), columns=columns)

    def parquet_metadata(self, rel):
        return pq.ParquetFile(self.loc(rel)).metadata

    def parquet_schema(self, rel):
        return pq.read_schema(self.loc(rel))

    @property
    def arrow_fs(self):
        return pa.fs.LocalFileSystem()

    def arrow_path(self, rel):
        return str(self.loc(rel).resolve())

    def zarr_store(self, rel, read_only=False):
        return str(self.loc(rel))  # zarr opens a LocalStore for a path, as before

    @contextmanager
    def lock(self, name, on_wait=None):
        """Advisory lock (POSIX flock, released by the kernel when its holder dies); the file names the holder."""
        self.root.mkdir(parents=True, exist_ok=True)
        path = self.root / f".{name}.lock"
        with open(path, "a+") as f:
            try:
                fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                if on_wait:
                    f.seek(0)
                    on_wait(f"waiting for lock {path}, held by {f.read().strip() or 'another process'}")
                fcntl.flock(f, fcntl.LOCK_EX)
            try:
                f.truncate(0)
                f.write(f"pid {os.getpid()} on {socket.gethostname()}\n")
                f.flush()
                yield
            finally:
                fcntl.flock(f, fcntl.LOCK_UN)


# ==================================================================== an object store (fsspec)

_MEMORY_CAS = threading.Lock()  # memory:// is in-process: a process lock makes its conditional ops exact


class _PreconditionFailed(Exception):
    pass


def _precondition_failed(e: BaseException) -> bool:
    """A conditional S3 request refused: 412 PreconditionFailed, or 409 ConditionalRequestConflict (a concurrent
    conditional write to the same key; the loser retries). s3fs keeps botocore's error as the cause."""
    if isinstance(e, FileExistsError):
        return True
    for err in (e, e.__cause__):
        code = (getattr(err, "response", None) or {}).get("Error", {}).get("Code")
        if code in ("PreconditionFailed", "ConditionalRequestConflict"):
            return True
    return False


class ObjectFS(StoreFS):
    local = False

    def __init__(self, url: str, storage_options: dict):
        import fsspec  # here: object-store roots only

        proto, _, rest = url.partition("://")
        if not rest.strip("/"):
            raise StoreFSError(f"store root {url!r}: name a bucket (and optionally a prefix), e.g. s3://bucket/store")
        self.url = f"{proto}://{rest.rstrip('/')}"
        self.storage_options = dict(storage_options)
        opts = dict(self.storage_options)
        if self.url.split("://", 1)[0] in ("s3", "s3a"):
            # s3fs answers exists/info from cached listings: another process's new objects (a marker, a shard)
            # would stay invisible to a long-lived process (a sensor, a daemon). Always ask the server.
            opts.setdefault("use_listings_cache", False)
        self.fs, path = fsspec.core.url_to_fs(self.url, **opts)
        self.base = path.rstrip("/")
        proto = self.fs.protocol
        self.protocol = proto[0] if isinstance(proto, (tuple, list)) else proto
        self._arrow_fs = None

    def _p(self, rel: str) -> str:
        rel = _check_key(rel)
        return f"{self.base}/{rel}" if rel else self.base

    def loc(self, rel: str = "") -> str:
        rel = _check_key(rel)
        return f"{self.url}/{rel}" if rel else self.url

    def full_url(self, rel: str = "") -> str:
        """The URL under which DuckDB's registered filesystem finds the key."""
        return self.fs.unstrip_protocol(self._p(rel))

    # --- reads
    def exists(self, rel):
        return self.fs.exists(self._p(rel))

    def isfile(self, rel):
        return self.fs.isfile(self._p(rel))

    def isdir(self, rel):
        return self.fs.isdir(self._p(rel))

    def read_bytes(self, rel):
        return self.fs.cat_file(self._p(rel))

    def match(self, pattern):
        found = self.fs.glob(self._p(pattern))
        keys = [p[len(self.base):].lstrip("/") for p in found if p.startswith(self.base)]
        return sorted(k for k in keys if not any(part.startswith(".") for part in k.split("/")))

    def duck_url(self, rel):
        return self.full_url(rel)

    def register_duckdb(self, con):
        con.register_filesystem(self.fs)

    def listdir(self, rel):
        try:
            entries = self.fs.ls(self._p(rel), detail=False)
        except FileNotFoundError:
            return []
        names = sorted({e.rstrip("/").rsplit("/", 1)[-1] for e in entries})
        return [n for n in names if n]

    def walk(self, rel=""):
        p = self._p(rel)
        try:
            found = self.fs.find(p, detail=True)
        except FileNotFoundError:
            return []
        out = []
        for path, info in found.items():
            if info.get("type") == "directory":
                continue
            key = path[len(self.base):].lstrip("/") if path.startswith(self.base) else path.lstrip("/")
            out.append((key, int(info.get("size") or 0)))
        return sorted(out)

    # --- writes
    def put_atomic(self, rel, data):
        self.fs.pipe_file(self._p(rel), bytes(data))  # one PUT (multipart above 100 MB: completes atomically too)

    def _conditional(self) -> None:
        if self.protocol not in CONDITIONAL_PROTOCOLS:
            raise StoreFSError(f"store {self.url}: conditional writes (create-if-absent, leases) are implemented for "
                               f"{', '.join(CONDITIONAL_PROTOCOLS)} only, not {self.protocol!r}; claiming the store and "
                               f"locking its tables cannot be made safe here")

    def put_if_absent(self, rel, data):
        self._conditional()
        try:
            self._put_cas(rel, bytes(data), None)
            return True
        except _PreconditionFailed:
            return False

    def delete(self, rel):
        """Delete a file, or everything under a prefix. Returns the bytes freed. (No rename on object
        stores: callers that need readers never to see a half-deleted prefix delete its marker first.)"""
        files = self.walk(rel)
        if not files:
            return 0
        self.fs.rm([self._p(k) for k, _ in files])
        if self.protocol == "memory":  # memory:// keeps pseudo-directories; object stores have none
            try:
                self.fs.rm(self._p(rel), recursive=True)
            except (FileNotFoundError, OSError):
                pass
        return sum(s for _, s in files)

    # --- compare-and-swap primitives (S3 conditional requests; memory:// under a process lock)
    def _split(self, rel):
        bucket, _, key = self._p(rel).partition("/")
        return bucket, key

    def get_tagged(self, rel) -> tuple[bytes, str] | None:
        """(content, entity tag) read in one request, or None if absent."""
        self._conditional()
        if self.protocol == "memory":
            with _MEMORY_CAS:
                try:
                    data = self.fs.cat_file(self._p(rel))
                except FileNotFoundError:
                    return None
                return data, hashlib.sha256(data).hexdigest()
        from fsspec.asyn import sync  # here: object-store roots only

        bucket, key = self._split(rel)

        async def get():
            r = await self.fs._call_s3("get_object", Bucket=bucket, Key=key)
            async with r["Body"] as stream:
                return await stream.read(), r["ETag"]

        try:
            return sync(self.fs.loop, get)
        except FileNotFoundError:
            return None

    def _put_cas(self, rel, data: bytes, tag: str | None) -> str:
        """PUT only if absent (tag None) or if the current entity tag is `tag`. Returns the new tag;
        raises _PreconditionFailed when the condition does not hold."""
        if self.protocol == "memory":
            with _MEMORY_CAS:
                p = self._p(rel)
                try:
                    have = hashlib.sha256(self.fs.cat_file(p)).hexdigest()
                except FileNotFoundError:
                    have = None
                if have != tag:
                    raise _PreconditionFailed(rel)
                self.fs.pipe_file(p, data)
                return hashlib.sha256(data).hexdigest()
        bucket, key = self._split(rel)
        cond = {"IfNoneMatch": "*"} if tag is None else {"IfMatch": tag}
        try:
            r = self.fs.call_s3("put_object", Bucket=bucket, Key=key, Body=data, **cond)
        except Exception as e:
            if _precondition_failed(e):
                raise _PreconditionFailed(rel) from e
            raise
        finally:
            self.fs.invalidate_cache(self._p(rel))
        return r["ETag"]

    def _delete_cas(self, rel, tag: str) -> bool:
        if self.protocol == "memory":
            with _MEMORY_CAS:
                p = self._p(rel)
                try:
                    if hashlib.sha256(self.fs.cat_file(p)).hexdigest() != tag:
                        return False
                except FileNotFoundError:
                    return False
                self.fs.rm_file(p)
                return True
        bucket, key = self._split(rel)
        try:
            self.fs.call_s3("delete_object", Bucket=bucket, Key=key, IfMatch=tag)
            return True
        except Exception as e:
            if _precondition_failed(e) or isinstance(e, FileNotFoundError):
                return False
            raise
        finally:
            self.fs.invalidate_cache(self._p(rel))

    # --- tables and arrays
    @property
    def arrow_fs(self):
        if self._arrow_fs is None:
            from pyarrow.fs import FSSpecHandler, PyFileSystem  # object-store roots only

            self._arrow_fs = PyFileSystem(FSSpecHandler(self.fs))
        return self._arrow_fs

    def arrow_path(self, rel):
        return self._p(rel)

    def zarr_store(self, rel, read_only=False):
        from zarr.storage import FsspecStore  # here: object-store roots only

        return FsspecStore.from_url(self.loc(rel), storage_options=self.storage_options or None, read_only=read_only)

    @contextmanager
    def lock(self, name, on_wait=None):
        lease = Lease(self, join(LOCKS_DIR, f"{name}.json"))
        lease.acquire()
        try:
            yield lease
        except BaseException:
            lease.release(check=False)
            raise
        lease.release()


# ==================================================================== leases (locks on object stores)

def lock_ttl_s() -> float:
    return settings().lock_ttl_s


class Lease:
    """A lock on an object store: `key` holds {owner, expires}; see the module docstring."""

    def __init__(self, ofs: ObjectFS, key: str, ttl_s: float | None = None, wait_s: float | None = None):
        self.ofs, self.key = ofs, key
        self.ttl = ttl_s or lock_ttl_s()
        self.wait = wait_s if wait_s is not None else max(10 * self.ttl, 60.0)
        self.owner = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self.tag: str | None = None
        self.lost: str | None = None
        self._stop = threading.Event()
        self._beat: threading.Thread | None = None

    def _body(self) -> bytes:
        return json.dumps({"owner": self.owner, "expires": time.time() + self.ttl, "ttl_s": self.ttl}).encode()

    def acquire(self) -> None:
        deadline, pause = time.monotonic() + self.wait, 0.05
        holder = None
        while True:
            try:
                self.tag = self.ofs._put_cas(self.key, self._body(), None)
                break
            except _PreconditionFailed:
                pass
            got = self.ofs.get_tagged(self.key)
            if got is not None:
                data, tag = got
                try:
                    holder = json.loads(data)
                    expired = float(holder["expires"]) < time.time()
                except (ValueError, KeyError, TypeError):
                    holder, expired = {"owner": "?", "unreadable": True}, True  # a broken lease blocks nobody
                if expired:
                    try:  # take over the expired lease; of several waiters exactly one wins
                        self.tag = self.ofs._put_cas(self.key, self._body(), tag)
                        break
                    except _PreconditionFailed:
                        pass
            if time.monotonic() > deadline:
                raise StoreFSError(f"lock {self.ofs.loc(self.key)}: still held by {holder} after {self.wait:.0f} s")
            time.sleep(pause)
            pause = min(pause * 2, 1.0)
        self._beat = threading.Thread(target=self._heartbeat, name=f"lease {self.key}", daemon=True)
        self._beat.start()

    def _heartbeat(self) -> None:
        while not self._stop.wait(self.ttl / 3):
            try:
                self.tag = self.ofs._put_cas(self.key, self._body(), self.tag)
            except _PreconditionFailed:
                self.lost = "another writer took the lease over after it expired"
                return
            except Exception:  # transient (network): retried at the next beat; only expiry loses the lease
                continue

    def release(self, check: bool = True) -> None:
        self._stop.set()
        if self._beat is not None:
            self._beat.join()
        ok = self.tag is not None and self.ofs._delete_cas(self.key, self.tag)
        if check and (self.lost or not ok):
            raise StoreFSError(f"lock {self.ofs.loc(self.key)} was lost while held ({self.lost or 'lease replaced'}): "
                               f"another writer may have interleaved with this one; re-run the step")
