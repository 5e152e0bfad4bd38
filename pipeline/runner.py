"""Run assets in-process against the local Dagster instance ($DAGSTER_HOME), as the CLI does.

Runs show up in `dagster dev` like any other; a cluster deployment runs the same assets through
its own executor instead.
"""
from __future__ import annotations

import functools
import os

import dagster as dg

from pipeline.definitions import defs
from pipeline.partitions import shards
from pipeline.recovery import owned_run
from pipeline.resources import EncoderResource, StoreResource
from splavu_core.registry import register_dataset
from pipeline.inprocess import quiet


def instance() -> dg.DagsterInstance:
    if os.environ.get("DAGSTER_HOME"):
        os.makedirs(os.environ["DAGSTER_HOME"], exist_ok=True)
        return dg.DagsterInstance.get()
    return _process_instance()


@functools.cache
def _process_instance() -> dg.DagsterInstance:
    """Without $DAGSTER_HOME: one ephemeral instance for the whole command, so the shard partitions that
    `ingest` adds are there when `extract` runs (a second ephemeral instance would not know them)."""
    return dg.DagsterInstance.ephemeral()


def ingest(inst: dg.DagsterInstance, store: StoreResource, name: str, manifest: str, shard_size: int,
           roles=None) -> list[str]:
    keys = register_dataset(store.store(), name, manifest, shard_size, roles=roles)
    have = set(inst.get_dynamic_partitions(shards.name))
    new = [k for k in keys if k not in have]
    if new:
        inst.add_dynamic_partitions(shards.name, new)
    return keys


def assets_for(*names: str):
    graph = defs.resolve_asset_graph()
    wanted = {dg.AssetKey(n) for n in names}
    out = []
    for a in defs.assets:
        if isinstance(a, dg.AssetsDefinition) and set(a.keys) & wanted:
            out.append(a)
    assert out, f"no assets named {names}"
    return out, graph


def materialize_owned(assets, inst: dg.DagsterInstance, store: StoreResource, **kw) -> dg.ExecuteInProcessResult:
    """dg.materialize in this process, as a run this process owns: a crash of an earlier one does not block it,
    and a wait on a pool slot is announced (pipeline/recovery.py)."""
    with owned_run(inst, store.root) as owner:
        return dg.materialize(assets, instance=inst, tags={"splavu/entry": "cli", **owner}, **kw)


def materialize_shard(inst, shard: str, store: StoreResource, encoder: EncoderResource,
                      selection=("video_manifest", "clip_latents", "static_latents")) -> dg.ExecuteInProcessResult:
    assets, _ = assets_for(*selection)
    return materialize_owned(assets, inst, store, partition_key=shard, resources={"store": store, "encoder": encoder},
                             run_config=quiet(), selection=list(selection))


def run_baselines(inst, store: StoreResource, encoder: EncoderResource, names, mask_source: str = "none",
                  datasets=(), log=print) -> dict[str, dict]:
    """Materialise pixel_baseline_latents for each baseline in `names`; returns name -> its metadata."""
    from assets.baselines import pixel_baseline_latents

    out = {}
    for name in names:
        cfg = {"mask_source": mask_source, "datasets": list(datasets)}
        res = materialize_owned([pixel_baseline_latents], inst, store, partition_key=name,
                                resources={"store": store, "encoder": encoder},
                                run_config=quiet({"ops": {"pixel_baseline_latents": {"config": cfg}}}))
        md = {k: v.value for k, v in res.asset_materializations_for_node("pixel_baseline_latents")[0].metadata.items()}
        out[name] = md
        if log:
            log(f"  pixel_{name:8s} skipped: {md['reason']}" if md["skipped"] else
                f"  pixel_{name:8s} {md['shards_extracted']} shards extracted ({md['shards_skipped']} already done), "
                f"{md['clips']} clips in {md['seconds']:.0f} s")
    return out
