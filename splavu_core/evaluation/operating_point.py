"""The publish rule: which operating point of a stated candidate family a store publishes, picked on the store's
SELECTION split, so that publishing is a property of the product and not of one configuration's luck on one store.

    family(cfg)          the candidates: CANDIDATES' changes, each applied to the configuration asked for
    measure_candidates   every candidate fitted from the cached latents (the adapter itself: aam.train.train_aam) and
                         scored on the selection split by the gates' own scoring (the attacker suite, raw's strongest
                         reader, probe seeds, the bootstrap over people). The selection split has people of its own:
                         the validation videos the gates read and the test videos the report reads are never scored
    pick                 THE RULE (below), over those figures
    choose               all of it, for aam_model: the configuration to fit and the selection's record

The rule. Each candidate's selection figures predict what the gates will read on validation. A gate passes a part
when the validation estimate clears the part's bar: a privacy part (close-ups, action clips, linkage removed) when
its estimate is at least the budget plus its interval's half-width (the gate reads the lower end); a seen task's
retention when it is at least the utility floor (or 1 minus the half-width, where the interval is too wide to show a
loss). For each part

    z = (selection estimate - bar) / sqrt(sd_selection^2 + sd_validation^2)

where validation's half-width (in the bar) and sd are selection's scaled by sqrt(selection videos / validation
videos) of that part (an interval narrows about as 1/sqrt(videos)). A candidate's z is its weakest part's. Then

  1. among the candidates with z >= Z_SAFE (each predicted to pass both gates about 95 times in 100), the most
     private: the highest weakest privacy part on selection;
  2. when none is, the candidate with the highest z (the most likely to publish), and the record says so.

The gates then run once, on validation, on the picked candidate alone; nothing about the choice lowers a budget or
weakens an attacker or a reader. The choice reads the selection split's private labels (through the attackers, as
the gates read validation's); each candidate's fit reads none (tests/test_aam_train.py's label-flip test).
"""
from __future__ import annotations

import dataclasses
import io
import math
import time
from collections.abc import Callable, Sequence

from splavu_core.aam.config import TrainConfig
from splavu_core.aam.train import train_aam
from splavu_core.aam.training_data import TrainingData
from splavu_core.evaluation.keep_curve import PROBE_KWARGS
from splavu_core.evaluation.scoring import score_sets, task_split
from splavu_core.evaluation.suite import anonymize_videos

SPLIT = "select"
Z_SAFE = 1.645                      # one-sided 95%: a candidate predicted to pass every part this often is "safe"
PRIVACY_PARTS = {"privacy": "leakage_removed", "clip_privacy": "leakage_removed", "reid": "linkage_removed"}
UTILITY_METRIC = {"ar": "retention_top1", "tad": "retention_mAP", "ad": "retention_auc"}
PART_NAMES = {"privacy": "close-ups", "clip_privacy": "action clips", "reid": "linkage", "ar": "AR", "tad": "TAD",
              "ad": "AD"}

# The candidate family: name -> the flat TrainConfig / adapter fields it changes in the configuration asked for.
# Ordered roughly from most utility to most privacy; chosen on worlds 0 and 1 of the demo benchmark (docs/history.md).
CANDIDATES: dict[str, dict] = {
    "default": {},
    "k17": {"keep": 17},
    "k14": {"keep": 14},
    "k20-within": {"keep": 20, "keep_w_app": 3.0, "keep_app_within": True},
    "k14-top2": {"keep": 14, "recentre_draw": 1.0, "recentre_top": 2},
    "k20-within-top2": {"keep": 20, "keep_w_app": 3.0, "keep_app_within": True, "recentre_draw": 1.0,
                        "recentre_top": 2},
}

@dataclasses.dataclass
class Candidate:
    name: str
    changes: dict
    config: TrainConfig


def family(cfg: TrainConfig, names: Sequence[str] | None = None) -> list[Candidate]:
    """The candidates (CANDIDATES, or `names` of them), each `cfg` with its changes."""
    out = []
    for name in names or CANDIDATES:
        if name not in CANDIDATES:
            raise ValueError(f"unknown candidate {name!r}; the family: {', '.join(CANDIDATES)}")
        out.append(Candidate(name, dict(CANDIDATES[name]), cfg.replace(**CANDIDATES[name])))
    return out


# ---------------------------------------------------------------- scoring on the selection split

def split_units(raw: dict, datasets: dict, which: Sequence[str], split: str) -> dict:
    """part -> how many videos a measurement of it on `split` scores (what its interval's width goes with)."""
    return {t: len(task_split(raw[datasets[t]], split, t)[1]) for t in which}


class Measured:
    """The candidates fitted once (fit(cfg) -> adapter; default: train_aam without its diagnostics, which fit nothing)
    and their anonymized videos, each part scored on `split` only when asked (`score`), raw's once per part. raw:
    dataset -> raw videos, EVERY video (which holdouts a dataset lacks decides what is carved); datasets: task ->
    dataset. `members`: [{name, changes, figures: {part: [value, lo, hi]}, units: {part: videos scored},
    scored: [parts]}]."""

    def __init__(self, candidates: Sequence[Candidate], data: TrainingData, raw: dict, datasets: dict,
                 which: Sequence[str], seeds: Sequence[int] = range(5), store=None, log=None,
                 fit: Callable | None = None, split: str = SPLIT):
        t0 = time.perf_counter()
        fit = fit or (lambda cfg: train_aam(data, cfg.replace(heldout_fraction=0.0), log=None)[0])
        self.raw = {ds: raw[ds] for ds in dict.fromkeys(datasets[t] for t in which)}
        self.datasets, self.which, self.seeds, self.store, self.log, self.split = \
            datasets, list(which), list(seeds), store, log, split
        self.sets = {}
        for c in candidates:
            adapter = fit(c.config)
            self.sets[c.name] = {ds: anonymize_videos(adapter, vs) for ds, vs in self.raw.items()}
        self.members = [{"name": c.name, "changes": c.changes, "figures": {}, "units": {}, "scored": []}
                        for c in candidates]
        self.raw_rows: dict = {}
        self.skipped: dict = {}
        self.seconds = time.perf_counter() - t0

    def score(self, names: Sequence[str], tasks: Sequence[str]) -> None:
        t0 = time.perf_counter()
        tasks = [t for t in self.which if t in tasks]
        res = score_sets({"raw": self.raw, **{n: self.sets[n] for n in names}}, tasks, self.datasets,
                         split=self.split, seeds=self.seeds, probe_kwargs=PROBE_KWARGS, store=self.store, log=self.log)
        self.skipped.update(res.skipped)
        for r in res:
            if r["feature_set"] == "raw":
                self.raw_rows[(r["task"], r["metric"])] = {k: r[k] for k in ("task", "metric", "value", "ci_low",
                                                                              "ci_high", "chance")}
        for m in self.members:
            if m["name"] not in names:
                continue
            for task in tasks:
                metric = PRIVACY_PARTS.get(task) or UTILITY_METRIC.get(task)
                hit = [r for r in res if r["feature_set"] == m["name"] and r["task"] == task and r["metric"] == metric]
                if hit and all(math.isfinite(hit[-1][k]) for k in ("value", "ci_low", "ci_high")):
                    m["figures"][task] = [round(hit[-1][k], 4) for k in ("value", "ci_low", "ci_high")]
                    m["units"][task] = len(res.scored[task]["raw"].test_ids or ())
                m["scored"].append(task)
        self.seconds += time.perf_counter() - t0

    def record(self) -> dict:
        return {"members": self.members, "raw": list(self.raw_rows.values()), "skipped": self.skipped,
                "seconds": round(self.seconds, 1)}


def measure_candidates(candidates: Sequence[Candidate], data: TrainingData, raw: dict, datasets: dict,
                       which: Sequence[str], seeds: Sequence[int] = range(5), store=None, log=None,
                       fit: Callable | None = None, split: str = SPLIT) -> dict:
    """Every candidate scored on every part of `which` (Measured): {"members", "raw": raw's rows, "seconds"}."""
    measured = Measured(candidates, data, raw, datasets, which, seeds, store, log, fit, split)
    measured.score([c.name for c in candidates], which)
    return measured.record()


# ---------------------------------------------------------------- the rule

def part_z(task: str, fig: Sequence[float], budget: float, floor: float, scale: float = 1.0) -> float:
    """The z of one part (module doc): how far its selection estimate clears the bar the gate will read on
    validation, in units of the two splits' combined noise. scale: validation's half-width over selection's,
    sqrt(selection videos / validation videos)."""
    value, lo, hi = fig
    half = max((hi - lo) / 2, 1e-6)
    val_half = half * scale
    sd = math.hypot(half, val_half) / 1.959964
    if task in PRIVACY_PARTS:
        bar = budget + val_half                           # the gate reads the lower end
    else:
        bar = min(floor, 1.0 - val_half)                  # refused only for a loss beyond the noise
    return (value - bar) / sd


def assess(member: dict, seen: Sequence[str], budget: float, floor: float, val_units: dict | None = None) -> dict:
    """member's z per part, its weakest part, its weakest privacy figure; z is -inf when the close-ups could not be
    measured (a part the gate cannot measure fails the gate). val_units: part -> validation videos it scores."""
    fig, units, val_units = member["figures"], member.get("units", {}), val_units or {}
    scale = {t: math.sqrt(units[t] / val_units[t]) if units.get(t) and val_units.get(t) else 1.0 for t in fig}
    parts = {t: part_z(t, f, budget, floor, scale[t]) for t, f in fig.items() if t in PRIVACY_PARTS or t in seen}
    missing = [t for t in ("privacy",) if t not in fig]
    weakest = min(parts, key=parts.get) if parts else None
    private = [fig[t][0] for t in PRIVACY_PARTS if t in fig]
    return {"z": {t: round(z, 3) for t, z in parts.items()},
            "z_min": -math.inf if missing or weakest is None else round(parts[weakest], 3),
            "weakest": "close-ups not measured" if missing else PART_NAMES.get(weakest, weakest),
            "privacy": min(private) if private else None,
            "p_publish": round(_phi(parts[weakest]), 3) if weakest and not missing else 0.0}


def _phi(z: float) -> float:
    return 0.5 * (1 + math.erf(z / math.sqrt(2)))


def pick(members: list[dict], seen: Sequence[str], budget: float, floor: float, val_units: dict | None = None) -> dict:
    """The rule (module doc) over measure_candidates' members (each gains its `assessment`). Returns {"chosen": name,
    "why": one line, "safe": names with z >= Z_SAFE}."""
    for m in members:
        m["assessment"] = assess(m, seen, budget, floor, val_units)
    safe = [m for m in members if m["assessment"]["z_min"] >= Z_SAFE]
    if safe:
        best = max(safe, key=lambda m: (m["assessment"]["privacy"], m["assessment"]["z_min"]))
        why = (f"{best['name']}: the most private of the {len(safe)} candidate(s) predicted to pass both gates "
               f"(z >= {Z_SAFE}) on selection; weakest privacy part {best['assessment']['privacy']:.3f}, weakest part "
               f"{best['assessment']['weakest']} z {best['assessment']['z_min']:.2f}")
    else:
        best = max(members, key=lambda m: m["assessment"]["z_min"])
        a = best["assessment"]
        why = (f"{best['name']}: no candidate is predicted to pass both gates 95 times in 100 on selection; the most "
               f"likely to ({a['p_publish']:.0%} predicted), held back by {a['weakest']} (z {a['z_min']:.2f})")
    return {"chosen": best["name"], "why": why, "safe": [m["name"] for m in safe], "limits": limits(members)}


def limits(members: list[dict]) -> list[str]:
    """What holds the family back, part by part (after `assess`): a part no candidate is predicted to clear (its best
    z below 0: its estimates fall short of the bar, so more data would most likely confirm it; another encoder, or
    more of what the part needs, is the route), or one none clears with confidence (best z in [0, Z_SAFE): more
    selection and validation videos of more people would decide it). Empty when some candidate is safe."""
    if any(m["assessment"]["z_min"] >= Z_SAFE for m in members):
        return []
    out = []
    parts = sorted({t for m in members for t in m["assessment"]["z"]})
    for t in parts:
        zs = [(m["assessment"]["z"][t], m) for m in members if t in m["assessment"]["z"]]
        z, m = max(zs, key=lambda zm: zm[0])
        fig = m["figures"][t]
        what = f"{PART_NAMES.get(t, t)} (best: {m['name']}, {fig[0]:.3f} [{fig[1]:.3f}, {fig[2]:.3f}], z {z:.2f})"
        if z < 0:
            out.append(f"no candidate is predicted to clear {what}: its estimates fall short of the gate's bar; "
                       f"another encoder (or, for a task, more of its labelled videos) would change that, not more "
                       f"of the same data")
        elif z < Z_SAFE:
            out.append(f"no candidate clears {what} with confidence: more selection and validation videos of more "
                       f"people would decide it")
    return out


# The parts every candidate is scored on first: those that bound the choice on the demo's stores (the close-ups and
# AR; docs/method.md). The others are scored only for a candidate the rule would pick on what is known: a part can
# only lower a candidate's z and its weakest privacy figure, so what the rest have not been scored on cannot make
# them win, and the pick is the one full scoring would make (tests/test_operating_point.py).
FIRST = ("privacy", "ar")


def pick_lazily(measured: Measured, seen: Sequence[str], budget: float, floor: float,
                val_units: dict | None = None) -> dict:
    """The rule's pick, scoring FIRST for every candidate, then the other parts for the candidate the rule picks on
    what is scored, until that candidate is scored on every part."""
    measured.score([m["name"] for m in measured.members], FIRST)
    while True:
        choice = pick(measured.members, seen, budget, floor, val_units)
        m = next(m for m in measured.members if m["name"] == choice["chosen"])
        rest = [t for t in measured.which if t not in m["scored"]]
        if not rest:
            return choice
        measured.score([m["name"]], rest)


# ---------------------------------------------------------------- the record

def markdown(record: dict) -> str:
    """The candidates' selection figures as a Markdown table, the picked one in bold."""
    def cell(f):
        return "—" if f is None else f"{f[0]:.2f} [{f[1]:.2f}, {f[2]:.2f}]"

    tasks = [t for t in (*PRIVACY_PARTS, *UTILITY_METRIC) if any(t in m["figures"] for m in record["members"])]
    lines = ["| candidate | " + " | ".join(PART_NAMES[t] for t in tasks) + " | z (weakest part) |",
             "|---|" + "---:|" * (len(tasks) + 1)]
    for m in record["members"]:
        name = f"**{m['name']} (picked)**" if m["name"] == record["chosen"] else m["name"]
        a = m.get("assessment", {})
        z = "—" if not a else f"{a['z_min']:.2f} ({a['weakest']})"
        lines.append(f"| {name} | " + " | ".join(cell(m["figures"].get(t)) if t in m.get("scored", m["figures"])
                                                  else "·" for t in tasks) + f" | {z} |")
    if any(t not in m.get("scored", m["figures"]) for m in record["members"] for t in tasks):
        lines += ["", "· not scored: a part can only lower a candidate's z, so it could not have changed the pick."]
    return "\n".join(lines)


def plot_png(record: dict) -> bytes:
    """Each candidate's AR retention against its weakest privacy part on selection, with intervals; the pick
    starred; the budget and the floor drawn."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    for m in record["members"]:
        f = m["figures"]
        priv = [t for t in PRIVACY_PARTS if t in f]
        if not priv or "ar" not in f:
            continue
        weakest = min(priv, key=lambda t: f[t][0])
        x, y = f[weakest], f["ar"]
        ax.errorbar([x[0]], [y[0]], xerr=[[x[0] - x[1]], [x[2] - x[0]]], yerr=[[y[0] - y[1]], [y[2] - y[0]]],
                    fmt="*" if m["name"] == record["chosen"] else "o", ms=14 if m["name"] == record["chosen"] else 6,
                    label=m["name"] + (" (picked)" if m["name"] == record["chosen"] else ""))
    ax.axvline(record["budget"], color="grey", ls=":", lw=1)
    ax.axhline(record["floor"], color="grey", ls=":", lw=1)
    ax.set_xlabel("weakest leakage removed on selection (close-ups, clips, linkage)")
    ax.set_ylabel("AR retention on selection")
    if ax.get_legend_handles_labels()[0]:  # no candidate with both a privacy part and AR: nothing to name
        ax.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.02, 0.5))
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=90, bbox_inches="tight")
    plt.close(fig)
    return buf.getvalue()


def summary_line(record: dict) -> str:
    tail = "".join(f"; {line}" for line in record.get("limits") or [])
    return f"operating point (publish rule, on {record['split']}): {record['why']}{tail}"



# ---------------------------------------------------------------- for aam_model

SCORED_TASKS = ("privacy", "clip_privacy", "reid", "ar", "tad", "ad")
REPORT = "reports/operating_point"


def choose(store, data: TrainingData, cfg: TrainConfig, log=None, seeds: Sequence[int] = range(5),
           budget: float | None = None, floor: float | None = None) -> tuple[TrainConfig, dict]:
    """The publish rule on `store`: (the configuration to fit, the record). The record (the candidates' selection
    figures, the rule's verdict, the configuration asked for as `request`) is written to reports/operating_point.json
    and .png. Without a privacy set on selection the rule cannot choose: `cfg` is returned as asked, and the record
    says why (the privacy gate, which cannot measure such a store either, will refuse it)."""
    from splavu_core.evaluation.suite import load_feature_sets
    from splavu_core.ingest.datasets import task_datasets
    from splavu_core.store.ledger import privacy_threshold, utility_fraction

    budget, floor = privacy_threshold(budget), utility_fraction(floor)
    datasets = task_datasets(store, {})
    seen = [t for t in cfg.tasks if t in datasets]
    which = [t for t in SCORED_TASKS if t in datasets and (t in PRIVACY_PARTS or t in seen)]
    record = {"split": SPLIT, "budget": budget, "floor": floor, "z_safe": Z_SAFE, "seeds": list(seeds),
              "request": cfg.flat(), "seen": seen}
    if "privacy" not in which:
        record.update(chosen=None, members=[], why="no privacy dataset in the store: nothing to choose by; the "
                      "configuration as given is fitted (the privacy gate will refuse it: it cannot measure it)")
        return cfg, record
    raw = load_feature_sets(store, which, "raw", datasets=datasets)
    candidates = family(cfg)
    measured = Measured(candidates, data, raw, datasets, which, seeds, store=store, log=log)
    val_units = split_units(raw, datasets, which, "val")
    choice = pick_lazily(measured, seen, budget, floor, val_units)
    record.update(measured.record(), **choice, val_units=val_units)
    store.files.write_json(f"{REPORT}.json", record)
    store.files.put_atomic(f"{REPORT}.png", plot_png(record))
    if log:
        log(summary_line(record))
    return next(c.config for c in candidates if c.name == choice["chosen"]), record
