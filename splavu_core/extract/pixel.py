"""Pixel-space anonymization baselines: transform decoded frames *before* the frozen encoder.

The paper's claim is that anonymizing latents beats anonymizing pixels in utility and in cost. These
are the pixel methods it compares against, applied at decode time so their features go through the
same store, anonymization-free, and the same evaluation:

    blur      Gaussian blur of the person region        (needs a person mask)
    blacken   the person region set to black            (needs a person mask)
    down2     whole frame downsampled 2x, then back up  (area average, bilinear up)
    down4     whole frame downsampled 4x, then back up

Person masks come from a `MaskSource`:
    rendered  the synthetic renderer's true silhouettes, written beside each video as <stem>.mask.npz
    hog       OpenCV's HOG people detector (weights are compiled into OpenCV: nothing downloads)

A variant's latents live in their own store (<root>/baselines/pixel_<name>) under the encoder
fingerprint plus a suffix for the transform, so they can never be appended to the raw store.
"""
from __future__ import annotations

import hashlib
import json
import threading
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from einops import rearrange

from splavu_core.ingest.masks import PixelError, mask_path, read_masks

# ---------------------------------------------------------------- transforms

@dataclass(frozen=True)
class PixelTransform:
    kind: str                 # "blur" | "blacken" | "downsample"
    sigma: float = 0.0        # blur: Gaussian sigma as a fraction of the frame's short side
    factor: int = 1           # downsample: linear factor
    dilate: float = 0.02      # person mask grown by this fraction of the short side (covers edges)

    def __post_init__(self):
        assert self.kind in ("blur", "blacken", "downsample"), f"unknown pixel transform kind {self.kind!r}"
        assert self.kind != "blur" or self.sigma > 0, "blur needs sigma > 0"
        assert self.kind != "downsample" or self.factor >= 2, "downsample needs factor >= 2"

    @property
    def needs_mask(self) -> bool:
        return self.kind in ("blur", "blacken")

    def as_dict(self) -> dict:
        return asdict(self)

    def __call__(self, frames: np.ndarray, masks: np.ndarray | None = None) -> np.ndarray:
        """(N, H, W, 3) uint8 frames (+ (N, H, W) bool person masks) → transformed (N, H, W, 3) uint8."""
        assert frames.ndim == 4 and frames.shape[-1] == 3 and frames.dtype == np.uint8, (
            f"expected (N, H, W, 3) uint8 frames, got {frames.shape} {frames.dtype}")
        if self.needs_mask:
            assert masks is not None and masks.shape == frames.shape[:3], (
                f"{self.kind} needs (N, H, W) masks matching frames {frames.shape[:3]}, got "
                f"{None if masks is None else masks.shape}")
        if len(frames) == 0:
            return frames.copy()
        H, W = frames.shape[1:3]
        x = rearrange(torch.from_numpy(np.ascontiguousarray(frames)), "n h w c -> n c h w").float()
        if self.kind == "downsample":
            small = F.interpolate(x, size=(max(1, H // self.factor), max(1, W // self.factor)), mode="area")
            y = F.interpolate(small, size=(H, W), mode="bilinear", align_corners=False)
        else:
            m = torch.from_numpy(np.ascontiguousarray(masks))[:, None].float()  # (N, 1, H, W)
            r = round(self.dilate * min(H, W))
            if r > 0:
                m = F.max_pool2d(m, 2 * r + 1, stride=1, padding=r)
            if self.kind == "blacken":
                y = x * (1 - m)
            else:
                y = torch.lerp(x, gaussian_blur(x, self.sigma * min(H, W)), m)
        return rearrange(y.round().clamp(0, 255).to(torch.uint8), "n c h w -> n h w c").numpy()


def gaussian_blur(x: torch.Tensor, sigma: float) -> torch.Tensor:
    """Separable Gaussian blur of (N, C, H, W) float images, edges replicated."""
    r = max(1, int(3 * sigma + 0.5))
    t = torch.arange(-r, r + 1, dtype=torch.float32)
    k = torch.exp(-t ** 2 / (2 * sigma ** 2))
    k = k / k.sum()
    C = x.shape[1]
    x = F.conv2d(F.pad(x, (r, r, 0, 0), mode="replicate"), k.view(1, 1, 1, -1).expand(C, 1, 1, -1), groups=C)
    return F.conv2d(F.pad(x, (0, 0, r, r), mode="replicate"), k.view(1, 1, -1, 1).expand(C, 1, -1, 1), groups=C)


# name -> transform; report rows are "pixel_<name>"
BASELINES: dict[str, PixelTransform] = {
    "blur": PixelTransform("blur", sigma=0.05),
    "blacken": PixelTransform("blacken"),
    "down2": PixelTransform("downsample", factor=2),
    "down4": PixelTransform("downsample", factor=4),
}


def feature_set_name(baseline: str) -> str:
    return f"pixel_{baseline}"


def baseline_transform(name: str) -> PixelTransform:
    if name not in BASELINES:
        raise PixelError(f"unknown pixel baseline {name!r}; choose from {sorted(BASELINES)}")
    return BASELINES[name]


# ---------------------------------------------------------------- person masks

class MaskSource:
    """Person masks of given frames of a video: (F, H, W) bool."""

    name = "none"

    def __call__(self, video: Path, frame_idx: np.ndarray, frames: np.ndarray) -> np.ndarray:
        raise NotImplementedError

    def as_dict(self) -> dict:
        return {"name": self.name}


class RenderedMasks(MaskSource):
    """The synthetic renderer's silhouettes, read from <stem>.mask.npz beside the video."""

    name = "rendered"

    def __call__(self, video, frame_idx, frames):
        p = mask_path(video)
        if not p.is_file():
            raise PixelError(f"{p}: no person mask for this video. mask_source 'rendered' needs the masks the synthetic "
                             f"renderer writes beside each video (`splavu synth --out <data>` adds any missing, e.g. after `make demo`, which skips them); for other videos use "
                             f"mask_source 'hog'")
        try:
            masks = read_masks(p)
        except Exception as e:
            raise PixelError(f"{p}: unreadable person mask ({e})") from None
        if masks.shape[1:] != frames.shape[1:3] or len(masks) <= int(frame_idx.max(initial=0)):
            raise PixelError(f"{p}: masks of shape {masks.shape} do not fit frames {list(frame_idx[[0, -1]])} of "
                             f"{frames.shape[1:3]} in {video}")
        return masks[frame_idx]


class HogPeopleDetector(MaskSource):
    """OpenCV's HOG + linear SVM people detector (Dalal & Triggs); boxes -> a rectangular person mask.

    Frames are resized so the short side is `detect_side` (the detector's 64x128 window needs people
    ~100 px tall); each frame's mask is the union of its boxes and those of its neighbours within
    `hold` frames (HOG misses people in single frames), each box grown by `grow` of its size."""

    name = "hog"

    def __init__(self, detect_side: int = 576, min_score: float = 0.3, hold: int = 2, grow: float = 0.1):
        try:
            import cv2  # here: only the HOG masks need OpenCV
        except ImportError as e:
            raise PixelError("mask_source 'hog' needs OpenCV: pip install 'opencv-python-headless<5'") from e
        if not hasattr(cv2, "HOGDescriptor_getDefaultPeopleDetector"):
            raise PixelError(f"OpenCV {cv2.__version__} has no HOG people detector (removed in 5.0): use "
                             f"'opencv-python-headless<5'")
        self.cv2 = cv2
        self.lock = threading.Lock()  # one detector shared by the decode threads; OpenCV parallelises inside
        self.hog = cv2.HOGDescriptor()
        self.hog.setSVMDetector(cv2.HOGDescriptor_getDefaultPeopleDetector())
        self.detect_side, self.min_score, self.hold, self.grow = detect_side, min_score, hold, grow

    def as_dict(self) -> dict:
        return {"name": self.name, "detect_side": self.detect_side, "min_score": self.min_score,
                "hold": self.hold, "grow": self.grow}

    def boxes(self, frame: np.ndarray) -> np.ndarray:
        """(K, 4) x0, y0, x1, y1 boxes of people in one (H, W, 3) uint8 RGB frame, frame pixels."""
        H, W = frame.shape[:2]
        s = self.detect_side / min(H, W)
        img = self.cv2.resize(frame, (round(W * s), round(H * s))) if s != 1 else frame
        with self.lock:
            rects, scores = self.hog.detectMultiScale(np.ascontiguousarray(img[..., ::-1]), winStride=(8, 8),
                                                      padding=(8, 8), scale=1.05)
        scores = np.asarray(scores, np.float32).reshape(-1)
        rects = np.asarray(rects, np.float32).reshape(-1, 4)[scores >= self.min_score] / s
        x, y, w, h = rects.T
        g = self.grow / 2
        return np.stack([x - g * w, y - g * h, x + w * (1 + g), y + h * (1 + g)], 1) if len(rects) else np.zeros((0, 4))

    def __call__(self, video, frame_idx, frames):
        H, W = frames.shape[1:3]
        per_frame = [self.boxes(f) for f in frames]
        masks = np.zeros(frames.shape[:3], bool)
        idx = np.asarray(frame_idx)
        for i, f in enumerate(idx):
            for j in np.flatnonzero(np.abs(idx - f) <= self.hold):
                for x0, y0, x1, y1 in per_frame[j]:
                    masks[i, max(0, int(y0)):min(H, int(np.ceil(y1))), max(0, int(x0)):min(W, int(np.ceil(x1)))] = True
        return masks


MASK_SOURCES = ("none", "rendered", "hog")


def mask_source(name: str) -> MaskSource | None:
    if name == "rendered":
        return RenderedMasks()
    if name == "hog":
        return HogPeopleDetector()
    if name in ("", "none"):
        return None
    raise PixelError(f"unknown mask_source {name!r}; choose from {MASK_SOURCES}")


# ---------------------------------------------------------------- applied at decode time

@dataclass
class PixelAnonymizer:
    """One baseline as extraction applies it: transform + where its person masks come from."""

    name: str
    transform: PixelTransform
    masks: MaskSource | None = None

    def __post_init__(self):
        if self.transform.needs_mask and self.masks is None:
            raise PixelError(f"pixel baseline {self.name!r} ({self.transform.kind} of the person region) needs a person "
                             f"mask: set mask_source to 'rendered' (synthetic benchmark) or 'hog' (OpenCV people "
                             f"detector)")

    @classmethod
    def named(cls, name: str, masks: str = "none") -> "PixelAnonymizer":
        t = baseline_transform(name)
        return cls(name, t, mask_source(masks) if t.needs_mask else None)

    def __call__(self, video: Path, frame_idx: np.ndarray, frames: np.ndarray) -> np.ndarray:
        """(F, H, W, 3) uint8 decoded frames at `frame_idx` of `video` → the same frames anonymized."""
        m = self.masks(video, frame_idx, frames) if self.transform.needs_mask else None
        return self.transform(frames, m)

    def as_dict(self) -> dict:
        return {"name": self.name, "transform": self.transform.as_dict(),
                "mask_source": self.masks.as_dict() if self.masks else None}

    def provenance(self, encoder_provenance: dict) -> dict:
        """The encoder's provenance with the fingerprint suffixed by this baseline (its own store identity)."""
        base = encoder_provenance["encoder_fingerprint"]
        h = hashlib.sha256(json.dumps(self.as_dict(), sort_keys=True).encode()).hexdigest()[:8]
        return {**encoder_provenance, "encoder_fingerprint": f"{base}+{feature_set_name(self.name)}-{h}",
                "base_encoder_fingerprint": base, "pixel_baseline": self.as_dict()}


def baseline_root(root: str | Path, name: str) -> str:
    """Where the store of baseline `name` lives under a store root."""
    return f"{str(root).rstrip('/')}/baselines/{feature_set_name(name)}"
