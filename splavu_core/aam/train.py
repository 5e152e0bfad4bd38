"""Fit the AAM from cached latents only (the frozen encoder never runs here): `train_aam`, what aam_model calls.

The default adapter (TrainConfig's defaults) is a closed form, fitted with no step of gradient descent (aam/closed_form.py):
the keep stage publishes the k directions of the latents that carry the most utility (the fitted tasks' labels and
the training videos' motion) per unit of everything else (aam/keep.py); recentring then replaces each video's kept mean
by its expected centroid among k-means clusters of the training clips, or the trained classes (recentre_on). The
appearance projection (projection_fraction > 0) runs first when asked for. No private-attribute label is read.

Only an adapter with a trained stage (AAMConfig layers > 0, and loop epochs > 0) enters the paper's joint training loop
(aam/paper_loop.py: its loss), after the closed-form stages and before recentring.

The configuration is aam/config.py's TrainConfig; what it trains on, aam/training_data.py's TrainingData.
"""
from __future__ import annotations

import time

import numpy as np
import torch

from splavu_core.aam.closed_form import fit_keep_into, fit_projection_into, fit_recentre_into, n_centroids
from splavu_core.aam.config import TrainConfig
from splavu_core.aam.diagnostics import diagnose_adapter, heldout_split
from splavu_core.aam.model import AAMConfig, AnonymizingAdapter
from splavu_core.aam.training_data import TrainingData, TrainingDataError, check_data, training_clips


def adapter_config(data: TrainingData, cfg: TrainConfig, log) -> AAMConfig:
    """cfg.adapter with what training derives from the data: dim, the projection rank (from projection_fraction,
    unless the adapter sets it) and recentring's centroids (recentring off when there are fewer than 2)."""
    adapter_kw = dict(cfg.adapter)
    adapter_kw.setdefault("projection_rank", int(round(cfg.projection.projection_fraction * data.dim)))
    if adapter_kw.get("recentre"):  # on classes: the trained actions' (+ AD's); without task 'ar' there are none
        centroids = n_centroids(data, cfg.tasks, cfg)               # what fit_recentre will find
        if centroids >= 2:
            adapter_kw["centroids"] = centroids                     # derived from the data, like dim
            adapter_kw["recentre_clips"] = cfg.recentre_on == "clips"
        else:
            adapter_kw["recentre"] = False
            if log:
                log("recentre: off (recentre_on 'classes' recentres on the trained actions' centroids; task 'ar' "
                    "is not trained)" if cfg.recentre_on == "classes" else
                    "recentre: off (fewer than 2 training clips to cluster)")
    per_clip = [k for k in ("recentre_draw", "recentre_top") if adapter_kw.get(k)]
    if per_clip and not adapter_kw.get("recentre_clips"):  # drawn or cut per clip: nothing to do on whole videos
        for k in per_clip:
            adapter_kw.pop(k)
        if log and adapter_kw.get("recentre"):
            log(f"{', '.join(per_clip)}: off (recentre_on 'classes' matches whole videos, not clips)")
    return AAMConfig(dim=data.dim, oracle=cfg.loop.oracle, **adapter_kw)


def train_aam(data: TrainingData, cfg: TrainConfig, log=print) -> tuple[AnonymizingAdapter, AAMConfig, dict]:
    """Returns the fitted adapter, its config, and a summary: the closed-form fits (appearance projection, keep,
    recentre), and for a trained adapter the history of per-epoch losses and validation metrics and the selected epoch.

    summary["diagnostics"]: fresh-critic pair matching on held-out videos before (raw) and after the adapter,
    during training and for the selected adapter (aam.diagnostics)."""
    check_data(data, cfg)
    if cfg.loop.oracle and data.attributes is None:
        raise TrainingDataError("the oracle variant needs private-attribute labels (load_oracle_labels); "
                                "it is a diagnostic and is never trained by default")
    torch.manual_seed(cfg.seed)
    acfg = adapter_config(data, cfg, log)
    adapter = AnonymizingAdapter(acfg)

    n_static = len(data.static)
    diagnose = cfg.heldout_fraction > 0 and n_static >= 8
    if diagnose:
        fit_idx, held_idx = heldout_split(n_static, cfg.heldout_fraction, cfg.seed, minimum=min(32, n_static // 4))
    else:
        fit_idx, held_idx = np.arange(n_static), np.arange(0)
    projection = fit_projection_into(adapter, data, fit_idx, cfg, log) if acfg.projection_rank else None
    keep = fit_keep_into(adapter, data, cfg, log) if acfg.keep else None
    # recentring is per video and fitted on what the other stages publish: trained blocks learn on lone clips
    # without it, and it is fitted after them (below)
    recentre_stage, adapter.recentre = adapter.recentre, None
    with torch.no_grad():                                           # LC normaliser: mean per-dimension variance
        pool = training_clips(data)[2]
        scale = float((adapter.fixed_stages(pool) if acfg.keep else pool).var(0).mean())

    trainable = any(p.requires_grad for p in adapter.parameters())
    if trainable and cfg.loop.epochs > 0:
        from splavu_core.aam.paper_loop import train_loop

        run = train_loop(adapter, data, cfg, fit_idx, held_idx, diagnose, scale, log)
    else:
        if not trainable and log:
            log("closed-form adapter (no trainable stage): nothing to train after the fit")
        run = {"history": [], "selected_epoch": 0, "seconds": 0.0, "during": [],
               "raw": diagnose_adapter(None, data, fit_idx, held_idx, cfg.seed, cfg.diagnose_steps) if diagnose
               else None}
        adapter.eval()
    t0 = time.perf_counter()
    if recentre_stage is not None:
        keep["recentre"] = fit_recentre_into(adapter, recentre_stage, data, cfg, log)
        acfg = adapter.cfg  # its centroid count, when clusters of too few people were pooled
    diag = {"raw": run["raw"], "during": run["during"]}
    if diagnose:
        diag["selected"] = diagnose_adapter(adapter, data, fit_idx, held_idx, cfg.seed, cfg.diagnose_steps)
        if log:
            log("pair matching of a fresh critic on held-out videos (chance {:.3f}): ".format(diag["raw"]["chance"])
                + ", ".join(f"{k} {diag['raw'][k]:.3f} -> {diag['selected'][k]:.3f}"
                            for k in diag["raw"] if k != "chance"))
    history, best = run["history"], run["selected_epoch"]
    seconds = round(run["seconds"] + time.perf_counter() - t0, 2)  # the epochs, recentring and the last diagnostics
    return adapter, acfg, {
        "selected_epoch": best, "history": history, "seconds": seconds, "lc_scale": scale,
        "train_config": cfg.flat(), "projection": projection, "keep": keep, "diagnostics": diag if diagnose else None,
        "heldout_videos": int(len(held_idx)), "final": history[best - 1] if best else {},
        "parameters": sum(p.numel() for p in adapter.parameters())}
