"""aam_model: the Anonymizing Adapter Module, trained from cached latents only."""

import io
import json
import time
import typing

import dagster as dg
from pydantic import Field, ValidationError, create_model

from assets.resources import StoreResource
from splavu_core.aam.io import adapter_version, save_adapter
from splavu_core.aam.model import RENAMED as ADAPTER_RENAMED
from splavu_core.aam.config import RENAMED, TASKS, LoopConfig, ProjectionConfig, TrainConfig, training_fields
from splavu_core.aam.train import train_aam
from splavu_core.aam.training_data import load_training_data
from splavu_core.evaluation.operating_point import choose, markdown, plot_png
from splavu_core.evaluation.report import png_markdown
from splavu_core.ingest.datasets import training_plan
from splavu_core.store import costs
from splavu_core.store.ledger import record_version

# a field only some adapters read says which, first thing in its description
LABELS = {None: "", "projection": "[appearance projection, off by default] ", "loop": "[trained adapters only] "}


def dagster_description(section: str | None, f) -> str:
    """A training field's description as the Dagster config states it: the adapter's own marked `adapter:`, one that
    only some adapters read labelled with their stage, a planned one saying what is chosen when it is left unset."""
    planned = f"; unset: {f.metadata['planned']}" if "planned" in f.metadata else ""
    return ("adapter: " if f.metadata.get("adapter") else "") + LABELS[section] + f.metadata["doc"] + planned


def _dagster_fields() -> dict:
    """config.TrainConfig's fields (its sections flat) as Dagster config fields, with the same name, type, default
    and description, the default adapter's first; a planned field (tasks, selection) is unset by default, for the
    store's plan. Flat, so the CLI's --config and stored run configs stay valid. The diagnostic `oracle` is left out:
    only its ablation variant sets it."""
    hints = {**typing.get_type_hints(TrainConfig), **typing.get_type_hints(ProjectionConfig),
             **typing.get_type_hints(LoopConfig)}
    out = {}
    for section, f in training_fields():
        if f.metadata.get("diagnostic"):
            continue
        kind = list[str] if hints[f.name] is tuple else hints[f.name]
        planned = "planned" in f.metadata
        out[f.name] = (kind | None if planned else kind,
                       Field(default=None if planned else f.default, description=dagster_description(section, f)))
    return out


class _TrainingConfigMethods:
    def train_datasets(self) -> dict[str, str]:
        return {t: getattr(self, f"{t}_dataset") for t in TASKS}

    def train_config(self) -> TrainConfig:
        """The library's TrainConfig (tasks / selection as configured; datasets.training_plan fills them in)."""
        kw = {name: getattr(self, name) for name in _TRAINING}
        return TrainConfig.from_flat({**kw, "tasks": tuple(self.tasks or ()), "selection": self.selection or "val_ar"})


_TRAINING = _dagster_fields()
AAMTrainingConfig = create_model(
    "AAMTrainingConfig", __base__=(dg.Config, _TrainingConfigMethods), __module__=__name__,
    __doc__="How aam_model trains: splavu_core.aam.config.TrainConfig's fields (its projection and loop sections flat, "
            "each labelled, the adapter's own marked), with their defaults; plus which datasets serve which task.",
    tasks=_TRAINING["tasks"],
    **{f"{t}_dataset": (str, Field(default="", description=f"default: the dataset registered with role {t}"))
       for t in TASKS},
    **{n: spec for n, spec in _TRAINING.items() if n != "tasks"})


def check_training_config(cfg: dict) -> None:
    """One line for a misspelt, mistyped or renamed field (the CLI checks before a run starts). A field renamed since
    (config.RENAMED, model.RENAMED) is refused with its new name rather than taken: the run config Dagster records and
    the Launchpad show know one name per field, and a config that kept the old name would keep it alive."""
    now = {before: name for name, before in {**RENAMED, **ADAPTER_RENAMED}.items()
           if name in AAMTrainingConfig.model_fields}
    renamed = sorted(set(cfg) & set(now))
    if renamed:
        raise ValueError(f"training field(s) {renamed} were renamed: use {[now[k] for k in renamed]} (the appearance "
                         f"projection is no longer called erasure; erasure means only `splavu forget`)")
    unknown = sorted(set(cfg) - set(AAMTrainingConfig.model_fields))
    if unknown:
        raise ValueError(f"unknown training field(s) {unknown}; valid: {', '.join(AAMTrainingConfig.model_fields)}")
    try:
        AAMTrainingConfig(**cfg).train_config()
    except (ValidationError, TypeError, ValueError) as e:
        first = e.errors()[0] if isinstance(e, ValidationError) else None
        raise ValueError(f"training field {first['loc'][0]!r}: {first['msg']}" if first else str(e)) from None


def loss_curve_png(history: list[dict], diagnostics: dict | None = None, selected_epoch: int | None = None) -> bytes:
    """Loss terms, validation AR, and (when measured) what a fresh critic still matches: the privacy objective's
    own value beside held-out pair matching, so a rising loss with unchanged matching shows at a glance. Legends sit
    below the panels (off the data); the selected epoch is a dashed vertical line on each panel."""
    import matplotlib  # here, not at the top: ~0.5 s that only the plot needs

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3 if diagnostics else 2, figsize=(13.5 if diagnostics else 9, 4.2))
    epochs = [h["epoch"] for h in history]
    for key in ("lc", "ar", "tad", "ad", "privacy"):
        if key in history[0]:
            axes[0].plot(epochs, [h[key] for h in history], label=key)
    axes[0].set_xlabel("epoch"), axes[0].set_yscale("log"), axes[0].set_title("loss terms")
    val = [h["val_ar_top1"] for h in history]
    if any(v is not None for v in val):
        axes[1].plot(epochs, val)
    axes[1].set_xlabel("epoch"), axes[1].set_title("validation AR top-1")
    if diagnostics:
        _pair_matching_panel(axes[2], history, diagnostics)
    for ax in axes:
        if selected_epoch is not None:
            ax.axvline(selected_epoch, color="black", ls="--", lw=0.8, label=f"selected epoch {selected_epoch}")
        handles, labels = ax.get_legend_handles_labels()
        if handles:
            ax.legend(handles, labels, fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.22), ncol=2, frameon=False)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=80)
    plt.close(fig)
    return buf.getvalue()


def version_metrics(summary: dict) -> dict:
    """aam_versions.metrics: the selected epoch's loss terms named as losses (`ar_loss`, not `ar`, which reads like
    an accuracy), its validation AR top-1 and pair matching (pm_*)."""
    final = {k: v for k, v in summary["final"].items() if k != "epoch"}
    return {"selected_epoch": summary["selected_epoch"],
            **{(k if k == "val_ar_top1" or k.startswith("pm_") else f"{k}_loss"): v for k, v in final.items()}}


def _diagnostic_metadata(diag: dict | None) -> dict:
    """Pair matching before and after the adapter: floats (plotted across versions) and one table."""
    if not diag:
        return {}
    raw, after = diag["raw"], diag["selected"]
    kinds = [k for k in ("static_static", "static_action") if k in raw]
    md = {"pair_matching_chance": dg.MetadataValue.float(float(raw["chance"]))}
    for kind in kinds:
        md[f"pair_matching_{kind}_raw"] = dg.MetadataValue.float(float(raw[kind]))
        md[f"pair_matching_{kind}_after"] = dg.MetadataValue.float(float(after[kind]))
    for k in ("group", "heldout"):
        if k in raw:
            md[f"pair_matching_{k}"] = dg.MetadataValue.int(int(raw[k]))
    md["pair_matching"] = dg.MetadataValue.table(
        [dg.TableRecord({"pairs": kind.replace("_", "↔"), "raw": float(raw[kind]), "after": float(after[kind]),
                         "chance": float(raw["chance"])}) for kind in kinds],
        schema=dg.TableSchema(columns=[dg.TableColumn("pairs", "string"), dg.TableColumn("raw", "float"),
                                       dg.TableColumn("after", "float"), dg.TableColumn("chance", "float")]))
    return md


def float_table(values: dict, key: str, value: str) -> dg.TableMetadataValue:
    """{name: number} as a two-column table (Dagster renders it as a table, not as raw JSON)."""
    return dg.MetadataValue.table([dg.TableRecord({key: k, value: float(v)}) for k, v in values.items() if v is not None],
                                  schema=dg.TableSchema(columns=[dg.TableColumn(key, "string"),
                                                                 dg.TableColumn(value, "float")]))


def _pair_matching_panel(ax, history: list[dict], diag: dict) -> None:
    during = diag["during"]
    colours = {"static_static": "tab:blue", "static_action": "tab:orange"}
    for kind, colour in colours.items():
        if kind in diag["raw"]:
            ax.plot([d["epoch"] for d in during], [d[kind] for d in during], "o-", color=colour,
                    label=f"{kind.replace('_', '↔')} after")
            ax.axhline(diag["raw"][kind], color=colour, ls="--", lw=1, label=f"{kind.replace('_', '↔')} raw")
    ax.axhline(diag["raw"]["chance"], color="grey", ls=":", lw=1, label="chance")
    ax.set_ylim(0, 1.02), ax.set_xlabel("epoch"), ax.set_ylabel("fresh critic top-1 (held-out videos)")
    ax.set_title("what is left: pair matching")
    if "privacy" in history[0]:
        twin = ax.twinx()
        twin.plot([h["epoch"] for h in history], [h["privacy"] for h in history], color="tab:red", lw=1)
        twin.set_ylabel("privacy objective", color="tab:red")


@dg.asset(deps=["clip_latents", "static_latents"], group_name="anonymizer", kinds={"pytorch", "safetensors"},
          description="The AAM trained on cached clip + static latents (SPLAVU objectives). Never loads the encoder.")
def aam_model(context: dg.AssetExecutionContext, config: AAMTrainingConfig, store: StoreResource) -> dg.MaterializeResult:
    return dg.MaterializeResult(metadata=fit_adapter(store.store(), config, log=context.log.info))


def fit_adapter(feature_store, config: AAMTrainingConfig, log=print) -> dict:
    """What aam_model does: fit the adapter `config` describes on the store's cached latents, save it, record the
    version (not current). Returns the asset's metadata (its `version` among them); the erasure's refit calls it too."""
    plan = training_plan(feature_store, config.tasks, config.train_datasets(), config.selection)  # datasets by role
    log(plan.summary())
    data = load_training_data(feature_store, plan.datasets["ar"], plan.datasets["tad"], plan.datasets["ad"])
    train_cfg = config.train_config().replace(tasks=plan.tasks, selection=plan.selection)
    rule = None
    if train_cfg.operating_point == "rule":  # the candidate the publish rule picks on the selection split
        train_cfg, rule = choose(feature_store, data, train_cfg, log=log)
    t = time.perf_counter()
    adapter, acfg, summary = train_aam(data, train_cfg, log=log)
    if rule is not None:
        summary["operating_point"] = {k: rule[k] for k in ("split", "chosen", "why", "request") if k in rule}
    fit_s = time.perf_counter() - t  # fits, loop and diagnostics: the closed form's work is all outside the loop
    fingerprint = feature_store.encoder_fingerprint()
    version = adapter_version(adapter, acfg, fingerprint)  # content hash: same weights, same version
    final = feature_store.loc("aam", version)
    save_adapter(adapter, acfg, final, fingerprint, extra={k: v for k, v in summary.items() if k != "history"},
                 storage_options=getattr(feature_store.files, "storage_options", None))
    feature_store.files.put_atomic(f"aam/{version}/history.json", (json.dumps(summary["history"]) + "\n").encode())
    png = None
    if summary["history"]:  # a closed-form adapter (keep, no trained block) has no epochs to plot
        png = loss_curve_png(summary["history"], summary.get("diagnostics"), summary["selected_epoch"])
        feature_store.files.put_atomic(f"aam/{version}/loss_curves.png", png)
    metrics = version_metrics(summary)
    record_version(feature_store, version, {"encoder_fingerprint": fingerprint, "config": acfg.to_dict()},
                   metrics, make_current=False)  # becomes current once its tables are published
    costs.record(feature_store, "splavu", "train", version, summary["seconds"])
    return {
        "version": version, "encoder_fingerprint": fingerprint, "path": dg.MetadataValue.path(str(final)),
        "fit": dg.MetadataValue.text(fit_description(summary, acfg.dim)),
        "fit_seconds": dg.MetadataValue.float(round(fit_s, 2)),
        **(_training_metadata(summary, metrics, png, feature_store.loc("aam", version, "loss_curves.png"))
           if summary["history"] else {}),
        **_diagnostic_metadata(summary.get("diagnostics")),
        **_keep_metadata(summary.get("keep"), acfg.dim),
        **operating_point_metadata(rule),
    }


def fit_description(summary: dict, dim: int) -> str:
    """One line on what aam_model did: a closed-form keep fit has no epochs, and "0 parameters, selected epoch 0"
    would read as nothing trained."""
    keep = summary.get("keep")
    width = f"keep fit, k = {keep['k']} of {dim} directions" if keep else "fit"
    if keep and keep.get("recentre"):
        rc = keep["recentre"]
        on = rc.get("on", "classes")  # records before 'on' recentred on classes
        width += (f", each video recentred on its expected class among {rc['classes']}" if on == "classes" else
                  f", each video recentred on its clips' expected clusters among {rc['classes']}")
    if not summary["history"]:
        return f"closed-form {width}, no training loop"
    trained = f"{summary['parameters']} parameters trained, selected epoch {summary['selected_epoch']}"
    return f"{width}, then {trained}" if keep else trained


def _training_metadata(summary: dict, metrics: dict, png: bytes, png_path: str) -> dict:
    """What only a trained adapter has: its epochs' losses, as numbers (charted across versions), a table and plots."""
    return {
        "parameters": summary["parameters"], "selected_epoch": summary["selected_epoch"],
        "train_seconds": dg.MetadataValue.float(summary["seconds"]),
        **{k: dg.MetadataValue.float(float(v)) for k, v in metrics.items() if k != "selected_epoch" and v is not None},
        "final_losses": float_table({k: v for k, v in metrics.items() if k.endswith("_loss")}, "term", "loss"),
        # the one way to show an image in the UI is markdown; the PNG itself is at loss_curves_path
        "loss_curves_path": dg.MetadataValue.path(str(png_path)),
        "loss_curves": dg.MetadataValue.md(png_markdown(png, "loss curves")),
    }


def _keep_metadata(keep: dict | None, dim: int) -> dict:
    """The keep stage's width and the utility ratios it ranked directions by (the k kept and the k + 1 largest
    dropped, as train_aam records them): a small gap at the cut means the width is a close call."""
    if not keep:
        return {}
    k, ev = keep["k"], keep["eigenvalues"]
    md = {"published_width": keep["k"], "input_width": dim,
          "keep_tasks": dg.MetadataValue.text(", ".join(keep["tasks"]) or "none: motion directions"),
          "keep_smallest_kept_ratio": dg.MetadataValue.float(float(ev[k - 1]))}
    if len(ev) > k:
        md["keep_largest_dropped_ratio"] = dg.MetadataValue.float(float(ev[k]))
    md["keep_spectrum"] = dg.MetadataValue.table(
        [dg.TableRecord({"direction": i + 1, "utility_ratio": float(e), "kept": i < k}) for i, e in enumerate(ev)],
        schema=dg.TableSchema(columns=[dg.TableColumn("direction", "int"), dg.TableColumn("utility_ratio", "float"),
                                       dg.TableColumn("kept", "bool")]))
    return md


def operating_point_metadata(rule: dict | None) -> dict:
    """The publish rule's choice (evaluation/operating_point.py): the candidate picked, why, and every candidate's
    selection figures as a table and a plot."""
    if rule is None:
        return {"operating_point": dg.MetadataValue.text("as given (operating_point 'as_given': the rule did not run)")}
    md = {"operating_point": dg.MetadataValue.text(rule["chosen"] or "as given"),
          "operating_point_why": dg.MetadataValue.text(rule["why"])}
    if rule.get("members"):
        md["operating_point_candidates"] = dg.MetadataValue.md(markdown(rule))
        md["operating_point_curve"] = dg.MetadataValue.md(png_markdown(plot_png(rule), "candidates on selection"))
    return md
