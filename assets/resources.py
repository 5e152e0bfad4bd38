"""Resources: where the store lives and which frozen encoder fills it. Chosen per environment."""
from __future__ import annotations

import os

import dagster as dg
from pydantic import Field

from splavu_core.extract.encoders.vfm import DEMO_CHECKPOINT, FrozenEncoder, load_encoder
from splavu_core.extract.sampling import ClipSampling
from splavu_core.store.feature_store import FeatureStore, default_root
from splavu_core.store.fs import is_url


def store_root_default() -> str:
    """The store a run reads and writes unless its run config names another: $SPLAVU_STORE, else ./store, as the code
    location loads it; a local path is made absolute then, so the Launchpad shows the folder itself."""
    root = default_root()
    return root if is_url(root) else os.path.abspath(root)


class StoreResource(dg.ConfigurableResource):
    """The store root: a local path or an fsspec URL such as s3://bucket/prefix (`SPLAVU_STORE` overrides the
    default ./store; credentials and endpoint from the standard AWS variables and `SPLAVU_STORAGE_OPTIONS`,
    see splavu_core/store/fs.py). The inbox is always a local folder: set `inbox` for an object-store root.
    The code location states `root` (pipeline/definitions.py), so the Launchpad shows which store a run writes to."""

    root: str = Field(default_factory=store_root_default,
                      description="the store this run reads and writes: a local folder or an fsspec URL "
                                  "(s3://bucket/prefix); default $SPLAVU_STORE, else ./store, when the code location "
                                  "loaded")
    inbox: str = Field(default="", description="folder watched for new datasets (default <root>/inbox)")

    def store(self) -> FeatureStore:
        return FeatureStore(self.root)

    def inbox_dir(self) -> str:
        return self.inbox or f"{self.root}/inbox"


class EncoderResource(dg.ConfigurableResource):
    """A frozen VFM checkpoint (save_pretrained dir or hub id) and how clips are sampled for it."""

    checkpoint: str = str(DEMO_CHECKPOINT)
    device: str = "auto"
    batch_size: int = 16
    threads: int = 0
    decode_threads: int = 2
    clip_len: int = 16
    frame_step: int = 1
    target_fps: float | None = None
    static_k: int = ClipSampling.static_k  # one default (splavu_core/extract/sampling.py says why 4)
    static_splits: list[str] = ["train"]
    quantize: str = Field(default="", description="'' (fp32) or 'int8': the linear layers in int8 on CPU, 1.4-1.5x "
                          "faster, cosine to fp32 >= 0.998 (benchmarks/extract_int8.py); another encoder fingerprint")
    static_datasets: list[str] = Field(default=[], description="datasets that get static latents (empty: those "
                                       "registered with a training role, decided at ingest); only the AAM's "
                                       "training datasets need them")

    def static_splits_for(self, dataset: str, registered_static: bool = True) -> tuple[str, ...]:
        wanted = dataset in self.static_datasets if self.static_datasets else registered_static
        return tuple(self.static_splits) if wanted else ()

    def sampling(self) -> ClipSampling:
        return ClipSampling(clip_len=self.clip_len, frame_step=self.frame_step, target_fps=self.target_fps,
                            static_k=self.static_k)

    def load(self) -> FrozenEncoder:
        return load_encoder(self.checkpoint, device=self.device, threads=self.threads or None,
                            quantize=self.quantize or None)
