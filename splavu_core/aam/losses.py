"""SPLAVU losses that belong to the adapter: the privacy term (NT-Xent) and latent consistency.

The SPLAVU objective *maximises* NT-Xent between the adapter outputs of two static clips of one
video (pushing apart what they share: spatial identity); the caller writes `- w_B * nt_xent(...)`.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F


def nt_xent(z1: torch.Tensor, z2: torch.Tensor, temperature: float = 0.1) -> torch.Tensor:
    """SimCLR NT-Xent with cosine similarity. z1, z2: (N, D); (z1[i], z2[i]) is the positive pair,
    the other 2N-2 samples are negatives; mean over all 2N anchors."""
    assert z1.ndim == 2 and z1.shape == z2.shape, f"nt_xent wants two (N, D) tensors, got {tuple(z1.shape)} and {tuple(z2.shape)}"
    assert z1.shape[0] >= 2, "nt_xent needs N >= 2 (with one pair there are no negatives)"
    assert temperature > 0, f"temperature must be > 0, got {temperature}"
    N = z1.shape[0]
    z = F.normalize(torch.cat([z1, z2]), dim=1)  # (2N, D) unit vectors -> dot product = cosine
    logits = z @ z.T / temperature  # (2N, 2N)
    self_mask = torch.eye(2 * N, dtype=torch.bool, device=z.device)
    logits = logits.masked_fill(self_mask, float("-inf"))  # an anchor is neither its own positive nor negative
    target = torch.cat([torch.arange(N, 2 * N), torch.arange(0, N)]).to(z.device)  # i <-> i+N
    return F.cross_entropy(logits, target)


def latent_consistency(h: torch.Tensor, h_anon: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
    """MSE(h, h_anon) over (..., D); with a bool `mask` of shape h.shape[:-1] (True = real clip) the
    mean is over real clips only, and whatever the padding holds is ignored."""
    assert h.shape == h_anon.shape, f"latent_consistency: shapes differ {tuple(h.shape)} vs {tuple(h_anon.shape)}"
    if mask is None:
        return F.mse_loss(h_anon, h)
    assert mask.shape == h.shape[:-1] and mask.dtype == torch.bool, \
        f"mask must be bool {tuple(h.shape[:-1])}, got {mask.dtype} {tuple(mask.shape)}"
    diff = torch.where(mask[..., None], h_anon - h, 0.0)  # where() before squaring: NaN padding stays out of grads too
    return diff.pow(2).sum() / (mask.sum().clamp(min=1) * h.shape[-1])


def info_nce(logits: torch.Tensor) -> torch.Tensor:
    """Symmetric InfoNCE of an (N, N) pair-matching logit matrix whose diagonal holds the true pairs."""
    target = torch.arange(len(logits), device=logits.device)
    return (F.cross_entropy(logits, target) + F.cross_entropy(logits.T, target)) / 2


def confusion(logits: torch.Tensor) -> torch.Tensor:
    """Cross-entropy of a critic's matching against the uniform guess (minimum log N: nothing to match).
    Bounded, unlike maximising the critic's loss, which a confidently *wrong* (still informative) match satisfies."""
    return -(F.log_softmax(logits, 1).mean() + F.log_softmax(logits, 0).mean()) / 2
