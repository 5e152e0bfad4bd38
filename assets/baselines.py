"""pixel_baseline_latents: the raw store's videos re-extracted through a pixel-space anonymizer.

One static partition per baseline (blur, blacken, down2, down4; splavu_core.extract.pixel.BASELINES). Each
writes its own store under <root>/baselines/pixel_<name>; the evaluation assets score every such
store beside raw and splavu, and the report compares their cost. Region-based baselines (blur,
blacken) need person masks: mask_source 'rendered' (the synthetic benchmark's true silhouettes) or
'hog' (OpenCV's people detector); with 'none' they are skipped with a message.
"""
import dagster as dg
from pydantic import Field

from assets.resources import EncoderResource, StoreResource
from splavu_core.extract.pixel import BASELINES, MASK_SOURCES, PixelAnonymizer, baseline_transform
from splavu_core.extract.pixel_baselines import extract_baseline
from splavu_core.ingest.datasets import registered, task_datasets

pixel_baselines = dg.StaticPartitionsDefinition(list(BASELINES))


class PixelBaselineConfig(dg.Config):
    mask_source: str = Field(default="none", description=f"person masks for blur/blacken: one of {MASK_SOURCES}")
    datasets: list[str] = Field(default=[], description="datasets to re-extract (default: every evaluation dataset "
                                                        "registered in the store)")


# each baseline re-extracts every shard's videos: all of clip_latents upstream (identity mapping is invalid here)
@dg.asset(partitions_def=pixel_baselines,
          deps=[dg.AssetDep("clip_latents", partition_mapping=dg.AllPartitionMapping())],
          group_name="baselines", pool="encoder",
          kinds={"zarr"}, description="Clip latents of the evaluation datasets with a pixel transform applied before "
                                      "the frozen encoder, in the baseline's own store (never the raw one).")
def pixel_baseline_latents(context: dg.AssetExecutionContext, config: PixelBaselineConfig, store: StoreResource,
                           encoder: EncoderResource) -> dg.MaterializeResult:
    name = context.partition_key
    feature_store = store.store()
    if baseline_transform(name).needs_mask and config.mask_source in ("", "none"):
        why = (f"{name} transforms the person region and no person masks are configured: set mask_source to "
               f"'rendered' (synthetic benchmark) or 'hog' (OpenCV people detector)")
        context.log.warning(f"skipped: {why}")
        return dg.MaterializeResult(metadata={"skipped": True, "reason": why})
    pixel = PixelAnonymizer.named(name, config.mask_source)
    datasets = config.datasets or [d for d in dict.fromkeys(task_datasets(feature_store).values())
                                   if d in registered(feature_store)]
    res = extract_baseline(feature_store, pixel, encoder.load(), encoder.sampling(), datasets,
                           batch_size=encoder.batch_size, decode_threads=encoder.decode_threads, log=context.log.info)
    done = [s for s, how in res["shards"].items() if how == "extracted"]
    return dg.MaterializeResult(metadata={
        "skipped": False, "store": dg.MetadataValue.path(res["store"]), "encoder_fingerprint": res["fingerprint"],
        "datasets": dg.MetadataValue.json(datasets), "shards_extracted": len(done),
        "shards_skipped": len(res["shards"]) - len(done), "clips": res["clips"], "videos": res["videos"],
        "quarantined": res["quarantined"], "seconds": round(res["seconds"], 2),
        "clips_per_s": round(res["clips"] / res["seconds"], 1) if res["seconds"] > 0 else 0.0,
        "mask_source": config.mask_source if pixel.masks else "n/a"})
