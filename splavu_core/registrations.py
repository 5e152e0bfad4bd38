"""Reading the datasets registered in a store: <root>/datasets/<name>.json, one per dataset.

The bottom of the dataset layer: roles.py (which dataset serves which task) and registry.py (registering,
sharding) both read registrations through here, so neither imports the other's reader.
"""
from __future__ import annotations

from .store import FeatureStore, StoreError
from .storefs import join


def registration_key(name: str) -> str:
    return join("datasets", f"{name}.json")


def _registration(store: FeatureStore, name: str) -> dict | None:
    try:
        return store.fs.read_json(registration_key(name))
    except FileNotFoundError:
        return None


def registered(store: FeatureStore) -> dict[str, dict]:
    return {key.rsplit("/", 1)[-1][:-len(".json")]: store.fs.read_json(key)
            for key in sorted(store.fs.glob("datasets", ".json"))}


def registration(store: FeatureStore, name: str) -> dict:
    reg = _registration(store, name)
    if reg is None:
        raise StoreError(f"dataset {name!r} is not registered in {store.root} (run `splavu ingest`)")
    return reg
