"""Protocol outputs kept in the store between runs, so a re-run scores nothing it has scored before.

What is kept: the expensive part of a measurement, the trained readers' and attackers' outputs on the scored videos
(class probabilities, frame scores, detections), under `cache/scores/<key>.npz` of the store. The metrics, their
bootstrap and every interval are computed from them again, so a hit gives the rows a fresh run would.

The key: a hash of everything the outputs depend on: the protocol and its settings, the seeds, every training and
scored video's id, split, labels, clip times and feature bytes, the source of the code that computes them
(OUTPUT_CODE, splavu_core/tasks, threads.py), the numeric libraries' versions, torch's thread count and the CPU
kind. Any changed byte, label, setting or line of that code is another key; an old entry is never read as new.

Only while a store is named (`kept_in(store)`: the gates, `splavu evaluate`, the curve); elsewhere nothing is read or
written. An erasure deletes the whole cache (forget.erase_caches): entries hold outputs about the erased people.
Files are npz without pickles (np.load(allow_pickle=False)); an unreadable entry is scored again, not trusted.
"""
from __future__ import annotations

import contextlib
import contextvars
import hashlib
import io
import json
import platform
from collections.abc import Callable, Iterator
from functools import lru_cache
from pathlib import Path

import numpy as np

from splavu_core.tasks.features import VideoFeatures

ROOT = "cache/scores"
# the modules whose code computes the kept outputs (with splavu_core/tasks and threads.py): an edit there is a new key
OUTPUT_CODE = ("protocols.py", "readers.py", "attackers.py", "score_cache.py")
_STORE: contextvars.ContextVar = contextvars.ContextVar("splavu_score_cache", default=None)
COUNTS = {"hit": 0, "miss": 0}


@contextlib.contextmanager
def kept_in(store) -> Iterator[None]:
    """Read and write protocol outputs under `store` for the duration (None: neither)."""
    token = _STORE.set(store)
    try:
        yield
    finally:
        _STORE.reset(token)


@lru_cache(maxsize=1)
def code_version() -> str:
    """The source of the code that computes outputs, and what runs it."""
    import sklearn
    import torch

    h = hashlib.blake2b(digest_size=16)
    root = Path(__file__).resolve().parents[1]
    for f in sorted([*(root / "evaluation" / n for n in OUTPUT_CODE), *root.glob("tasks/*.py"), root / "threads.py"]):
        h.update(f.name.encode() + b"\0" + f.read_bytes())
    h.update(repr((np.__version__, torch.__version__, sklearn.__version__, platform.machine(),
                   torch.backends.cpu.get_cpu_capability())).encode())
    return h.hexdigest()


def key(kind: str, *parts) -> str:
    """Content key of one measurement: kind, then its inputs (videos, arrays, settings). Also the in-process key of
    scoring's memory of Scored (scoring._SCORES)."""
    import torch

    h = hashlib.blake2b(digest_size=20)
    h.update(f"{code_version()}|{kind}|threads={torch.get_num_threads()}".encode())
    for p in parts:
        _feed(h, p)
    return h.hexdigest()


def _feed(h, obj) -> None:
    if isinstance(obj, VideoFeatures):
        h.update(f"V|{obj.video_id}|{obj.split}|{obj.n_frames}|{obj.fps!r}|"
                 f"{sorted((k, repr(v)) for k, v in obj.meta.items())}|{obj.feats.shape}|{obj.feats.dtype}".encode())
        for a in (obj.feats, obj.clip_start_s, obj.clip_end_s):
            h.update(np.ascontiguousarray(a).tobytes())
    elif isinstance(obj, np.ndarray):
        h.update(f"A|{obj.shape}|{obj.dtype}".encode())
        h.update(np.ascontiguousarray(obj).tobytes())
    elif isinstance(obj, (list, tuple)):
        h.update(f"L{len(obj)}[".encode())
        for o in obj:
            _feed(h, o)
        h.update(b"]")
    elif isinstance(obj, dict):
        h.update(f"D{len(obj)}{{".encode())
        for k in sorted(obj, key=repr):
            h.update(repr(k).encode() + b":")
            _feed(h, obj[k])
        h.update(b"}")
    elif obj is None or isinstance(obj, (str, int, float, bool, np.generic)):
        h.update(f"S|{type(obj).__name__}|{obj!r}".encode())
    else:
        raise TypeError(f"score_cache.key: cannot key a {type(obj).__name__}")


def computed(kind: str, parts: tuple, compute: Callable, to_kept: Callable = lambda x: x,
             from_kept: Callable = lambda x: x):
    """compute(), or what was kept under (kind, parts) in the named store (from_kept rebuilds it); a fresh result is
    kept for the next run (to_kept: what of it to keep; None keeps nothing). No store named: compute() alone."""
    if _STORE.get() is None:
        return compute()
    k = key(kind, *parts)
    kept = _fetch(k)
    if kept is not None:
        return from_kept(kept)
    out = compute()
    if (form := to_kept(out)) is not None:
        _keep(k, form)
    return out


def _fetch(k: str):
    """The outputs kept under k, or None (no store named, no entry, or an entry that does not decode)."""
    store = _STORE.get()
    if store is None:
        return None
    rel = f"{ROOT}/{k}.npz"
    if not store.files.isfile(rel):
        COUNTS["miss"] += 1
        return None
    try:
        out = decode(store.files.read_bytes(rel))
    except (ValueError, KeyError, OSError):
        COUNTS["miss"] += 1
        return None
    COUNTS["hit"] += 1
    return out


def _keep(k: str, obj) -> None:
    store = _STORE.get()
    if store is not None:
        store.files.put_if_absent(f"{ROOT}/{k}.npz", encode(obj))  # same key, same bytes: the first writer wins


# ---------------------------------------------------------------- encoding: JSON structure + arrays, no pickles

def encode(obj) -> bytes:
    """npz bytes of nested lists / tuples / dicts (str keys) / arrays / scalars; an object shared by identity (the
    same outputs standing for every seed of a convex probe) is stored once and shared again when decoded."""
    arrays: list[np.ndarray] = []
    seen: dict[int, int] = {}
    nodes: list = []

    def enc(o):
        if isinstance(o, np.ndarray):
            if o.dtype == object:
                raise TypeError("score_cache.encode: object arrays are not kept (they would need pickles)")
            if id(o) not in seen:
                arrays.append(np.ascontiguousarray(o))
                seen[id(o)] = len(nodes)
                nodes.append({"a": len(arrays) - 1})
            return {"r": seen[id(o)]}
        if isinstance(o, list):
            if id(o) in seen:
                return {"r": seen[id(o)]}
            if o and all(_is_det(d) for d in o):  # detections (start, end, label, score): columns, not JSON
                labels = sorted({d[2] for d in o})
                arrays.append(np.array([(d[0], d[1], d[3], labels.index(d[2])) for d in o], np.float64))
                node = {"det": len(arrays) - 1, "labels": labels}
            else:
                node = {"l": [enc(x) for x in o]}
            seen[id(o)] = len(nodes)
            nodes.append(node)
            return {"r": seen[id(o)]}
        if isinstance(o, tuple):
            return {"t": [enc(x) for x in o]}
        if isinstance(o, dict):
            assert all(isinstance(x, str) for x in o), "score_cache.encode: dict keys must be str"
            return {"d": {x: enc(v) for x, v in o.items()}}
        if isinstance(o, np.generic):
            return {"s": o.item()}
        if o is None or isinstance(o, (str, int, float, bool)):
            return {"s": o}
        raise TypeError(f"score_cache.encode: cannot keep a {type(o).__name__}")

    root = enc(obj)
    buf = io.BytesIO()
    np.savez(buf, structure=np.array(json.dumps({"root": root, "nodes": nodes})),
             **{f"a{i}": a for i, a in enumerate(arrays)})
    return buf.getvalue()


def _is_det(d) -> bool:
    return isinstance(d, tuple) and len(d) == 4 and isinstance(d[2], str) and \
        all(type(d[i]) is float for i in (0, 1, 3))


def decode(data: bytes):
    with np.load(io.BytesIO(data), allow_pickle=False) as z:
        doc = json.loads(str(z["structure"]))
        arrays = {k: z[k] for k in z.files if k != "structure"}
    built: dict[int, object] = {}

    def node(i: int):
        if i not in built:
            n = doc["nodes"][i]
            if "a" in n:
                built[i] = arrays[f"a{n['a']}"]
            elif "det" in n:
                cols = arrays[f"a{n['det']}"]
                built[i] = [(float(a), float(e), n["labels"][int(c)], float(p)) for a, e, p, c in cols.tolist()]
            else:
                built[i] = lst = []
                lst.extend(dec(x) for x in n["l"])
        return built[i]

    def dec(o):
        if "r" in o:
            return node(o["r"])
        if "t" in o:
            return tuple(dec(x) for x in o["t"])
        if "d" in o:
            return {x: dec(v) for x, v in o["d"].items()}
        return o["s"]

    return dec(doc["root"])
