"""Render actors into frame arrays: (T, H, W, 3) uint8, deterministic for a given rng."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from PIL import Image

from splavu_core.ingest.synth.figure import IDLE, INTERACTIONS, Actor, background, draw_actor, pose, random_prop

FPS = 16
SIZE = 112


@dataclass(frozen=True)
class Shot:
    """Camera and lighting of one video: fixed per video, random per draw."""
    root_x: float      # hip position, fraction of width
    root_y: float      # hip position, fraction of height
    height: float      # figure height, fraction of frame height
    gain: float        # global brightness
    tint: tuple        # per-channel colour cast
    jitter: float      # camera shake (px)


def random_shot(rng: np.random.Generator, closeup: bool = False) -> Shot:
    if closeup:  # VISPR-like person-centric photo: head and torso fill the frame
        height = rng.uniform(1.5, 1.9)
        return Shot(root_x=rng.uniform(0.42, 0.58), root_y=rng.uniform(0.95, 1.1), height=height,
                    gain=rng.uniform(0.8, 1.15), tint=tuple(rng.uniform(0.92, 1.08, 3)), jitter=0.0)
    return Shot(root_x=rng.uniform(0.38, 0.62), root_y=rng.uniform(0.55, 0.62), height=rng.uniform(0.72, 0.88),
                gain=rng.uniform(0.75, 1.2), tint=tuple(rng.uniform(0.9, 1.1, 3)), jitter=rng.uniform(0.0, 1.5))


def render(actor: Actor, timeline: list[tuple[str, int, int]], n_frames: int, rng: np.random.Generator,
           shot: Shot | None = None, size: int = SIZE, static_frame: int | None = None,
           with_masks: bool = False) -> np.ndarray | tuple[np.ndarray, np.ndarray]:
    """Frames of `actor` performing `timeline` [(action, start_frame, end_frame), ...] (idle elsewhere).

    `static_frame`: render that single frame and repeat it (a "boring video" / static clip).
    Returns (T, H, W, 3) uint8, and with `with_masks` also the actor's true silhouette (T, H, W) bool
    (the person region of the pixel baselines), which includes the object in the hand, as a person box would.
    """
    shot = shot or random_shot(rng)
    margin = 4
    bg = background(actor, size, rng, margin)
    speed = rng.uniform(0.7, 1.3)
    phases = rng.uniform(0, 2 * np.pi, len(timeline) + 1)
    t = np.arange(n_frames) / FPS
    labels = np.full(n_frames, -1)
    q = pose(IDLE, t, actor, speed, phases[-1])
    for k, (action, a, b) in enumerate(timeline):
        q[a:b] = pose(action, t[a:b], actor, speed, phases[k])
        labels[a:b] = k
    shake = rng.normal(0, shot.jitter, (n_frames, 2)) if shot.jitter > 0 else np.zeros((n_frames, 2))
    gain = np.asarray(shot.tint) * shot.gain
    props = [None] * n_frames  # drawn after every v1 random choice, so v1 videos keep their bytes
    for action, a, b in timeline:
        if action in INTERACTIONS:
            props[a:b] = [random_prop(action, rng)] * (b - a)
    frames = np.empty((n_frames, size, size, 3), dtype=np.uint8)
    masks = np.zeros((n_frames, size, size), dtype=bool) if with_masks else None
    todo = [static_frame] if static_frame is not None else range(n_frames)
    height = shot.height * size
    for i in todo:
        ox, oy = np.clip(np.round(shake[i] + margin), 0, 2 * margin).astype(int)
        img = Image.fromarray(bg[oy:oy + size, ox:ox + size])
        root = (shot.root_x * size + (ox - margin), shot.root_y * size + (oy - margin))
        draw_actor(img, actor, q[i], root, height, props[i])
        frames[i] = np.clip(np.asarray(img, dtype=np.float32) * gain, 0, 255).astype(np.uint8)
        if with_masks:  # the same drawing on black: no actor colour is pure black
            silhouette = Image.new("RGB", (size, size))
            draw_actor(silhouette, actor, q[i], root, height, props[i])
            masks[i] = np.asarray(silhouette).any(-1)
    if static_frame is not None:
        frames[:] = frames[static_frame]
        if with_masks:
            masks[:] = masks[static_frame]
    return (frames, masks) if with_masks else frames
