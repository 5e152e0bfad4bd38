"""Label-free diagnostics: after the adapter, can a *fresh* critic still tell which video a clip came from?

A rising privacy loss proves nothing (a fixed-cosine NT-Xent is maximised by anti-aligning two static
clips, which an attacker undoes). What an attacker needs is *shared information*: two clips of one video
carry the same person, clothes and scene. So we train a fresh critic (a small MLP projection, symmetric
InfoNCE) to match pairs of one video, on some videos, and report its top-1 matching accuracy among
`group` held-out videos (chance = 1 / group):

- static <-> static: two static clips (one frame repeated) of the same video: appearance and scene only;
- static <-> action: a static clip and a moving clip of the same video: what a published clip still
  shares with a still image of the person.

Measured before (raw latents) and after the adapter. No attribute label is read here.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

from splavu_core.aam.losses import info_nce
from splavu_core.threads import intra_op_threads

KINDS = ("static_static", "static_action")


class PairCritic(nn.Module):
    """Projects a clip so that two clips of the same video match (trained with InfoNCE): the diagnostics'
    fresh critic, and the learned critic of the training objective."""

    def __init__(self, dim: int, hidden: int = 256):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(dim, hidden), nn.ReLU(), nn.Linear(hidden, 64))

    def logits(self, a: torch.Tensor, b: torch.Tensor, temperature: float = 0.1) -> torch.Tensor:  # (N, D) x2 -> (N, N)
        return F.normalize(self.net(a), dim=1) @ F.normalize(self.net(b), dim=1).T / temperature


def _pairs(static: np.ndarray, actions: Sequence[np.ndarray] | None, kind: str, rng: np.random.Generator):
    """One (a, b) pair per video: (V, D), (V, D)."""
    V, K, _ = static.shape
    k1 = rng.integers(K, size=V)
    a = static[np.arange(V), k1]
    if kind == "static_static":
        k2 = (k1 + rng.integers(1, K, size=V)) % K                    # a different frame of the same video
        return a, static[np.arange(V), k2]
    assert actions is not None and len(actions) == V, "static_action pairs need the videos' action clips"
    return a, np.stack([clips[rng.integers(len(clips))] for clips in actions])


def critic_pair_matching(static: np.ndarray, actions: Sequence[np.ndarray] | None, train_idx: np.ndarray,
                         test_idx: np.ndarray, kind: str, transform: Callable[[np.ndarray], np.ndarray] | None = None,
                         seed: int = 0, steps: int = 300, group: int = 32, hidden: int = 256, rounds: int = 8) -> float:
    """Top-1 pair-matching accuracy of a fresh critic on held-out videos (chance 1/group)."""
    assert kind in KINDS, f"kind must be one of {KINDS}, got {kind!r}"
    assert len(test_idx) >= group, f"need >= {group} held-out videos, got {len(test_idx)}"
    transform = transform or (lambda x: x)
    rng = np.random.default_rng(seed)
    torch.manual_seed(seed)
    # the features the critic sees: every static clip and action clip, through the adapter once
    st = transform(static.reshape(-1, static.shape[-1])).reshape(*static.shape[:2], -1)  # (V, K, D or k)
    ac = None if actions is None else [transform(a) for a in actions]
    mean, std = st.reshape(-1, st.shape[-1]).mean(0), st.reshape(-1, st.shape[-1]).std(0) + 1e-6
    norm = lambda x: torch.from_numpy(((x - mean) / std).astype(np.float32))          # noqa: E731
    sub = lambda idx: (st[idx], None if ac is None else [ac[i] for i in idx])          # noqa: E731

    critic = PairCritic(st.shape[-1], hidden)  # the transformed width (k for a keep adapter)
    opt = torch.optim.AdamW(critic.parameters(), lr=1e-3)
    tr_static, tr_actions = sub(train_idx)
    batch = min(256, len(train_idx))
    for _ in range(steps):
        pick = rng.choice(len(train_idx), size=batch, replace=False)
        a, b = _pairs(tr_static[pick], None if tr_actions is None else [tr_actions[i] for i in pick], kind, rng)
        loss = info_nce(critic.logits(norm(a), norm(b)))                              # (B, B) logits
        opt.zero_grad()
        loss.backward()
        opt.step()
    te_static, te_actions = sub(test_idx)
    hits = []
    with torch.no_grad():
        for _ in range(rounds):
            pick = rng.choice(len(test_idx), size=group, replace=False)
            a, b = _pairs(te_static[pick], None if te_actions is None else [te_actions[i] for i in pick], kind, rng)
            sim = critic.logits(norm(a), norm(b))
            hits.append((sim.argmax(1) == torch.arange(group)).float().mean().item())
    return float(np.mean(hits))


def heldout_split(n_videos: int, fraction: float = 0.2, seed: int = 0, minimum: int = 32) -> tuple[np.ndarray, np.ndarray]:
    """(fit, heldout) indices of the static-bearing training videos; heldout videos never train the adapter."""
    n_held = min(n_videos // 2, max(minimum, int(round(fraction * n_videos))))
    order = np.random.default_rng([seed, 7]).permutation(n_videos)
    return np.sort(order[n_held:]), np.sort(order[:n_held])


def pair_matching_report(static: np.ndarray, actions: Sequence[np.ndarray] | None, fit_idx: np.ndarray,
                         held_idx: np.ndarray, transform=None, seed: int = 0, steps: int = 300,
                         group: int = 32) -> dict[str, float]:
    """{kind: accuracy} for both pair kinds (static_action only when action clips are given), plus chance
    (1 / group), group (videos each top-1 is taken among) and heldout (held-out videos the groups are drawn from).

    The critic trains on (transformed) fit videos and is scored on held-out videos."""
    group = min(group, len(held_idx))
    out = {"chance": 1.0 / group, "group": group, "heldout": len(held_idx)}
    # one thread: a 256-wide critic over 2 threads took 104 s wall where one took 8.7 s (same accuracies, 1,000
    # videos, 2 cores at load 6); this is what made a closed-form `splavu train` take minutes
    with intra_op_threads(1):
        for kind in KINDS:
            if kind == "static_action" and actions is None:
                continue
            out[kind] = critic_pair_matching(static, actions, fit_idx, held_idx, kind, transform, seed, steps, group)
    return out


def diagnose_adapter(adapter, data, fit_idx: np.ndarray, held_idx: np.ndarray, seed: int, steps: int) -> dict[str, float]:
    """pair_matching_report of the training data's static (and action) clips, rounded to 4 places: through `adapter`
    (in eval mode for the measurement, its mode restored after) or, with adapter None, on the raw latents."""
    transform = None
    if adapter is not None:
        def transform(x):
            with torch.no_grad():
                return adapter(torch.from_numpy(np.ascontiguousarray(x, np.float32))).numpy()

        was = adapter.training
        adapter.eval()
    out = pair_matching_report(data.static, data.static_actions, fit_idx, held_idx, transform=transform, seed=seed,
                               steps=steps)
    if adapter is not None:
        adapter.train(was)
    return {k: round(v, 4) for k, v in out.items()}
