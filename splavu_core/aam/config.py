"""How aam_model fits an adapter: TrainConfig, the one definition of every training field.

Each field is stated once, here: name, type, default and description. What a user sets and what is stored are made
from these dataclasses: the Dagster config and the CLI's --config (assets/aam.py: AAMTrainingConfig,
check_training_config), the stored record (adapter.json's extra.train_config: `flat`) and docs/configuration.md
(docs/gen_reference.py); tests/test_aam_train.py checks that they agree.

The sections are the stages that read them: the top level holds what the default adapter (keep + recentring, a closed
form: aam/closed_form.py) reads; `projection` the appearance-projection stage before it (off by default); `loop` what
only adapters with a trained stage read (the paper's joint training loop, aam/paper_loop.py). A field marked `adapter`
is one of the adapter's own (model.AAMConfig's): adapter.json stores it, and so the version's content hash reads it."""
from __future__ import annotations

import copy
import dataclasses
from dataclasses import dataclass, field

from splavu_core.aam.model import AAMConfig, under_names_now
from splavu_core.aam.model import RENAMED as ADAPTER_RENAMED

TASKS = ("ar", "tad", "ad")
RECENTRE_ON = ("clips", "classes")  # recentring's centroids: label-free k-means of clips, or the trained classes
PRIVACY_OBJECTIVES = ("critic", "ntxent")
PAIRS = ("static_static", "static_action", "both")
OPERATING_POINTS = ("rule", "as_given")

# Flat fields renamed since train configs were first stored: {name now: name before}. "erase_*" named the appearance
# projection while "erasure" also named the deletion of a person (`splavu forget`); only the latter keeps the word.
# What reads a stored record (TrainConfig.from_flat, renamed_to_current) accepts the name before; what a user types
# (the CLI's --config, Dagster's run config) takes only the name now and is told it (assets/aam.py).
RENAMED = {"projection_fraction": "erase_fraction", "projection_w_action": "erase_w_action",
           "projection_w_temporal": "erase_w_temporal"}


def documented(default, doc: str, **metadata):
    """A field with its description (metadata "doc") and what else a consumer needs to know of it: "adapter" (one of
    AAMConfig's fields), "planned" (left unset in a run config, datasets.training_plan chooses it from what the store
    has registered; the value says what it chooses) or "diagnostic" (set by an ablation variant only, never offered)."""
    return field(default=default, metadata={"doc": doc, **metadata})


@dataclass
class ProjectionConfig:
    """The closed-form appearance projection (aam/appearance_projection.py), a stage before keep or the trained
    blocks. Off by default (projection_fraction 0); on in the previous default and the keep_after_projection
    variant."""
    projection_fraction: float = documented(0.0, "projection rank = round(fraction * D), unless projection_rank is "
                                            "set")
    projection_w_action: float = documented(1.0, "projection fit: weight of the action-class scatter it must keep")
    projection_w_temporal: float = documented(0.0, "projection fit: weight of the within-video (over time) scatter "
                                              "it must keep")
    projection_rank: int | None = documented(None, "k: a fitted linear projection removing k appearance directions "
                                             "runs first (0 = none; unset: from projection_fraction)", adapter=True)


@dataclass
class LoopConfig:
    """The training loop and the trained blocks: read only by adapters with a trained stage (layers > 0). The default
    adapter is a closed-form fit and runs no loop."""
    selection: str = documented("val_ar", "keep the epoch with the best validation AR top-1 (\"last\": final epoch)",
                                planned="val_ar when AR has val videos, else last")
    epochs: int = documented(30, "epochs of the loop")
    batch: int = documented(128, "clips per step (AR); pairs per step: batch (critic), batch // 4 (ntxent)")
    lr: float = documented(1e-3, "learning rate of the adapter and the AR head")
    head_lr: float = documented(1e-3, "learning rate of the TAD / AD heads (own optimizers)")
    pretrain_head_epochs: int = documented(30, "TAD / AD heads first fit on raw (or kept) features")
    w_lc: float = documented(1.0, "weight of the variance-normalised latent consistency term")
    w_ar: float = documented(1.0, "weight of the AR cross-entropy")
    w_tad: float = documented(1.0, "weight of the TAD loss")
    w_ad: float = documented(1.0, "weight of the AD MIL loss")
    w_b: float = documented(1.0, "weight of the privacy term (0: none)")
    privacy: str = documented("critic", "privacy objective: \"ntxent\" = the paper's (maximise a fixed-cosine "
                              "NT-Xent of two static clips); \"critic\" = a learned critic matches pairs of one "
                              "video, the adapter is trained to confuse it")
    pairs: str = documented("both", "which pairs of one video the privacy term looks at: static_static, "
                            "static_action or both")
    temperature: float = documented(0.1, "temperature of the NT-Xent and of the critic's InfoNCE")
    critic_steps: int = documented(2, "critic updates per adapter step")
    critic_hidden: int = documented(256, "width of the critic's projection")
    critic_lr: float = documented(1e-3, "learning rate of the critic")
    diagnose_points: int = documented(4, "fresh-critic pair matching measured this many times during the loop")
    oracle: bool = documented(False, "DIAGNOSTIC ONLY: adversary on private-attribute labels (never publishable)",
                              diagnostic=True)
    heads: int = documented(8, "attention heads (paper: 8 best); must divide token_width", adapter=True)
    sub_tokens: int = documented(8, "S: each D-vector is split into S sub-tokens of D/S values; must divide D",
                                 adapter=True)
    token_width: int = documented(64, "W: width of a sub-token inside the blocks (8 heads x 8 dims by default)",
                                  adapter=True)
    ffn: bool = documented(False, "add a pre-norm GELU MLP branch after each attention (official AAM has none)",
                           adapter=True)
    clip_context: bool = documented(False, "also attend over the video's own clips; then anonymizing needs whole "
                                    "videos", adapter=True)
    mixer: str = documented("mlp", "residual blocks: \"attention\" (sub-token attention) or \"mlp\" (per clip; keep "
                            "needs it)", adapter=True)
    hidden: int = documented(256, "width of an \"mlp\" block (D -> hidden -> D)", adapter=True)

    def __post_init__(self):
        if self.selection not in ("val_ar", "last"):
            raise ValueError(f"selection must be 'val_ar' or 'last', got {self.selection!r}")
        if self.privacy not in PRIVACY_OBJECTIVES:
            raise ValueError(f"privacy must be one of {PRIVACY_OBJECTIVES}, got {self.privacy!r}")
        if self.pairs not in PAIRS:
            raise ValueError(f"pairs must be one of {PAIRS}, got {self.pairs!r}")


@dataclass
class TrainConfig:
    """How aam_model fits an adapter. The fields at this level are the ones the default adapter (keep + recentring,
    closed form) reads; `projection` and `loop` hold what only other adapters read.

    The CLI's --config, Dagster and the stored record name every field flat; `from_flat`, `replace` and `flat` route a
    flat name to its section. `adapter`: the adapter's own fields, as AAMConfig takes them."""
    tasks: tuple = documented(TASKS, "utility tasks fitted for (any subset; empty: the keep fit takes motion "
                              "directions, a loop trains privacy + LC only)",
                              planned="every task whose labelled data is registered")
    operating_point: str = documented("rule", "'rule': the publish rule picks the configuration among its candidate "
                                      "family, each a change of the fields below, on the store's selection split "
                                      "(docs/method.md, \"The publish rule\"); 'as_given': fit these fields as they are")
    seed: int = documented(0, "seeds torch, the held-out split and the diagnostics")
    keep_w_motion: float = documented(1.0, "keep fit (keep = k): weight of within-video motion kept for unseen tasks")
    keep_w_app: float = documented(0.0, "keep fit: weight of between-video static (appearance) scatter to avoid")
    keep_app_within: bool = documented(False, "keep fit: keep_w_app avoids only the stills' scatter WITHIN each "
                                       "action class (each AR training video's mean static clip minus its action's "
                                       "mean of them): who and where, not what the action's stills share")
    keep_tad_phases: int = documented(3, "keep fit: a TAD segment's clips labelled by class and phase (start .. end)")
    keep_w_dynamic: float = documented(0.0, "keep fit: weight of what motion adds to a video (moving clips minus its "
                                       "static clips)")
    keep_ridge: float = documented(0.3, "keep fit: shrinkage, isotropic variance added to the rest as a share of the "
                                   "total")
    recentre_quantile: float = documented(0.95, "recentring (recentre): videos farther from every centroid than this "
                                          "share of the training videos are moved less")
    recentre_on: str = documented("clips", "recentring's centroids: 'clips' (k-means of the fitted tasks' training "
                                  "clips, each clip matched on its own, no label read) or 'classes' (the trained "
                                  "actions and AD's normal / anomalous, matched on the video's mean: unseen tasks "
                                  "lose their video-level signal)")
    recentre_cluster_clips: int = documented(50, "recentring on clips: training clips per centroid (fewer: finer "
                                             "centroids, more kept and less removed)")
    recentre_restarts: int = documented(4, "recentring on clips: k-means initialisations (seeded by `seed`); the "
                                        "clustering with the lowest inertia is kept (a label-free criterion)")
    recentre_min_people: int = documented(5, "recentring on clips: every centroid averages clips of at least this many "
                                          "people (training videos' subject_id, else each video its own person): a "
                                          "cluster of fewer joins the nearest one (two are always kept; the adapter "
                                          "records the smallest one's count)")
    heldout_fraction: float = documented(0.2, "static-bearing training videos the diagnostics hold out (the "
                                         "projection fit and the loop do not see them)")
    diagnose_steps: int = documented(300, "training steps of each fresh diagnostic critic")
    layers: int = documented(0, "trained residual blocks (paper: 3 ~ 5); 0 (mixer mlp): the fitted stages alone, "
                             "nothing to train", adapter=True)
    keep: int = documented(11, "k: publish only a fitted k-dim utility subspace (aam/keep.py); 0 = D wide",
                           adapter=True)
    recentre: bool = documented(True, "replace each video's kept mean by its expected centroid (needs keep)",
                                adapter=True)
    recentre_draw: float = documented(0.0, "T > 0: recentring publishes ONE centroid per clip, drawn from its "
                                      "posterior at temperature T (keyed by the clip's bytes: the same clip gives "
                                      "the same row) instead of the posterior's mean; with recentre_on 'clips' only",
                                      adapter=True)
    recentre_top: int = documented(0, "M > 0: recentring's posterior cut to its M most likely centroids "
                                   "(renormalised) before the mean or the draw; with recentre_on 'clips' only; 0 = all",
                                   adapter=True)
    projection: ProjectionConfig = field(default_factory=ProjectionConfig)
    loop: LoopConfig = field(default_factory=LoopConfig)

    def __post_init__(self):
        unknown = set(self.tasks) - set(TASKS)
        if unknown:
            raise ValueError(f"unknown task(s) {sorted(unknown)}; choose from {TASKS}")
        if self.operating_point not in OPERATING_POINTS:
            raise ValueError(f"operating_point must be one of {OPERATING_POINTS}, got {self.operating_point!r}")
        if not 0 <= self.heldout_fraction < 0.5:
            raise ValueError(f"heldout_fraction must be in [0, 0.5), got {self.heldout_fraction}")

    @classmethod
    def from_flat(cls, fields: dict) -> TrainConfig:
        """From flat field names (the CLI's --config, a stored train_config: record_fields), each routed to its
        section."""
        return cls().replace(**record_fields(fields))

    def replace(self, **fields) -> TrainConfig:
        """A copy with flat-named fields changed: dataclasses.replace on the section that holds each."""
        unknown = sorted(set(fields) - set(_FLAT))
        if unknown:
            raise ValueError(f"unknown training field(s) {unknown}; valid: {', '.join(_FLAT)}")
        top = {n: v for n, v in fields.items() if _FLAT[n] is None}
        sections = {s: dataclasses.replace(getattr(self, s), **{n: v for n, v in fields.items() if _FLAT[n] == s})
                    for s in _SECTIONS}
        return dataclasses.replace(self, **top, **sections)

    def value(self, name: str):
        """The field `name` (flat), wherever its section holds it."""
        return getattr(self if _FLAT[name] is None else getattr(self, _FLAT[name]), name)

    @property
    def adapter(self) -> dict:
        """The adapter's own fields, as AAMConfig takes them (train.adapter_config adds what training derives: dim,
        centroids, and projection_rank when it is unset)."""
        return {f.name: v for _, f in training_fields() if f.metadata.get("adapter")
                and (v := self.value(f.name)) is not None}

    def flat(self, names_before: bool = False) -> dict:
        """Every field by its flat name, the adapter's in one dict `adapter` less those at AAMConfig's own defaults:
        what adapter.json's extra.train_config and the ablation records store, laid out as before the sections, so
        records written before read the same (tests/test_aam_train.py).
        names_before: renamed fields (and the adapter's) under the name they had, as the ablations' cache keys hash
        them, so a rename does not invalidate the records cached under those keys."""
        out = {f.name: self.value(f.name) for _, f in training_fields() if not f.metadata.get("adapter")}
        out["adapter"] = {n: v for n, v in self.adapter.items() if v != STORED_ADAPTER_BASE[n]}
        if names_before:
            out = {RENAMED.get(k, k): v for k, v in out.items()}
            out["adapter"] = {ADAPTER_RENAMED.get(k, k): v for k, v in out["adapter"].items()}
        return copy.deepcopy(out)


def record_fields(record: dict) -> dict:
    """A stored training record (`flat`'s layout) as flat fields under the names now: its `adapter` dict spread out,
    each adapter field it leaves out at AAMConfig's own default (STORED_ADAPTER_BASE), and a field renamed since it
    was stored under its new name (renamed_to_current). Flat fields without `adapter` pass as they are."""
    fields = renamed_to_current(record)
    stored = fields.pop("adapter", None)
    if stored is None:
        return fields
    twice = sorted(set(stored) & set(fields))
    if twice:
        raise ValueError(f"training field(s) {twice} given both flat and in `adapter`")
    return {**STORED_ADAPTER_BASE, **stored, **fields}


def renamed_to_current(fields: dict) -> dict:
    """Flat training fields as a record stored them, under the names now: a field renamed since (RENAMED) and, inside
    `adapter`, an adapter field renamed since (model.RENAMED) take their new name."""
    out = under_names_now(fields, RENAMED, "training fields")
    if isinstance(out.get("adapter"), dict):
        out["adapter"] = under_names_now(out["adapter"], ADAPTER_RENAMED, "training fields (adapter)")
    return out


_SECTIONS = ("projection", "loop")
SECTION_TITLES = {None: "the default adapter (closed form)", "projection": "the appearance projection (off by default)",
                  "loop": "trained adapters only (layers > 0)"}


def training_fields() -> list[tuple[str | None, dataclasses.Field]]:
    """Every training field as (its section: None for TrainConfig's own, or "projection" / "loop"; the field), the
    default adapter's first, in the order they are defined."""
    return [(section, f) for section, cls in ((None, TrainConfig), ("projection", ProjectionConfig),
                                              ("loop", LoopConfig))
            for f in dataclasses.fields(cls) if f.name not in _SECTIONS]


_FLAT = {f.name: section for section, f in training_fields()}  # flat name -> the section holding it
# What a stored `adapter` record leaves out of the adapter's fields: AAMConfig's own default (the paper's architecture),
# or unset where training derives the field (projection_rank, from projection_fraction)
STORED_ADAPTER_BASE = {f.name: None if f.default is None else getattr(AAMConfig, f.name)
                       for _, f in training_fields() if f.metadata.get("adapter")}
# The previous default (an appearance projection removing half the dimensions, then 2 residual MLP blocks trained with
# the learned critic), kept as a named variant: its changes of TrainConfig's defaults
PREVIOUS_DEFAULT = {"projection_fraction": 0.5, "keep": 0, "layers": 2, "mixer": "mlp", "hidden": 256,
                    "recentre": False}
