"""Anonymizing Adapter Module (AAM): a residual self-attention adapter on frozen-VFM clip features.

f_A(x) = x + delta(x), output shape = input shape. Two departures from the official SPLAVU code,
both needed for a feature store (docs/method.md, "What splavu does differently, and why"):

- Batch-invariant: the official AAM attends across the samples of a mini-batch, so a clip's
  anonymized vector depended on its batch-mates. Here attention runs over the S sub-tokens of one
  clip and, only if `clip_context`, over the clips of the same video (padding masked).
- Exact identity at init: every residual branch ends in a zero-initialised projection, so a fresh
  adapter is f_A(x) = x bit for bit (the official code *trains* it towards identity instead).

Why sub-tokens: a lone clip is a sequence of length one, and attention over one token is a linear
map (softmax of a single logit is 1). Splitting each D-vector into S sub-tokens of D/S values,
lifting each to width W (shared linear map + learned sub-token position embedding) and attending
over those S tokens keeps the adapter non-linear even when it sees one clip at a time.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, fields

import torch
import torch.nn as nn
import torch.nn.functional as F
from einops import rearrange, repeat

from splavu_core.aam.keep import clip_uniforms


# Fields added after the first stored adapters, with the value those adapters had: a stored config omits
# them at that value (to_dict), and reading fills them back (from_dict), so defaults below may change.
FORMAT1_VALUES = {"projection_rank": 0, "oracle": False, "mixer": "attention", "hidden": 256, "keep": 0,
                  "recentre": False, "centroids": 0, "recentre_clips": False, "recentre_draw": 0.0,
                  "recentre_top": 0}
# Fields renamed since adapters were first stored: {name now: name before}. Reading accepts either; the content hash
# (aam/io.py) reads the name before, so a version's id does not change with the name. "erase_rank" named the appearance
# projection's rank while "erasure" also named the deletion of a person (`splavu forget`); only the latter keeps it.
RENAMED = {"centroids": "classes", "projection_rank": "erase_rank"}
# Stages renamed since adapters were first stored, as state-dict key prefixes: {prefix now: prefix before}. Loading
# accepts either; the content hash reads the prefix before (aam/io.py).
RENAMED_STAGES = {"projection.": "erase."}


def under_names_now(d: dict, renamed: dict[str, str], what: str) -> dict:
    """`d` with each key renamed since (`renamed`: {name now: name before}) under its name now; a record holding both
    names of one key is refused (ValueError naming `what`)."""
    now = {before: name for name, before in renamed.items()}
    both = [old for old in now if old in d and now[old] in d]
    if both:
        raise ValueError(f"{what}: both {both} and their new names {[now[o] for o in both]}")
    return {now.get(k, k): v for k, v in d.items()}


@dataclass
class AAMConfig:
    """The adapter's architecture and the sizes its fit found: what adapter.json stores as `config` and the version's
    content hash reads. What `aam_model` trains, with the shipped defaults and every field's meaning, is set by
    aam/config.py's TrainConfig (its `adapter` fields), plus what training derives (dim, centroids, recentre_clips,
    oracle). The defaults here are the paper's architecture (3 sub-token attention blocks, nothing kept or recentred):
    what an adapter built by hand gets, and what a stored train_config's `adapter` record leaves out."""
    dim: int                        # D: feature width of the frozen encoder
    layers: int = 3
    heads: int = 8
    sub_tokens: int = 8
    token_width: int = 64
    ffn: bool = False
    clip_context: bool = False
    projection_rank: int = 0
    mixer: str = "attention"
    hidden: int = 256
    oracle: bool = False            # trained WITH private-attribute labels: a diagnostic, never publishable
    keep: int = 0
    recentre: bool = False
    centroids: int = 0              # C: recentring's centroids, found by the fit
    recentre_clips: bool = False    # each clip matched to the centroids (True) or the video's mean: from recentre_on
    recentre_draw: float = 0.0
    recentre_top: int = 0

    def __post_init__(self):
        for f in fields(self):
            v = getattr(self, f.name)
            want = {"bool": bool, "str": str, "float": float}.get(getattr(f.type, "__name__", f.type), int)
            if want is float and type(v) is int:
                setattr(self, f.name, v := float(v))  # JSON writes 4.0 as 4
            if type(v) is not want:  # bool is an int subclass: be strict so JSON mistakes show up
                raise TypeError(f"AAMConfig.{f.name} must be {want.__name__}, got {v!r}")
        if self.layers < (0 if self.mixer == "mlp" else 1):  # no mlp block: the fitted linear stages alone
            raise ValueError(f"AAMConfig.layers must be >= {0 if self.mixer == 'mlp' else 1}, got {self.layers}")
        for name in ("dim", "heads", "sub_tokens", "token_width"):
            if getattr(self, name) < 1:
                raise ValueError(f"AAMConfig.{name} must be >= 1, got {getattr(self, name)}")
        if self.mixer not in ("attention", "mlp"):
            raise ValueError(f"AAMConfig.mixer must be 'attention' or 'mlp', got {self.mixer!r}")
        if self.mixer == "mlp" and self.clip_context:
            raise ValueError("AAMConfig.clip_context needs mixer='attention' (an mlp block sees one clip)")
        if not 0 <= self.keep < self.dim:  # k = D would be an invertible map of the raw latents
            raise ValueError(f"AAMConfig.keep must be in [0, dim={self.dim}), got {self.keep}")
        if self.keep and (self.mixer != "mlp" or self.clip_context):
            raise ValueError("AAMConfig.keep needs mixer='mlp' (its blocks work in the k-dim kept space)")
        if self.recentre and (not self.keep or self.centroids < 2):
            raise ValueError(f"AAMConfig.recentre needs keep > 0 and centroids >= 2 (recentring's centroids), "
                             f"got keep={self.keep}, centroids={self.centroids}; set recentre false for a full-width "
                             f"adapter")
        if self.recentre_clips and not self.recentre:
            raise ValueError("AAMConfig.recentre_clips without recentre: there is no recentring stage to match clips")
        if self.recentre_draw < 0 or self.recentre_top < 0 or \
                ((self.recentre_draw or self.recentre_top) and not self.recentre_clips):
            raise ValueError(f"AAMConfig.recentre_draw and recentre_top must be >= 0 and need recentre_clips (clips "
                             f"matched one by one), got recentre_draw={self.recentre_draw}, recentre_top="
                             f"{self.recentre_top}, recentre_clips={self.recentre_clips}")
        if not self.recentre and self.centroids:
            raise ValueError(f"AAMConfig.centroids={self.centroids} without recentre: nothing would read them")
        if not 0 <= self.projection_rank < self.dim:
            raise ValueError(f"AAMConfig.projection_rank must be in [0, dim={self.dim}), got {self.projection_rank}")
        if self.dim % self.sub_tokens:
            divisors = [s for s in range(1, self.dim + 1) if self.dim % s == 0]
            raise ValueError(f"AAMConfig.sub_tokens={self.sub_tokens} must divide dim={self.dim} "
                             f"(each D-vector is split into equal sub-tokens); divisors of {self.dim}: {divisors}")
        if self.token_width % self.heads:
            raise ValueError(f"AAMConfig.heads={self.heads} must divide token_width={self.token_width}")

    @property
    def sub_dim(self) -> int:  # D/S: values per sub-token
        return self.dim // self.sub_tokens

    @property
    def out_dim(self) -> int:  # width of the published feature
        return self.keep or self.dim

    @property
    def whole_videos(self) -> bool:  # a clip's output depends on its video's other clips: anonymize videos whole
        return self.clip_context or self.recentre

    def to_dict(self, names_before: bool = False) -> dict:
        """The stored config. Fields added after format 1 are omitted at their format-1 value, so existing adapters
        keep their hash; names_before: renamed fields under the name they had (RENAMED), as the hash reads them."""
        out = {k: v for k, v in asdict(self).items() if k not in FORMAT1_VALUES or v != FORMAT1_VALUES[k]}
        return {RENAMED.get(k, k): v for k, v in out.items()} if names_before else out

    @classmethod
    def from_dict(cls, d: dict) -> "AAMConfig":
        d = under_names_now(d, RENAMED, "AAMConfig.from_dict")  # adapters stored before a rename: the name as it was
        unknown = set(d) - {f.name for f in fields(cls)}
        if unknown:
            raise ValueError(f"AAMConfig.from_dict: unknown keys {sorted(unknown)} (written by a newer version?)")
        return cls(**{**FORMAT1_VALUES, **d})  # a key left out was at its format-1 value, whatever today's default


class SelfAttention(nn.Module):
    """Pre-norm multi-head self-attention over axis 1 of (N, L, W); returns the residual branch only."""

    def __init__(self, width: int, heads: int):
        super().__init__()
        self.heads = heads
        self.norm = nn.LayerNorm(width)
        self.qkv = nn.Linear(width, 3 * width)
        self.proj = nn.Linear(width, width)
        nn.init.zeros_(self.proj.weight)  # branch starts at exactly zero -> block is the identity
        nn.init.zeros_(self.proj.bias)

    def forward(self, h: torch.Tensor, key_mask: torch.Tensor | None = None) -> torch.Tensor:
        # h: (N, L, W); key_mask: (N, L) bool, True = real token a query may attend to
        q, k, v = rearrange(self.qkv(self.norm(h)), "n l (three h d) -> three n h l d", three=3, h=self.heads)
        attn_mask = None if key_mask is None else key_mask[:, None, None, :]  # (N, 1, 1, L): all heads, all queries
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask)  # (N, H, L, W/H)
        return self.proj(rearrange(y, "n h l d -> n l (h d)"))  # (N, L, W)


class MLP(nn.Module):
    """Optional pre-norm feed-forward branch; zero-initialised output like the attention branches."""

    def __init__(self, width: int):
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.fc = nn.Linear(width, 4 * width)
        self.proj = nn.Linear(4 * width, width)
        nn.init.zeros_(self.proj.weight)
        nn.init.zeros_(self.proj.bias)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return self.proj(F.gelu(self.fc(self.norm(h))))


class ClipMLP(nn.Module):
    """Pre-norm residual MLP branch on a whole clip vector, zero-initialised output (identity at init)."""

    def __init__(self, dim: int, hidden: int):
        super().__init__()
        self.norm = nn.LayerNorm(dim)
        self.fc = nn.Linear(dim, hidden)
        self.proj = nn.Linear(hidden, dim)
        nn.init.zeros_(self.proj.weight)
        nn.init.zeros_(self.proj.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (..., D) -> (..., D)
        return self.proj(F.gelu(self.fc(self.norm(x))))


class Block(nn.Module):
    """Sub-token attention (within one clip) [+ clip attention (within one video)] [+ MLP], all residual."""

    def __init__(self, cfg: AAMConfig):
        super().__init__()
        self.sub_attn = SelfAttention(cfg.token_width, cfg.heads)
        self.clip_attn = SelfAttention(cfg.token_width, cfg.heads) if cfg.clip_context else None
        self.mlp = MLP(cfg.token_width) if cfg.ffn else None

    def forward(self, h: torch.Tensor, n_videos: int, mask: torch.Tensor | None) -> torch.Tensor:
        # h: (B*T, S, W); mask: (B, T) bool or None (= all clips real)
        h = h + self.sub_attn(h)  # S sub-tokens of one clip attend to each other
        if self.clip_attn is not None:
            # each sub-token position attends to the same position in the video's other clips.
            # No temporal position embedding: T varies per video, and order is not what we anonymize.
            S = h.shape[1]
            hc = rearrange(h, "(b t) s w -> (b s) t w", b=n_videos)  # (B*S, T, W)
            key_mask = None if mask is None else repeat(mask, "b t -> (b s) t", s=S)  # (B*S, T)
            hc = hc + self.clip_attn(hc, key_mask)
            h = rearrange(hc, "(b s) t w -> (b t) s w", s=S)  # (B*T, S, W)
        if self.mlp is not None:
            h = h + self.mlp(h)
        return h


class AppearanceProjection(nn.Module):
    """e(x) = x - ((x - mu) R) L^T: an oblique projection that removes k directions (rank-k update).

    Fitted in closed form (`aam.appearance_projection.fit_projection`), then frozen: buffers, not parameters. All zeros
    (unfitted) is exactly the identity. Linear and per clip, so it treats a static clip and a moving clip
    alike: it cannot learn to scramble only the clips the privacy loss looks at."""

    def __init__(self, dim: int, rank: int):
        super().__init__()
        self.register_buffer("mean", torch.zeros(dim))       # (D,)
        self.register_buffer("read", torch.zeros(dim, rank))  # R: (D, k) reads the removed coordinates
        self.register_buffer("write", torch.zeros(dim, rank)) # L: (D, k) where they live in feature space

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (..., D)
        return x - ((x - self.mean) @ self.read) @ self.write.T


class Keep(nn.Module):
    """k(x) = (x - mu) P: the fitted k-dim utility subspace (`aam.keep.fit_keep`), frozen buffers.
    Linear and per clip, like the appearance projection; all zeros until fitted."""

    def __init__(self, dim: int, k: int):
        super().__init__()
        self.register_buffer("mean", torch.zeros(dim))     # (D,)
        self.register_buffer("proj", torch.zeros(dim, k))  # P: (D, k)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (..., D) -> (..., k)
        return (x - self.mean) @ self.proj


class Recentre(nn.Module):
    """Each video's kept mean moved to its expected centroid (`aam.keep.fit_recentre`, frozen buffers): the
    posterior-weighted mixture of the centroids (k-means clusters or trained classes) under a shared-covariance model,
    moved proportionally less past a training quantile of distances (classes nobody trained for). Per video."""

    def __init__(self, k: int, classes: int, per_clip: bool = False, draw: float = 0.0, top: int = 0):
        super().__init__()
        self.per_clip, self.draw, self.top = per_clip, draw, top
        self.register_buffer("centroids", torch.zeros(classes, k))  # (C, k)
        self.register_buffer("precision", torch.zeros(k, k))        # (k, k)
        self.register_buffer("gate", torch.zeros(()))               # squared distance

    def forward(self, z: torch.Tensor, mask: torch.Tensor | None, u: torch.Tensor | None = None) -> torch.Tensor:
        # z: (B, T, k); mask: (B, T) bool or None; u: (B, T) uniforms in [0, 1), one per clip (draw > 0 only)
        w_t = torch.ones(z.shape[:2], dtype=z.dtype) if mask is None else mask.to(z.dtype)
        if self.per_clip:  # each clip matched on its own; the video moves by the mean of its clips' offsets
            d = z[:, :, None, :] - self.centroids                                # (B, T, C, k)
            q = torch.einsum("btck,kl,btcl->btc", d, self.precision, d)          # (B, T, C)
            w = torch.softmax(-0.5 * q / (self.draw or 1.0), dim=-1)             # (B, T, C)
            if self.top:  # only the M most likely centroids
                w = torch.where(w >= w.topk(min(self.top, w.shape[-1]), -1).values[..., -1:], w, 0.0)
                w = w / w.sum(-1, keepdim=True)
            if self.draw:  # randomised response: one centroid, drawn by inverting the posterior's CDF at u
                assert u is not None and u.shape == z.shape[:2], "a drawn centroid needs one uniform per clip"
                pick = torch.searchsorted(w.double().cumsum(-1), u.double()[..., None]).clamp(max=w.shape[-1] - 1)
                w = F.one_hot(pick[..., 0], w.shape[-1]).to(z.dtype)             # (B, T, C)
            scale = (self.gate / q.min(-1).values.clamp_min(1e-12)).clamp(max=1.0)  # (B, T)
            off = scale[..., None] * (w @ self.centroids - z) * w_t[..., None]   # (B, T, k), padding out
            return z + (off.sum(1) / w_t.sum(1, keepdim=True))[:, None, :]
        m = (z * w_t[..., None]).sum(1) / w_t.sum(1, keepdim=True)            # (B, k) mean of real clips
        d = m[:, None, :] - self.centroids                                    # (B, C, k)
        q = torch.einsum("bck,kl,bcl->bc", d, self.precision, d)              # (B, C)
        qmin = q.min(1).values                                                # (B,)
        w = torch.softmax(-0.5 * q, dim=1)                                    # (B, C)
        scale = (self.gate / qmin.clamp_min(1e-12)).clamp(max=1.0)            # (B,)
        return z + (scale[:, None] * (w @ self.centroids - m))[:, None, :]


class AnonymizingAdapter(nn.Module):
    """f_A: (B, T, D) videos x clips [+ (B, T) bool padding mask, True = real clip] or (N, D) lone clips
    -> same shape. Padded clips are returned unchanged and never influence real ones.

    f_A(x) = e(x) + delta(e(x)): an optional fitted linear appearance projection e, then the residual attention branch.
    With cfg.keep = k: f_A(x) = y + delta(y), y = k(e(x)) the fitted utility subspace, delta residual MLPs
    in k dims: output (..., k), and padded clips come back as zeros."""

    def __init__(self, cfg: AAMConfig):
        super().__init__()
        self.cfg = cfg
        S, C, W = cfg.sub_tokens, cfg.sub_dim, cfg.token_width
        self.projection = AppearanceProjection(cfg.dim, cfg.projection_rank) if cfg.projection_rank else None
        self.keep = Keep(cfg.dim, cfg.keep) if cfg.keep else None
        self.recentre = Recentre(cfg.keep, cfg.centroids, cfg.recentre_clips, cfg.recentre_draw, cfg.recentre_top) \
            if cfg.recentre else None
        if cfg.mixer == "mlp":  # one dense residual MLP per block on the whole vector: ~8x fewer MACs per clip
            self.mlps = nn.ModuleList(ClipMLP(cfg.out_dim, cfg.hidden) for _ in range(cfg.layers))
            return
        self.lift = nn.Linear(C, W)                       # shared across the S sub-tokens
        self.pos = nn.Parameter(0.02 * torch.randn(S, W))  # which slice of the D-vector a sub-token is
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.layers))
        self.out = nn.Linear(W, C)                        # back to D/S per sub-token
        nn.init.zeros_(self.out.weight)  # the residual branch onto x: zero -> f_A(x) == x at init
        nn.init.zeros_(self.out.bias)

    def fixed_stages(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        """The frozen linear stages alone (appearance projection, then keep): what the trained blocks start from.
        (..., D) -> (..., out); padded clips (mask False) come back as zeros."""
        if self.projection is not None:
            x = self.projection(x)
        x = x if self.keep is None else self.keep(x)
        return x if mask is None else torch.where(mask[..., None], x, 0.0)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        cfg = self.cfg
        assert x.ndim in (2, 3), f"AAM input must be (N, D) lone clips or (B, T, D) videos, got shape {tuple(x.shape)}"
        assert x.shape[-1] == cfg.dim, f"AAM built for D={cfg.dim}, got features of width {x.shape[-1]}"
        lone = x.ndim == 2
        if lone:
            assert mask is None, "a padding mask needs (B, T, D) input; lone clips (N, D) have no padding"
            x = x[:, None, :]  # (N, 1, D): each clip its own video of length one
        B, T, _ = x.shape
        if mask is not None:
            assert mask.shape == (B, T) and mask.dtype == torch.bool, \
                f"mask must be bool (B, T)=({B}, {T}), got {mask.dtype} {tuple(mask.shape)}"
            assert bool(mask.any(1).all()), "every video needs at least one real (unpadded) clip"
            x_in = torch.where(mask[..., None], x, 0.0)  # padding may hold anything (even NaN): keep it out
        else:
            x_in = x
        u = None
        if self.recentre is not None and self.recentre.draw:  # (B, T): one uniform per clip, keyed by its bytes
            u = torch.from_numpy(clip_uniforms(x_in.detach().to(torch.float32).cpu().numpy()))
        if self.projection is not None:
            x_in = self.projection(x_in)
            x = x_in if mask is None else torch.where(mask[..., None], x_in, x)
        if self.keep is not None:
            x_in = self.keep(x_in)                                   # (B, T, k)
            x = x_in if mask is None else torch.where(mask[..., None], x_in, 0.0)
        if cfg.mixer == "mlp":
            h = x_in
            for mlp in self.mlps:
                h = h + mlp(h)                                   # (B, T, D)
            if self.recentre is not None:
                h = self.recentre(h, mask, u)                    # (B, T, k): per video
            y = h if mask is None else torch.where(mask[..., None], h, x)
            return y[:, 0] if lone else y

        h = self.lift(rearrange(x_in, "b t (s c) -> (b t) s c", s=cfg.sub_tokens)) + self.pos  # (B*T, S, W)
        for block in self.blocks:
            h = block(h, B, mask)
        delta = rearrange(self.out(h), "(b t) s c -> b t (s c)", b=B)  # (B, T, D)
        y = x + delta if mask is None else torch.where(mask[..., None], x + delta, x)
        return y[:, 0] if lone else y
