"""The SPLAVU Anonymizing Adapter Module: model, losses, safe persistence."""
from splavu_core.aam.io import adapter_version, load_adapter, save_adapter
from splavu_core.aam.losses import latent_consistency, nt_xent
from splavu_core.aam.model import AAMConfig, AnonymizingAdapter

__all__ = ["AAMConfig", "AnonymizingAdapter", "nt_xent", "latent_consistency",
           "save_adapter", "load_adapter", "adapter_version"]
