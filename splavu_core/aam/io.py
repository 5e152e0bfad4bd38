"""Persisting an adapter: safetensors weights + a JSON sidecar, content-addressed, written atomically.

    <out_dir>/adapter.safetensors   the state dict (no code, no pickle: safe to load from anywhere)
    <out_dir>/adapter.json          {"format", "version", "encoder_fingerprint", "config", "extra"}

`version` is a content hash of the weights, the config and the encoder fingerprint, so the same
adapter on the same encoder always gets the same version (in any process), and anonymized tables
can name the exact adapter that produced them. `extra` (training metrics, timestamps, ...) is
deliberately outside the hash: re-saving with new notes does not mint a new version.

`out_dir` / `path` may be a local folder or an fsspec URL (an adapter inside an object-store root,
see storefs.py). Weights are always read as bytes and parsed by safetensors (no pickle, no code).
On an object store there is no folder rename: the weights are PUT first and adapter.json last, so
until the JSON lands the adapter does not load, and a JSON whose version does not match the weights
is refused by the content-hash check.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load as load_tensors
from safetensors.torch import save as save_tensors
from safetensors.torch import save_file

from splavu_core.aam.model import RENAMED_STAGES, AAMConfig, AnonymizingAdapter
from splavu_core.store.fs import is_url, open_root

FORMAT = "splavu-aam/1"
WEIGHTS_FILE = "adapter.safetensors"
META_FILE = "adapter.json"


def stored_config(store, version: str | None) -> AAMConfig | None:
    """The AAMConfig `version` was saved with: the config of the store's aam/<version>/adapter.json (fields left out
    at their format-1 value, as AAMConfig.from_dict reads them); None without a version or its adapter.json."""
    if not version:
        return None
    try:
        config = store.files.read_json(f"aam/{version}/{META_FILE}")["config"]
    except FileNotFoundError:
        return None
    return AAMConfig.from_dict(config)


def stored_extra(store, version: str) -> dict:
    """What training recorded beside `version`'s weights (adapter.json's extra: train_config, operating_point, ...);
    {} without its adapter.json."""
    try:
        return store.files.read_json(f"aam/{version}/{META_FILE}").get("extra") or {}
    except FileNotFoundError:
        return {}


def published_width(store, version: str | None) -> int | None:
    """The width of `version`'s published table: its keep stage's k, else the latents' D (None: see stored_config)."""
    config = stored_config(store, version)
    return None if config is None else config.out_dim


def _canonical_json(obj) -> bytes:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=True).encode()


def _renamed(name: str, renames: dict[str, str]) -> str:
    """A state-dict key with its stage's prefix renamed by `renames` ({prefix: prefix}); other keys as they are."""
    return next((to + name[len(prefix):] for prefix, to in renames.items() if name.startswith(prefix)), name)


def _content_hash(tensors: dict[str, torch.Tensor], config: AAMConfig, encoder_fingerprint: str) -> str:
    h = hashlib.sha256()

    def feed(b: bytes):  # length-prefixed, so no two different field sequences hash the same bytes
        h.update(len(b).to_bytes(8, "little"))
        h.update(b)

    before = {_renamed(name, RENAMED_STAGES): name for name in tensors}  # a renamed stage leaves versions as they were
    for name_before in sorted(before):
        t = tensors[before[name_before]].detach().cpu().contiguous()
        feed(name_before.encode())
        feed(str(t.dtype).encode())
        feed(_canonical_json(list(t.shape)))
        feed(t.reshape(-1).view(torch.uint8).numpy().tobytes())  # raw bytes, any dtype (little-endian hosts)
    feed(_canonical_json(config.to_dict(names_before=True)))  # a rename leaves versions as they were
    feed(encoder_fingerprint.encode())
    return h.hexdigest()[:16]


def _state_tensors(adapter: AnonymizingAdapter, config: AAMConfig) -> dict[str, torch.Tensor]:
    if getattr(adapter, "cfg", config) != config:
        raise ValueError(f"adapter was built with {adapter.cfg}, but config says {config}")
    return {k: v.detach().cpu().contiguous() for k, v in adapter.state_dict().items()}


def adapter_version(adapter: AnonymizingAdapter, config: AAMConfig, encoder_fingerprint: str) -> str:
    """16 hex chars of sha256 over (sorted param names, dtypes, shapes, bytes) + config + encoder fingerprint."""
    assert isinstance(encoder_fingerprint, str) and encoder_fingerprint, "encoder_fingerprint must be a non-empty str"
    return _content_hash(_state_tensors(adapter, config), config, encoder_fingerprint)


def _fsync(path: Path):
    with open(path, "rb") as f:
        os.fsync(f.fileno())


def save_adapter(adapter: AnonymizingAdapter, config: AAMConfig, out_dir: str | os.PathLike,
                 encoder_fingerprint: str, extra: dict | None = None, storage_options: dict | None = None) -> str:
    """Write adapter.safetensors + adapter.json into out_dir; returns the version. Both files are
    written under a temp dir next to out_dir and renamed into place, so a crash never leaves a
    half-written adapter that loads (a fresh out_dir appears whole or not at all)."""
    assert isinstance(encoder_fingerprint, str) and encoder_fingerprint, "encoder_fingerprint must be a non-empty str"
    tensors = _state_tensors(adapter, config)
    version = _content_hash(tensors, config, encoder_fingerprint)
    meta = {"format": FORMAT, "version": version, "encoder_fingerprint": encoder_fingerprint,
            "config": config.to_dict(), "extra": extra or {}}
    meta_bytes = json.dumps(meta, indent=2, sort_keys=True).encode()  # fails here, not half-way, if extra isn't JSON

    if is_url(out_dir):
        target = open_root(str(out_dir), storage_options)
        target.put_atomic(WEIGHTS_FILE, save_tensors(tensors, metadata={"format": FORMAT, "version": version}))
        target.put_atomic(META_FILE, meta_bytes)  # last: the adapter loads only from here on
        return version
    out_dir = Path(out_dir)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=out_dir.parent, prefix=f".{out_dir.name}.tmp-"))
    try:
        save_file(tensors, str(tmp / WEIGHTS_FILE), metadata={"format": FORMAT, "version": version})
        (tmp / META_FILE).write_bytes(meta_bytes)
        _fsync(tmp / WEIGHTS_FILE)
        _fsync(tmp / META_FILE)
        if not out_dir.exists():
            os.rename(tmp, out_dir)  # one atomic step
        else:
            # Overwriting in place: weights first, JSON last. In between, the old JSON's version does
            # not match the new weights, so load_adapter refuses the pair rather than mixing them.
            os.replace(tmp / WEIGHTS_FILE, out_dir / WEIGHTS_FILE)
            os.replace(tmp / META_FILE, out_dir / META_FILE)
            tmp.rmdir()
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return version


def _read_pair(path, storage_options: dict | None) -> tuple[bytes, bytes, str, str, str]:
    """(adapter.json bytes, adapter.safetensors bytes, the folder and both files' names for messages)."""
    src = open_root(str(path) if is_url(path) else Path(path), storage_options)
    d = str(src.loc())
    meta_path, weights_path = f"{d}/{META_FILE}", f"{d}/{WEIGHTS_FILE}"
    got = []
    for name, where in ((META_FILE, meta_path), (WEIGHTS_FILE, weights_path)):
        try:
            got.append(src.read_bytes(name))
        except (FileNotFoundError, IsADirectoryError):
            raise FileNotFoundError(f"AAM adapter file missing: {where}") from None
    return got[0], got[1], d, meta_path, weights_path


def load_adapter(path: str | os.PathLike, device: str | torch.device = "cpu",
                 storage_options: dict | None = None) -> tuple[AnonymizingAdapter, AAMConfig, dict]:
    """Read an adapter written by save_adapter -> (adapter in eval mode, config, meta dict).
    Refuses missing files, unreadable files and any adapter whose content hash != its recorded version."""
    meta_bytes, weights_bytes, d, meta_path, weights_path = _read_pair(path, storage_options)

    try:
        meta = json.loads(meta_bytes.decode())
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ValueError(f"{meta_path}: not valid JSON ({e})") from e
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        raise ValueError(f"{meta_path}: not a {FORMAT} adapter description (format={meta.get('format') if isinstance(meta, dict) else None!r})")
    missing = {"version", "encoder_fingerprint", "config"} - set(meta)
    if missing:
        raise ValueError(f"{meta_path}: missing keys {sorted(missing)}")
    try:
        config = AAMConfig.from_dict(meta["config"])
    except (TypeError, ValueError) as e:
        raise ValueError(f"{meta_path}: invalid config ({e})") from e

    try:
        tensors = load_tensors(weights_bytes)
    except (SafetensorError, OSError, ValueError, RuntimeError) as e:
        raise ValueError(f"{weights_path}: unreadable safetensors file ({e})") from e

    version = _content_hash(tensors, config, str(meta["encoder_fingerprint"]))
    if version != meta["version"]:
        raise ValueError(
            f"{d}: content hash {version} of {WEIGHTS_FILE} + config/encoder_fingerprint in {META_FILE} "
            f"does not match the recorded version {meta['version']!r}: the adapter is corrupted or was edited")

    adapter = AnonymizingAdapter(config)
    now = {before: now for now, before in RENAMED_STAGES.items()}  # adapters saved before a stage was renamed
    try:
        adapter.load_state_dict({_renamed(k, now): v for k, v in tensors.items()}, strict=True)
    except RuntimeError as e:
        raise ValueError(f"{weights_path}: tensors do not fit the config in {META_FILE} ({e})") from e
    return adapter.to(device).eval(), config, meta
