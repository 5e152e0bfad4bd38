"""What the store keeps about erasures (`splavu forget`, forget.py): tombstones and the append-only receipt log.

    <root>/erasure/salt.json               a random per-store salt (created once, first writer wins)
    <root>/erasure/tombstones.parquet      id_hash, request_id, erased_at: videos that must never come back silently
    <root>/erasure/log/<request>*.parquet  the receipts, one file per request step, never rewritten (the catalog's
                                           `erasures` view): counts, layers, shard content hashes, no ids
    <root>/erasure/journal/<request>.json  a request in progress (forget.py); it names the videos until it completes

No video id is stored here: a tombstone is HMAC-SHA256(salt, video_id). The salt lives in the store, so anyone who
can read the store and guesses an id can confirm that it was erased; that is what a tombstone must allow (the store
itself has to recognise the id when it comes back), and it is why the log holds no id hashes at all.

A bottom-layer module (imports only the store): datasets.py reads the tombstones when it registers a dataset or cuts
a shard, and forget.py writes them.
"""
from __future__ import annotations

import hashlib
import hmac
import json
import secrets
from datetime import datetime, timezone

import pyarrow as pa

from splavu_core.store.feature_store import FeatureStore, StoreError
from splavu_core.store.fs import join, parquet_bytes

SALT_KEY = "erasure/salt.json"
TOMBSTONES_KEY = "erasure/tombstones.parquet"
LOG_DIR = "erasure/log"
JOURNAL_DIR = "erasure/journal"

TOMBSTONE_SCHEMA = pa.schema([("id_hash", pa.string()), ("request_id", pa.string()),
                              ("erased_at", pa.timestamp("us", tz="UTC"))])
LOG_SCHEMA = pa.schema([("request_id", pa.string()), ("step", pa.string()), ("logged_at", pa.timestamp("us", tz="UTC")),
                        ("reason", pa.string()), ("layer", pa.string()), ("item", pa.string()),
                        ("rows_removed", pa.int64()), ("files_removed", pa.int64()), ("bytes_written", pa.int64()),
                        ("hash_before", pa.string()), ("hash_after", pa.string()), ("note", pa.string())])


class ForgottenVideoError(StoreError):
    """A manifest brings back videos that were erased."""


def now() -> datetime:
    return datetime.now(timezone.utc)


def _salt(store: FeatureStore, create: bool) -> bytes | None:
    try:
        return bytes.fromhex(store.files.read_json(SALT_KEY)["salt"])
    except FileNotFoundError:
        if not create:
            return None
    store.files.put_if_absent(SALT_KEY, (json.dumps({"salt": secrets.token_hex(32)}) + "\n").encode())
    return bytes.fromhex(store.files.read_json(SALT_KEY)["salt"])


def id_hashes(store: FeatureStore, video_ids, create: bool = False) -> dict[str, str]:
    """video_id -> its salted hash (empty when the store never erased anything and create is False)."""
    salt = _salt(store, create)
    if salt is None:
        return {}
    return {v: hmac.new(salt, str(v).encode(), hashlib.sha256).hexdigest() for v in video_ids}


def read_tombstones(store: FeatureStore) -> pa.Table:
    if not store.files.isfile(TOMBSTONES_KEY):
        return TOMBSTONE_SCHEMA.empty_table()
    return store.files.read_parquet(TOMBSTONES_KEY)


def forgotten(store: FeatureStore, video_ids) -> set[str]:
    """The ids among `video_ids` that were erased (have a tombstone)."""
    if not store.files.isfile(TOMBSTONES_KEY):
        return set()  # the common case: one stat, no hashing
    stones = set(read_tombstones(store)["id_hash"].to_pylist())
    return {v for v, h in id_hashes(store, video_ids).items() if h in stones}


def add_tombstones(store: FeatureStore, video_ids, request_id: str) -> int:
    hashes = set(id_hashes(store, video_ids, create=True).values())
    with store.lock("erasure"):
        have = read_tombstones(store)
        new = sorted(hashes - set(have["id_hash"].to_pylist()))
        if new:
            rows = pa.table({"id_hash": new, "request_id": [request_id] * len(new), "erased_at": [now()] * len(new)},
                            schema=TOMBSTONE_SCHEMA)
            store.files.write_parquet(TOMBSTONES_KEY, pa.concat_tables([have.cast(TOMBSTONE_SCHEMA), rows]))
    return len(new)


def readmit(store: FeatureStore, video_ids, reason: str) -> int:
    """Remove the tombstones of `video_ids` (an explicit re-admission); logged as a receipt. Returns how many."""
    hashes = set(id_hashes(store, video_ids).values())
    with store.lock("erasure"):
        have = read_tombstones(store)
        keep = [h not in hashes for h in have["id_hash"].to_pylist()]
        n = len(keep) - sum(keep)
        if n:
            store.files.write_parquet(TOMBSTONES_KEY, have.filter(pa.array(keep)))
    if n:
        request = f"readmit-{now().strftime('%Y%m%dT%H%M%S')}-{secrets.token_hex(4)}"
        append_log(store, request, "readmit", reason, [{"layer": "tombstones", "rows_removed": n,
                                                         "note": "re-admitted with --allow-forgotten"}])
    return n


def append_log(store: FeatureStore, request_id: str, step: str, reason: str, rows: list[dict]) -> str:
    """Write one new receipt file (never an existing one: the log is append-only); returns its key."""
    at = now()
    table = pa.Table.from_pylist([{"request_id": request_id, "step": step, "logged_at": at, "reason": reason, **r}
                                  for r in rows], schema=LOG_SCHEMA)
    key = join(LOG_DIR, f"{at.strftime('%Y%m%dT%H%M%S%f')}-{request_id}-{step}.parquet")
    if not store.files.put_if_absent(key, parquet_bytes(table)):
        raise StoreError(f"erasure log {store.loc(key)} exists already: the log is append-only")
    return key


def read_log(store: FeatureStore) -> pa.Table:
    files = sorted(store.files.glob(LOG_DIR, ".parquet"))
    return pa.concat_tables([store.files.read_parquet(f) for f in files]) if files else LOG_SCHEMA.empty_table()
