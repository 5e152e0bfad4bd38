"""How aam_model fits an adapter: TrainConfig and its sections, by the stage that reads them.

The top level holds what the default adapter (keep + recentring, a closed form: aam/closed_form.py) reads; `projection`
the appearance-projection stage before it (off by default); `loop` what only adapters with a trained stage read (the
paper's joint training loop, aam/paper_loop.py)."""
from __future__ import annotations

import copy
import dataclasses
from dataclasses import asdict, dataclass, field

from splavu_core.aam.model import DEFAULT_ADAPTER, AAMConfig, documented, under_names_now
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


@dataclass
class ProjectionConfig:
    """The closed-form appearance projection (aam/appearance_projection.py), a stage before keep or the trained
    blocks. Off by default (projection_fraction 0); on in the previous default and the keep_after_projection
    variant."""
    projection_fraction: float = documented(0.0, "projection rank = round(fraction * D), unless adapter sets "
                                            "projection_rank")
    projection_w_action: float = documented(1.0, "projection fit: weight of the action-class scatter it must keep")
    projection_w_temporal: float = documented(0.0, "projection fit: weight of the within-video (over time) scatter "
                                              "it must keep")


@dataclass
class LoopConfig:
    """The training loop: read only by adapters with a trained stage (adapter layers > 0). The default adapter is a
    closed-form fit and runs no loop."""
    selection: str = documented("val_ar", "keep the epoch with the best validation AR top-1 (\"last\": final "
                                "epoch)")
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
    oracle: bool = documented(False, "DIAGNOSTIC ONLY: adversary on private-attribute labels (never publishable)")

    def __post_init__(self):
        if self.selection not in ("val_ar", "last"):
            raise ValueError(f"selection must be 'val_ar' or 'last', got {self.selection!r}")
        if self.privacy not in PRIVACY_OBJECTIVES:
            raise ValueError(f"privacy must be one of {PRIVACY_OBJECTIVES}, got {self.privacy!r}")
        if self.pairs not in PAIRS:
            raise ValueError(f"pairs must be one of {PAIRS}, got {self.pairs!r}")


@dataclass
class TrainConfig:
    """How aam_model fits an adapter. The fields at this level are the ones the default adapter (DEFAULT_ADAPTER:
    keep + recentring, closed form) reads; `projection` and `loop` hold what only other adapters read.

    The CLI's --config, Dagster and the stored record (adapter.json's extra.train_config) name every field flat;
    `from_flat`, `replace` and `flat` route a flat name to its section."""
    tasks: tuple = documented(TASKS, "utility tasks fitted for (any subset; empty: the keep fit takes motion "
                              "directions, a loop trains privacy + LC only)")
    operating_point: str = documented("rule", "'rule': the publish rule picks the configuration among its candidate "
                                      "family, each a change of the fields below, on the store's selection split "
                                      "(docs/method.md, \"The publish rule\"); 'as_given': fit these fields as they are")
    seed: int = documented(0, "seeds torch, the held-out split and the diagnostics")
    adapter: dict = field(default_factory=lambda: dict(DEFAULT_ADAPTER), metadata={"doc": "AAMConfig fields"})
    keep_w_motion: float = documented(1.0, "keep fit (adapter keep = k): weight of within-video motion kept for "
                                      "unseen tasks")
    keep_w_app: float = documented(0.0, "keep fit: weight of between-video static (appearance) scatter to avoid")
    keep_app_within: bool = documented(False, "keep fit: keep_w_app avoids only the stills' scatter WITHIN each "
                                       "action class (each AR training video's mean static clip minus its action's "
                                       "mean of them): who and where, not what the action's stills share")
    keep_tad_phases: int = documented(3, "keep fit: a TAD segment's clips labelled by class and phase (start .. end)")
    keep_w_dynamic: float = documented(0.0, "keep fit: weight of what motion adds to a video (moving clips minus its "
                                       "static clips)")
    keep_ridge: float = documented(0.3, "keep fit: shrinkage, isotropic variance added to the rest as a share of the "
                                   "total")
    recentre_quantile: float = documented(0.95, "recentring (adapter recentre): videos farther from every centroid "
                                          "than this share of the training videos are moved less")
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
        """From flat field names (the CLI's --config, a stored train_config), each routed to its section; a record
        stored before a rename (RENAMED, and the adapter's model.RENAMED) reads as under the names now."""
        return cls().replace(**renamed_to_current(fields))

    def replace(self, **fields) -> TrainConfig:
        """A copy with flat-named fields changed: dataclasses.replace on the section that holds each."""
        unknown = sorted(set(fields) - set(_FLAT))
        if unknown:
            raise ValueError(f"unknown training field(s) {unknown}; valid: {', '.join(_FLAT)}")
        top = {n: v for n, v in fields.items() if _FLAT[n] is None}
        sections = {s: dataclasses.replace(getattr(self, s), **{n: v for n, v in fields.items() if _FLAT[n] == s})
                    for s in _SECTIONS}
        return dataclasses.replace(self, **top, **sections)

    def flat(self, names_before: bool = False) -> dict:
        """Every field by its flat name: what adapter.json's extra.train_config and the ablation records store, laid
        out as before the sections, so records written before read the same (tests/test_aam_train.py).
        names_before: renamed fields (and the adapter's) under the name they had, as the ablations' cache keys hash
        them, so a rename does not invalidate the records cached under those keys."""
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name not in _SECTIONS}
        for s in _SECTIONS:
            out.update(asdict(getattr(self, s)))
        if names_before:
            out = {RENAMED.get(k, k): v for k, v in out.items()}
            out["adapter"] = {ADAPTER_RENAMED.get(k, k): v for k, v in out["adapter"].items()}
        return copy.deepcopy(out)


def renamed_to_current(fields: dict) -> dict:
    """Flat training fields as a record stored them, under the names now: a field renamed since (RENAMED) and, inside
    `adapter`, an adapter field renamed since (model.RENAMED) take their new name."""
    out = under_names_now(fields, RENAMED, "training fields")
    if isinstance(out.get("adapter"), dict):
        out["adapter"] = under_names_now(out["adapter"], ADAPTER_RENAMED, "training fields (adapter)")
    return out


_SECTIONS = ("projection", "loop")
# flat name -> the section holding it (None: TrainConfig itself)
_FLAT = {**{f.name: None for f in dataclasses.fields(TrainConfig) if f.name not in _SECTIONS},
         **{f.name: "projection" for f in dataclasses.fields(ProjectionConfig)},
         **{f.name: "loop" for f in dataclasses.fields(LoopConfig)}}
SECTION_TITLES = {None: "the default adapter (closed form)", "projection": "the appearance projection (off by default)",
                  "loop": "trained adapters only (adapter layers > 0)"}


def config_fields() -> list[tuple[str | None, dataclasses.Field, bool]]:
    """What a user sets (the CLI's --config, Dagster), by flat name, as (section, field, is an AAMConfig field, i.e. a
    key of TrainConfig.adapter): the default adapter's (section None) first, then the projection's, then the loop's.
    Left out: `adapter` itself (its keys are here), what training derives (AAMConfig dim, centroids) and the oracle
    flags, which only the `oracle` ablation variant sets."""
    out = []
    for section, cls in ((None, TrainConfig), ("projection", ProjectionConfig), ("loop", LoopConfig)):
        out += [(section, f, False) for f in dataclasses.fields(cls) if f.name not in ("adapter", "oracle", *_SECTIONS)]
        out += [(section, f, True) for f in dataclasses.fields(AAMConfig)
                if f.metadata.get("section") == section and not f.metadata.get("derived")]
    return out
