"""`splavu demo`'s plan and bookkeeping: which datasets it runs, the clock of its stages, and the record of them it adds
to the store's report. The steps themselves are the CLI's own commands (synth, extract, train, publish, evaluate,
curve, sql), run in order by pipeline/cli.py's cmd_demo, which prints what each did."""
from __future__ import annotations

import shutil
import time
from pathlib import Path

from splavu_core.ingest.synth.datasets import DATASETS
from splavu_core.settings import settings
from splavu_core.store import costs
from splavu_core.store.feature_store import StoreError
from splavu_core.store.ledger import current_version, newest_version

# The default demo's datasets, and the groups behind `--with` / `--full`. The Bias-F/M sets (benchmark v3: 2,100 short
# videos with the shortcut action's extra test videos) show the shortcut on raw features, but cost synthesis and
# extraction the default's time target has no room for; the report says they were not run. The walks (192 clips)
# are read beyond chance by a learned metric: in by default.
DEMO_DATASETS = ("ar", "privacy", "tad", "ad", "gait")
DEMO_EXTRAS = {"bias": ("bias_f", "bias_m")}
DEMO_EXTRA_WHY = {"bias": "Bias-F/M shortcut-gap rows (2,100 more short videos to render and encode)"}
# The analyst's query the demo ends with
ANALYST_SQL = ("SELECT task, metric, feature_set, round(value, 3) AS value FROM metrics "
               "WHERE metric IN ('top1', 'mAP', 'auc', 'cmap', 'leakage_removed') AND task IN ('ar', 'tad', 'ad', 'privacy') "
               "ORDER BY task, metric, feature_set")


def demo_datasets(extras: str | None, full: bool = False) -> tuple[list[str], dict[str, str]]:
    """(datasets in DATASETS order, {group left out: why}) for `--with GROUP,...` / `--full`."""
    chosen = list(DEMO_EXTRAS) if full else [x.strip() for x in (extras or "").split(",") if x.strip()]
    chosen = [x for x in chosen if x != "gait"]  # in by default now; `--with gait` (older scripts) asks for nothing more
    unknown = [x for x in chosen if x not in DEMO_EXTRAS]
    if unknown:
        raise StoreError(f"--with: unknown group(s) {unknown}; choose from {', '.join(DEMO_EXTRAS)}")
    names = [d for d in DATASETS if d in DEMO_DATASETS or any(d in DEMO_EXTRAS[x] for x in chosen)]
    left = {x: f"{DEMO_EXTRA_WHY[x]}; `splavu demo --with {x}` or `--full` runs it"
            for x in DEMO_EXTRAS if x not in chosen}
    return names, left


class StageClock:
    """Wall seconds of the demo's stages: `lap(stage)` ends a stage where the previous one ended; `stages` starts with
    the install's (`make demo` passes it, None otherwise)."""

    def __init__(self):
        self.t0 = self.mark = time.perf_counter()
        self.stages: dict[str, float | None] = {"install": install_seconds()}
        self.measurements: dict[str, dict[str, int]] = {}  # stage -> {"scored", "reused"} (scoring's counts)
        self._counted = _measurement_counts()

    def lap(self, stage: str) -> None:
        now = time.perf_counter()
        self.stages[stage] = now - self.mark
        self.mark = now
        counts = _measurement_counts()
        done = {k: counts[k] - self._counted.get(k, 0) for k in counts}
        if any(done.values()):
            self.measurements[stage] = done
        self._counted = counts

    def elapsed(self) -> float:
        return time.perf_counter() - self.t0

    def split_gates(self, publish_out: dict) -> None:
        """The gates' share of the publish stage, as a stage of its own (gate_seconds)."""
        self.stages["gates"] = gate_seconds(publish_out)
        if self.stages["gates"] is not None:
            self.stages["publish"] -= self.stages["gates"]
        if "publish" in self.measurements:  # publishing measures nothing: what it scored, its gates did
            self.measurements["gates"] = self.measurements.pop("publish")


def _measurement_counts() -> dict[str, int]:
    """The process's scored / reused measurement counts; here, not at the top: the scoring module loads torch."""
    from splavu_core.evaluation.scoring import measurement_counts

    return measurement_counts()


def remove_datasets(data: Path, names) -> None:
    """`--regenerate`: only the benchmark's own dataset folders."""
    for name in names:
        shutil.rmtree(data / name, ignore_errors=True)


def install_seconds() -> float | None:
    """`make demo` passes its setup's wall time (SPLAVU_INSTALL_SECONDS); None when run otherwise."""
    return settings().install_seconds


def gate_seconds(out: dict) -> float | None:
    """The blocking gates' share of a publish: the gated shard run's time beyond the median ungated one (the gates
    run as asset checks inside that run, so they have no clock of their own); None with no ungated run to compare."""
    runs = out.get("run_seconds", {}).values()
    gated = [x["seconds"] for x in runs if x["gates"]]
    plain = sorted(x["seconds"] for x in runs if not x["gates"])
    if not gated or not plain:
        return None
    return max(0.0, sum(gated) - len(gated) * plain[len(plain) // 2])


def record(store, stages: dict, left_out: dict, datasets, scale: str, seed: int,
           measurements: dict | None = None) -> dict:
    """The demo's record in the store's costs (costs.record_demo), added to the report too; returns it.
    measurements: stage -> {"scored", "reused"} (StageClock.measurements)."""
    demo = costs.record_demo(store, stages, left_out, datasets=datasets, scale=scale, seed=seed,
                             measurements=dict(measurements or {}))
    add_demo_to_report(store, demo)
    return demo


def add_demo_to_report(store, demo: dict) -> None:
    """The report was written by the evaluate step, before the demo knew that step's time: add the demo's stages to
    its cost section now (the same report otherwise)."""
    # here: the report module imports torch, which the analysts' commands never need
    from splavu_core.evaluation.report import read_report, write_privacy_utility_report

    try:
        report = read_report(store)
    except FileNotFoundError:
        return
    if report.get("costs") is not None:
        report["costs"]["demo"] = demo
        write_privacy_utility_report(store, report)


def demo_version(store) -> str | None:
    """The demo scores the current version, else (all refused) the newest, and says which."""
    return current_version(store) or newest_version(store)
