"""Frozen video foundation models (transformers VideoMAE / V-JEPA 2) as clip embedders.

Embedding = mean of the encoder's last_hidden_state over tokens (V-JEPA 2: encoder only,
predictor skipped). Every store records the encoder fingerprint: a hash of the weights, the
config, the preprocessing and the clip sampling, so latents of two encoders never mix.
"""
from __future__ import annotations

import copy
import hashlib
import json
import os
import time
import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from splavu_core.extract.encoders import ACTION_CHECKPOINT, DEMO_CHECKPOINT, DEMO_ENCODERS, QUANTIZE  # noqa: F401
from splavu_core.extract.encoders.preprocess import Preprocess
from splavu_core.extract.sampling import ClipSampling
from splavu_core.extract.stage_times import StageTimes



class EncoderError(Exception):
    pass


@dataclass
class FrozenEncoder:
    family: str             # "videomae" | "vjepa2"
    source: str             # directory or hub id it was loaded from
    model: torch.nn.Module
    preprocess: Preprocess
    num_frames: int         # frames per clip the model expects
    dim: int
    weights_hash: str
    config_json: str
    device: torch.device
    autocast_dtype: torch.dtype | None
    quantize: str | None = None  # "int8": linear layers int8 on CPU (encoders.QUANTIZE: what it measured)

    def fingerprint(self, sampling: ClipSampling) -> str:
        """Hash of weights + config + preprocessing + clip sampling (+ quantisation, when on) (16 hex chars): int8
        latents are other latents, never mixed with the fp32 ones in one store."""
        parts = {"weights": self.weights_hash, "config": self.config_json,
                 "preprocess": self.preprocess.as_dict(), "sampling": sampling.as_dict()}
        if self.quantize:
            parts["quantize"] = self.quantize
        blob = json.dumps(parts, sort_keys=True)
        return f"{self.family}-{hashlib.sha256(blob.encode()).hexdigest()[:16]}"

    def provenance(self, sampling: ClipSampling) -> dict:
        return {"encoder_fingerprint": self.fingerprint(sampling), "encoder_family": self.family,
                "encoder_source": self.source, "weights_sha256": self.weights_hash, "dim": self.dim,
                "preprocess": self.preprocess.as_dict(), "sampling": sampling.as_dict(),
                **({"quantize": self.quantize} if self.quantize else {})}

    def embed(self, frames: np.ndarray) -> np.ndarray:
        """(B, T, H, W, 3) uint8 clips → (B, D) float32 embeddings."""
        return self.embed_prepared(self.prepare(frames))

    def prepare(self, frames: np.ndarray) -> torch.Tensor:
        """(B, T, H, W, 3) uint8 clips of any one size → (B, T, 3, crop, crop): clips of videos of different sizes
        can be batched once prepared. Per frame, so preparing video by video gives what one batch would."""
        assert frames.shape[1] in (1, self.num_frames), f"encoder wants {self.num_frames}-frame clips, got {frames.shape[1]}"
        return self.preprocess(frames)

    def embed_clips(self, clips: list[torch.Tensor], times: StageTimes | None = None) -> np.ndarray:
        """Clips as `preprocess.stage` left them (uint8 crops or resized floats; one frame = a static clip) → (B, D):
        extraction's path with decode threads, where each encoder worker builds its own batch (conversion and
        normalisation in the batch's slots) beside the other's forward."""
        t0 = time.perf_counter()
        x = self.preprocess.batch(clips, self.num_frames)
        t1 = time.perf_counter()
        out = self.embed_prepared(x)
        if times is not None:
            times.add(prepare=t1 - t0, forward=time.perf_counter() - t1)
        return out

    @torch.no_grad()
    def embed_prepared(self, x: torch.Tensor) -> np.ndarray:
        """(B, T, 3, crop, crop) prepared clips → (B, D) float32 embeddings."""
        return self._forward(x).cpu().numpy()

    @torch.no_grad()
    def embed_frames(self, clips: list[torch.Tensor], ready=(), times: StageTimes | None = None):
        """uint8 clips on this encoder's device as the decoders hand them over ((T, H, W, 3) a clip, (1, H, W, 3) a
        static clip; any sizes) → (B, D) embeddings: extraction's path, preparation on the device for the whole batch
        (Preprocess.on_device). `ready`: CUDA events the clips' copies recorded. On CPU the embeddings come back as an
        array; on CUDA as Pending, whose numpy() waits, so this thread can queue the next batch meanwhile."""
        if self.device.type != "cuda":
            t0 = time.perf_counter()
            x = self.preprocess.on_device(clips, self.num_frames)
            t1 = time.perf_counter()
            out = self._forward(x).numpy()
            if times is not None:
                times.add(prepare=t1 - t0, forward=time.perf_counter() - t1)
            return out
        stream = torch.cuda.current_stream(self.device)
        for ev in ready:
            stream.wait_event(ev)
        for c in clips:  # made on another stream: its memory is not reused before this stream is done with it
            c.record_stream(stream)
        marks = [torch.cuda.Event(enable_timing=True) for _ in range(3)] if times is not None else []
        if marks:
            marks[0].record(stream)
        x = self.preprocess.on_device(clips, self.num_frames)
        if marks:
            marks[1].record(stream)
        emb = self._forward(x)
        if marks:
            marks[2].record(stream)
        host = torch.empty(emb.shape, dtype=emb.dtype, pin_memory=True)
        host.copy_(emb, non_blocking=True)
        done = torch.cuda.Event()
        done.record(stream)
        return Pending(host, done, marks, times)

    def _forward(self, x: torch.Tensor) -> torch.Tensor:
        """(B, T, 3, crop, crop) prepared clips → (B, D) float32 embeddings on this encoder's device."""
        assert x.shape[1] == self.num_frames, f"encoder wants {self.num_frames}-frame clips, got {x.shape[1]}"
        # one memory layout (channels last, what prepare() gives a whole batch): the kernels' results depend on it,
        # and a clip's latent must not depend on how its batch was put together
        x = x.permute(0, 1, 3, 4, 2).contiguous().permute(0, 1, 4, 2, 3).to(self.device)
        with torch.autocast(self.device.type, dtype=self.autocast_dtype or torch.float32,
                            enabled=self.autocast_dtype is not None):
            if self.family == "vjepa2":
                h = self.model(pixel_values_videos=x, skip_predictor=True).last_hidden_state
            else:
                h = self.model(pixel_values=x).last_hidden_state
        return h.float().mean(1)  # (B, D)


@dataclass
class Pending:
    """A CUDA batch's embeddings on their way to pinned host memory."""
    host: torch.Tensor
    done: "torch.cuda.Event"
    marks: list
    times: StageTimes | None

    def numpy(self) -> np.ndarray:
        self.done.synchronize()
        if self.times is not None and self.marks:
            e0, e1, e2 = self.marks
            self.times.add(prepare=e0.elapsed_time(e1) / 1e3, forward=e1.elapsed_time(e2) / 1e3)
        return self.host.numpy()


def pick_device(device: str = "auto") -> tuple[torch.device, torch.dtype | None]:
    """auto: CUDA with bf16 autocast when present, else CPU fp32 (bf16 on CPUs without AMX is slower)."""
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    dev = torch.device(device)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise EncoderError("device 'cuda' requested but no CUDA device is available")
    return dev, (torch.bfloat16 if dev.type == "cuda" else None)


def state_hash(model: torch.nn.Module) -> str:
    h = hashlib.sha256()
    for name, t in sorted(model.state_dict().items()):
        t = t.detach().cpu().contiguous()
        h.update(f"{name}:{t.dtype}:{tuple(t.shape)}".encode())
        h.update(t.view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return h.hexdigest()


def _config_json(cfg) -> str:
    d = {k: v for k, v in cfg.to_dict().items() if k not in ("transformers_version", "_name_or_path", "dtype", "torch_dtype")}
    return json.dumps(d, sort_keys=True, default=str)


def load_encoder(source: str | os.PathLike = DEMO_CHECKPOINT, device: str = "auto", threads: int | None = None,
                 quantize: str | None = None) -> FrozenEncoder:
    """Load a VideoMAE or V-JEPA 2 checkpoint: a `save_pretrained` directory or (online) a hub id. quantize="int8":
    its linear layers in int8 (CPU only; the fingerprint says so)."""
    if quantize and quantize not in QUANTIZE:
        raise EncoderError(f"quantize={quantize!r}: choose from {QUANTIZE} (or none)")
    from transformers import AutoConfig  # here: seconds to import, only loading an encoder needs it
    from transformers.utils import logging as hf_logging  # transformers: seconds to import

    hf_logging.disable_progress_bar()  # one bar per shard drowns the CLI's own progress
    if threads:
        torch.set_num_threads(threads)
    source = str(source)
    is_dir = os.path.isdir(source)
    try:
        cfg = AutoConfig.from_pretrained(source)
    except Exception as e:
        where = "directory" if is_dir else "not a local directory, and the hub lookup failed"
        raise EncoderError(f"cannot load encoder from {source!r} ({where}): {str(e).splitlines()[0]}") from None
    family = cfg.model_type
    if family == "videomae":
        from transformers import VideoMAEModel as cls  # transformers: seconds to import

        num_frames, image_size = cfg.num_frames, cfg.image_size
    elif family == "vjepa2":
        from transformers import VJEPA2Model as cls  # transformers: seconds to import

        num_frames, image_size = cfg.frames_per_clip, cfg.crop_size
    else:
        raise EncoderError(f"{source}: model_type {family!r} is not supported (use a VideoMAE or V-JEPA 2 checkpoint)")
    dev, autocast = pick_device(device)
    model = cls.from_pretrained(source, config=cfg).to(dev).eval()
    for p in model.parameters():
        p.requires_grad_(False)
    pre = Preprocess.for_checkpoint(source, family, image_size) if is_dir else Preprocess(short_side=image_size, crop=image_size)
    weights = state_hash(model)  # of the checkpoint's weights, before any quantisation
    if quantize:
        if dev.type != "cpu":
            raise EncoderError(f"quantize={quantize!r} runs on CPU only; this encoder is on {dev} (use --device cpu)")
        model = int8_linear(model)
    return FrozenEncoder(family=family, source=source, model=model, preprocess=pre, num_frames=int(num_frames),
                         dim=int(cfg.hidden_size), weights_hash=weights,
                         config_json=_config_json(cfg),
                         device=dev, autocast_dtype=autocast, quantize=quantize)


def int8_linear(model: torch.nn.Module) -> torch.nn.Module:
    """A copy of `model` with its nn.Linear layers int8 (per-tensor weights, dynamic activation scales)."""
    from torch.ao.quantization import quantize_dynamic  # here: only the int8 path loads it

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch deprecates torch.ao.quantization in favour of torchao
        return quantize_dynamic(copy.deepcopy(model), {torch.nn.Linear}, dtype=torch.qint8)
