"""Frame preprocessing that follows a checkpoint's saved processor config, without torchvision.

resize short side → centre crop → rescale → normalise, as the transformers image processors
of the VideoMAE and V-JEPA 2 families do.
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from splavu_core.extract.decode import crop_box

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


@dataclass(frozen=True)
class Preprocess:
    short_side: int = 224
    crop: int = 224
    rescale: float = 1 / 255
    mean: tuple = IMAGENET_MEAN
    std: tuple = IMAGENET_STD

    @classmethod
    def for_checkpoint(cls, path: str | Path, family: str, image_size: int) -> "Preprocess":
        """Read `preprocessor_config.json` / `video_preprocessor_config.json` if present, else family defaults."""
        for name in ("video_preprocessor_config.json", "preprocessor_config.json"):
            f = Path(path) / name
            if f.is_file():
                return cls.from_processor_config(json.loads(f.read_text()), image_size)
        if family == "vjepa2":  # V-JEPA 2 resizes by 256/224 then crops
            return cls(short_side=int(image_size * 256 / 224), crop=image_size)
        return cls(short_side=image_size, crop=image_size)

    @classmethod
    def from_processor_config(cls, cfg: dict, image_size: int) -> "Preprocess":
        size = cfg.get("size") or {}
        crop = cfg.get("crop_size") or {}
        short = size.get("shortest_edge") or size.get("height") or image_size
        crop_px = crop.get("height") or crop.get("shortest_edge") or image_size
        if cfg.get("do_center_crop") is False:
            crop_px = short
        return cls(short_side=int(short), crop=int(crop_px),
                   rescale=float(cfg.get("rescale_factor", 1 / 255)) if cfg.get("do_rescale", True) else 1.0,
                   mean=tuple(cfg.get("image_mean", IMAGENET_MEAN)) if cfg.get("do_normalize", True) else (0.0,) * 3,
                   std=tuple(cfg.get("image_std", IMAGENET_STD)) if cfg.get("do_normalize", True) else (1.0,) * 3)

    def as_dict(self) -> dict:
        return asdict(self)

    def __call__(self, frames: np.ndarray | torch.Tensor) -> torch.Tensor:
        """(B, T, H, W, 3) uint8 → (B, T, 3, crop, crop) float32 (a channels-last view when no resize is needed).

        The same float32 operations in the same order either way (rescale, minus mean, over std), so the values are
        bit-for-bit those of the plain path; only fewer temporaries and copies."""
        x = self.stage(frames)
        if x.dtype != torch.uint8:
            return x
        return self.normalise_(x.to(torch.float32, copy=True)).permute(0, 1, 4, 2, 3)

    def stage(self, frames: np.ndarray | torch.Tensor) -> torch.Tensor:
        """What a decode thread does to a video's clips: (B, T, H, W, 3) uint8 → the centre crop, still uint8
        (B, T, crop, crop, 3), when no resize is needed (a quarter of the bytes; `batch` converts it straight into
        its slot); else resized and normalised, (B, T, 3, crop, crop) float32."""
        x = torch.as_tensor(frames)
        assert x.ndim == 5 and x.shape[-1] == 3, f"expected (B, T, H, W, 3) frames, got {tuple(x.shape)}"
        B, T, H, W, _ = x.shape
        if (box := crop_box(H, W, self.short_side, self.crop)) is not None:
            top, left = box
            return x[:, :, top:top + self.crop, left:left + self.crop]
        x = x.permute(0, 1, 4, 2, 3).reshape(B * T, 3, H, W).float()
        s = self.short_side / min(H, W)
        x = F.interpolate(x, size=(round(H * s), round(W * s)), mode="bilinear", align_corners=False, antialias=True)
        h, w = x.shape[-2:]
        top, left = (h - self.crop) // 2, (w - self.crop) // 2
        x = x[..., top:top + self.crop, left:left + self.crop]
        mean = torch.tensor(self.mean).view(1, 3, 1, 1)
        std = torch.tensor(self.std).view(1, 3, 1, 1)
        x = (x * self.rescale - mean) / std
        return x.reshape(B, T, 3, self.crop, self.crop)

    def normalise_(self, x: torch.Tensor) -> torch.Tensor:
        """(..., S, S, 3) contiguous float32 frames, in place: (x * rescale - mean) / std, the plain path's float32
        ops in its order. Broadcast along rows of S * 3 values, not the 3-long channel dimension, which torch does
        not vectorise (measured: 2.1 → 0.6 ms a 112 px clip)."""
        W = x.shape[-2]
        rows = x.view(-1, W * 3)
        mean, std = torch.tensor(self.mean, device=x.device), torch.tensor(self.std, device=x.device)
        rows.mul_(self.rescale).sub_(mean.repeat(W)).div_(std.repeat(W))
        return x

    def batch(self, clips: list[torch.Tensor], T: int) -> torch.Tensor:
        """Staged clips → one (B, T, 3, crop, crop) float32 batch, channels last in memory (the layout the
        encoder is fed: its kernels' results depend on it). Each clip is converted and normalised in its own slot, no
        intermediate copy. A clip: (T, crop, crop, 3) uint8 or (T, 3, crop, crop) float from `stage`; one frame
        ((1, ...)) is a static clip, the frame repeated T times (prepared once, then copied)."""
        out = torch.empty(len(clips), T, self.crop, self.crop, 3)  # (B, T, S, S, 3)
        for slot, c in zip(out, clips):
            first = slot[:c.shape[0]]
            if c.dtype == torch.uint8:
                self.normalise_(first.copy_(c))
            else:
                first.copy_(c.permute(0, 2, 3, 1))
            if c.shape[0] == 1:
                slot[1:].copy_(first.expand(T - 1, -1, -1, -1))
        return out.permute(0, 1, 4, 2, 3)

    def frames(self, x: torch.Tensor) -> torch.Tensor:
        """(N, H, W, 3) uint8 frames of one size, on any device → (N, crop, crop, 3) float32 on that device, normalised
        (contiguous: channels last). The float32 operations of `stage` + `batch` in their order, so the same bits."""
        N, H, W, _ = x.shape
        S = self.crop
        if (box := crop_box(H, W, self.short_side, S)) is not None:
            top, left = box
            out = torch.empty(N, S, S, 3, device=x.device)
            return self.normalise_(out.copy_(x[:, top:top + S, left:left + S]))
        y = x.permute(0, 3, 1, 2).float()  # (N, 3, H, W), channels last in memory, as stage has it
        s = self.short_side / min(H, W)
        y = F.interpolate(y, size=(round(H * s), round(W * s)), mode="bilinear", align_corners=False, antialias=True)
        h, w = y.shape[-2:]
        top, left = (h - S) // 2, (w - S) // 2
        y = y[..., top:top + S, left:left + S]
        mean = torch.tensor(self.mean, device=x.device).view(1, 3, 1, 1)
        std = torch.tensor(self.std, device=x.device).view(1, 3, 1, 1)
        y = (y * self.rescale - mean) / std
        return y.permute(0, 2, 3, 1).contiguous()

    def on_device(self, clips: list[torch.Tensor], T: int, grouped: bool | None = None) -> torch.Tensor:
        """uint8 clips on the encoder's device, as the decoders hand them over ((T, H, W, 3) a clip, (1, H, W, 3) a
        static clip whose frame is repeated T times; any sizes) → one (B, T, 3, crop, crop) float32 batch, channels
        last in memory. On a GPU one step per frame size for the whole batch (usually one size: one step); on CPU
        clips that need no resize are converted slot by slot, as `batch` does, while each is in cache (measured: the
        whole batch at once ran 1.65 ms a clip against 1.45, and gathering static clips into place 4.3). `grouped`:
        the GPU's way on any device (None: by device)."""
        S = self.crop
        by_size: dict[tuple, list[int]] = {}
        for i, c in enumerate(clips):
            assert c.dtype == torch.uint8 and c.ndim == 4 and c.shape[0] in (1, T), (
                f"expected (T or 1, H, W, 3) uint8 clips, got {tuple(c.shape)} {c.dtype}")
            by_size.setdefault(tuple(c.shape[1:3]), []).append(i)
        device = clips[0].device
        grouped = device.type != "cpu" if grouped is None else grouped
        out = torch.empty(len(clips), T, S, S, 3, device=device)  # (B, T, S, S, 3)
        for (H, W), members in by_size.items():
            box = crop_box(H, W, self.short_side, S)
            if box is not None and not grouped:
                top, left = box
                for i in members:
                    first = out[i, :clips[i].shape[0]]
                    self.normalise_(first.copy_(clips[i][:, top:top + S, left:left + S]))
                    if clips[i].shape[0] == 1:
                        out[i, 1:].copy_(first.expand(T - 1, -1, -1, -1))
                continue
            counts = [clips[i].shape[0] for i in members]
            x = self.frames(torch.cat([clips[i] for i in members]))  # (F, S, S, 3)
            if all(n == T for n in counts):
                if len(members) == len(clips):
                    return x.view(len(clips), T, S, S, 3).permute(0, 1, 4, 2, 3)
                x = x.view(len(members), T, S, S, 3)
            else:  # each member's T rows of x: a clip's own frames, or its static frame T times
                starts = np.cumsum([0] + counts[:-1])
                src = np.concatenate([s + (np.arange(T) if n == T else np.zeros(T, np.int64))
                                      for s, n in zip(starts, counts)])
                x = x.index_select(0, torch.as_tensor(src, device=device)).view(len(members), T, S, S, 3)
            out.index_copy_(0, torch.as_tensor(members, device=device), x)
        return out.permute(0, 1, 4, 2, 3)
