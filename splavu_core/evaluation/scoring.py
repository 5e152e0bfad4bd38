"""Scoring feature sets with intervals: every metric as a mean over probe seeds with a 95% interval, chance beside
it, and each feature set's change against a reference set (raw) as a PAIRED difference (same seed, same
resampled test videos) with its interval.

Splits: split="test" trains every probe on the 'train' videos and scores the 'test' videos (the report);
split="val" scores the validation videos (the gates) and split="select" the selection videos (the publish rule's
choice of an operating point), each with probes trained on 'train'; neither ever reads the test split. A dataset
without 'val' or 'select' videos gets that holdout carved from its train videos, deterministically
(`carve_holdouts`: whole subjects when subject_id is known, both anomaly labels kept for AD), and its probes then
train on the train videos no holdout took.

    score_sets({"raw": raw, "mine": other}, which=("ar", "ad"), split="val")  -> EvalResult of rows
    score_features(store, fn, split="val")  -> rows for raw and fn(raw) (the lead's anonymizer candidates)

Row: {feature_set, aam_version, task, metric, value, sd, ci_low, ci_high, chance, n_seeds, split, created_at}.
Non-reference sets add, per metric, `delta_<metric>` (set − reference, paired), for utility metrics
`retention_<metric>` = (set − chance) / (reference − chance) (above-chance share kept), and for privacy
`leakage_removed` = (ref − set) / (ref − chance) of the cMAP, each with its interval.
"""
from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime, timezone

import numpy as np

from splavu_core.evaluation import protocols as P
from splavu_core.evaluation import readers as R
from splavu_core.evaluation import score_cache
from splavu_core.evaluation import stats
from splavu_core.tasks.features import VideoFeatures

UTILITY = {"ar": "top1", "tad": "mAP", "ad": "auc"}       # the seen/utility tasks and their headline metric
VAL_FRACTION = 0.2
# the scored splits besides test: the gates read val, the publish rule (evaluation/operating_point.py) select
HOLDOUTS = ("val", "select")


def _now() -> datetime:
    return datetime.now(timezone.utc)


# ---------------------------------------------------------------- splits

def _bucket(key: str) -> float:
    return int(hashlib.sha256(key.encode()).hexdigest()[:8], 16) / 2 ** 32


def carve_holdouts(train: Sequence[VideoFeatures], splits: Sequence[str] = HOLDOUTS, fraction: float = VAL_FRACTION,
                   label: str | None = None) -> tuple[list[VideoFeatures], dict[str, list[VideoFeatures]]]:
    """Deterministic (hash-based) holdouts of train videos for the `splits` (of HOLDOUTS) a dataset has none of:
    whole subjects (meta subject_id) when known, else videos; with `label` (e.g. 'anomaly') the fraction is taken
    within each label value. Each holdout has a fixed place in the hash order (val the first `fraction` of the units,
    select the next), so carving one never moves the other. Returns (the rest of train, split -> its videos)."""
    train = list(train)
    strata: dict = {}
    for v in train:
        strata.setdefault(v.meta.get(label) if label else None, []).append(v)
    rest, out = [], {s: [] for s in splits}
    for group in strata.values():
        units = sorted({str(v.meta.get("subject_id") or v.video_id) for v in group}, key=_bucket)
        n = max(1, round(fraction * len(units))) if len(units) > len(HOLDOUTS) else 0
        place = {u: HOLDOUTS[i // n] for i, u in enumerate(units[:n * len(HOLDOUTS)])} if n else {}
        for v in group:
            h = place.get(str(v.meta.get("subject_id") or v.video_id))
            (out[h] if h in out else rest).append(v)
    return rest, out


def carve_validation(train: Sequence[VideoFeatures], fraction: float = VAL_FRACTION, label: str | None = None
                     ) -> tuple[list[VideoFeatures], list[VideoFeatures]]:
    """The validation holdout alone (carve_holdouts): (the rest of train, val)."""
    rest, out = carve_holdouts(train, ("val",), fraction, label)
    return rest, out["val"]


def task_split(videos: Sequence[VideoFeatures], split: str, task: str = "") -> tuple[list, list]:
    """(probe training videos, scored videos) for split 'test', 'val' or 'select' of `videos`, EVERY video of one
    dataset (which holdouts it lacks decides what is carved from train). A holdout (val, select) is the
    dataset's own videos of that split, else carved from its train videos (carve_holdouts); a probe scoring a holdout
    trains on the train videos no carved holdout took, so neither holdout's people ever train it."""
    train = [v for v in videos if v.split == "train"]
    if split == "test":
        return train, [v for v in videos if v.split == "test"]
    if split not in HOLDOUTS:
        raise ValueError(f"split must be 'test' or one of {list(HOLDOUTS)}, got {split!r}")
    own = {h: [v for v in videos if v.split == h] for h in HOLDOUTS}
    lacking = [h for h in HOLDOUTS if not own[h]]
    if not lacking:
        return train, own[split]
    rest, carved = carve_holdouts(train, lacking, label="anomaly" if task == "ad" else None)
    return rest, own[split] or carved[split]


# ---------------------------------------------------------------- running one task

def _usable_attributes(train, test, attributes) -> list[str]:
    out = []
    for a in attributes:
        col = a if a.startswith("attr_") else f"attr_{a}"
        if all(len({v.meta.get(col) for v in part} - {None}) == 2 for part in (train, test)):
            out.append(a)
    return out


def privacy_attributes(videos) -> list[str]:
    return sorted({k for v in videos for k, val in v.meta.items() if k.startswith("attr_") and val is not None})


def run_task(task: str, videos: Sequence[VideoFeatures], split: str, seeds: Sequence[int],
             kw: Mapping | None = None, attributes: Sequence[str] | None = None) -> tuple[P.Scored | None, str | None]:
    """One protocol on one feature set: (Scored, None) or (None, why it was skipped)."""
    kw = dict(kw or {})
    kw.pop("seed", None)
    if task == "gait":
        vids = [v for v in videos if v.meta.get("subject_id") is not None]
        return (P.gait_retrieval(vids), None) if len(vids) >= 2 else (None, "needs >= 2 videos with 'subject_id'")
    train, test = task_split(videos, split, task)
    if not train or not test:
        return None, f"needs train and {split} videos (have {len(train)} / {len(test)})"
    if task == "ar":
        return R.read("ar", train, test, seeds, **kw), None
    if task in ("bias_f", "bias_m"):
        if len({v.meta.get("group") for v in test} - {None}) < 2:
            return None, f"needs a {split} split with >= 2 groups"
        return dataclasses.replace(P.bias(train, test, seeds, **kw), task=task), None
    if task == "tad":
        if not any(v.meta.get("segments") for v in test):
            return None, f"needs {split} videos with 'segments'"
        classes = sorted({s[2] for v in train + test for s in (v.meta.get("segments") or [])})
        return R.read("tad", train, test, seeds, classes=classes, **kw), None
    if task == "ad":
        for part, name in ((train, "train"), (test, split)):
            if {v.meta.get("anomaly") for v in part} != {0, 1}:
                return None, f"needs {name} videos with both anomaly labels 0 and 1"
        return R.read("ad", train, test, seeds, **kw), None
    if task == "reid":
        for part, name in ((train, "train"), (test, split)):
            if any(v.meta.get("subject_id") is None for v in part):
                return None, f"needs 'subject_id' on every {name} video (who is who) to measure re-identification"
        subj: dict = {}
        for v in test:
            subj.setdefault(v.meta["subject_id"], set()).add(v.meta.get("action"))
        if sum(len(a) >= 2 for a in subj.values()) < 2:
            return None, f"needs >= 2 {split} subjects seen in >= 2 different actions"
        return P.reidentification(train, test), None
    if task in ("privacy", "clip_privacy"):
        attrs = _usable_attributes(train, test, attributes or privacy_attributes(videos))
        if not attrs:
            return None, "no attribute has both classes in train and the scored split"
        return dataclasses.replace(P.privacy_attack(train, test, attrs, seeds, **kw), task=task), None
    raise ValueError(f"unknown task {task!r}")


# ---------------------------------------------------------------- rows

def _row(feature_set, aam_version, task, metric, stat, chance, split, created_at) -> dict:
    return {"feature_set": feature_set, "aam_version": aam_version, "task": task, "metric": metric,
            "value": float(stat["value"]), "sd": float(stat["sd"]), "ci_low": float(stat["ci_low"]),
            "ci_high": float(stat["ci_high"]), "chance": None if chance is None else float(chance),
            "n_seeds": int(stat["n_seeds"]), "split": split, "created_at": created_at}


def scored_rows(sc: P.Scored, feature_set: str, aam_version: str | None, split: str, created_at,
                ref: P.Scored | None = None) -> list[dict]:
    """Rows of one Scored (and, given the reference set's Scored on the same videos, its paired changes). The
    bootstrap resamples the scored people where one person holds several videos (Scored.clusters; the reference's,
    so both sides and every change draw the same resamples)."""
    if ref is not None:
        assert ref.test_ids == sc.test_ids, f"{sc.task}: the two feature sets were scored on different videos"
    clusters = ref.clusters if ref is not None and ref.clusters is not None else sc.clusters
    rows = []
    for m, fn in sc.metrics.items():
        signed = m in sc.signed  # every other base metric is in [0, 1]
        st = stats.interval(fn, sc.n_seeds, None if m in sc.seed_only else sc.n_test, sc.n_boot, same=sc.same_outputs,
                            clusters=clusters, bounded=not signed)
        st = {**st, "ci_low": max(-1.0 if signed else 0.0, st["ci_low"]), "ci_high": min(1.0, st["ci_high"])}
        rows.append(_row(feature_set, aam_version, sc.task, m, st, sc.chance.get(m), split, created_at))
    if ref is None:
        return rows
    n_seeds = min(ref.n_seeds, sc.n_seeds)
    same = ref.same_outputs and sc.same_outputs
    for m, fn in sc.metrics.items():
        if m not in ref.metrics or m in sc.seed_only:
            continue
        d = stats.paired(ref.metrics[m], fn, n_seeds, sc.n_test, sc.n_boot, same=same, clusters=clusters)
        rows.append(_row(feature_set, aam_version, sc.task, f"delta_{m}", d, None, split, created_at))
    chance_of = ref.chance
    if sc.task in ("privacy", "clip_privacy", "reid"):
        # the share of above-chance leakage removed: the strongest attacker's, and each attacker's for the record
        base = "rank1" if sc.task == "reid" else "cmap"
        out = "linkage_removed" if sc.task == "reid" else "leakage_removed"
        # the headline: the attacker strongest on THIS table, paired with the same attacker on the reference
        judge = f"{base}[{sc.details.get('strongest')}]"

        def removed(m, ref_fn, name):
            r = _ratio(ref_fn, sc.metrics[m], n_seeds, sc.n_test, chance_of[m], same, sc.n_boot, clusters)
            lr = {**r, "value": 1 - r["value"], "ci_low": 1 - r["ci_high"], "ci_high": 1 - r["ci_low"]}
            rows.append(_row(feature_set, aam_version, sc.task, name, lr, None, split, created_at))
        for m in [base] + [m for m in sc.metrics if m.startswith(f"{base}[") and m in ref.metrics]:
            removed(m, ref.metrics[judge] if m == base and judge in ref.metrics else ref.metrics[m],
                    out + m[len(base):])
        for m in [m for m in sc.metrics if m.startswith("ap[") and m in ref.metrics]:  # each attribute's share
            removed(m, ref.metrics[m], f"removed_{m}")
    elif sc.task in UTILITY:
        # the headline is raw's strongest reader on both sides (score_sets bound it); each reader for the record
        base = UTILITY[sc.task]
        for m in [base] + [m for m in sc.metrics if m.startswith(f"{base}[") and m in ref.metrics]:
            r = _ratio(ref.metrics[m], sc.metrics[m], n_seeds, sc.n_test, chance_of[m], same, sc.n_boot, clusters)
            if m != base and not np.isfinite([r["value"], r["ci_low"], r["ci_high"]]).all():
                continue  # a reader that reads raw at chance keeps no share of anything: no row, not a NaN
            rows.append(_row(feature_set, aam_version, sc.task, f"retention_{m}", r, None, split, created_at))
    return rows


def _ratio(ref_fn, fn, n_seeds, n_test, chance, same=False, n_boot=stats.N_BOOT, clusters=None) -> dict:
    """(set − chance) / (ref − chance): the value is the ratio of the seed means (what the table shows), the
    interval's half-width that of the paired per-seed, per-resample ratio. The chance stays the scored videos' (it
    is not resampled: tests/test_interval_coverage.py measured 90% coverage when it was, 95-97% as it is)."""
    r = stats.ratio_interval(ref_fn, fn, n_seeds, n_test, offset=chance, n_boot=n_boot, same=same, clusters=clusters)
    a = np.mean([ref_fn(s, None) for s in range(n_seeds)]) - chance
    b = np.mean([fn(s, None) for s in range(n_seeds)]) - chance
    value = float(b / a) if a > 0 else float("nan")
    return {**r, "value": value, "ci_low": value - (r["value"] - r["ci_low"]), "ci_high": value + (r["ci_high"] - r["value"])}


# Scores in this process, by content (score_cache.key: task, split, seeds, probe settings, the attributes judged, and
# the videos' ids, splits, labels, clip times and feature bytes). A protocol is seeded, so the same inputs give the
# same Scored: the gates, the evaluation, its unseen-task rows and the curve of one run (`splavu demo`, `splavu
# evaluate`) score each such measurement once, whatever feature set it is called (raw, or a same-width PCA fitted on
# the same clips in the main table and again in the leave-one-task-out rows). Any changed byte, label, seed or
# setting is another key.
# Bounded: the oldest entry goes first.
_SCORES: dict = {}
_SCORES_MAX = 128


# What this process measured and what it took from a cache (a reference_cache, a gates' Scored, or _SCORES): the
# demo's cost section says, per stage, how many measurements were scored and how many reused.
MEASUREMENTS = {"scored": 0, "reused": 0}


def measurement_counts() -> dict[str, int]:
    return {**MEASUREMENTS, "read_back": score_cache.COUNTS["hit"]}


def _remember(key: str, value) -> None:
    _SCORES.pop(key, None)
    while len(_SCORES) >= _SCORES_MAX:
        _SCORES.pop(next(iter(_SCORES)))
    _SCORES[key] = value


class EvalResult(list):
    """Metric rows (a list), plus skipped tasks and each task's Scored per feature set."""

    def __init__(self, rows=(), skipped=None, scored=None):
        super().__init__(rows)
        self.skipped = skipped or {}
        self.scored = scored or {}


def score_sets(sets: Mapping[str, Mapping[str, Sequence[VideoFeatures]]], which: Sequence[str],
               datasets: Mapping[str, str], split: str = "test", seeds: Sequence[int] = P.seeds_from(),
               probe_kwargs: Mapping[str, dict] | None = None, reference: str = "raw",
               versions: Mapping[str, str | None] | None = None, created_at=None,
               log: Callable[[str], None] | None = None, reference_cache: dict | None = None,
               scored: Mapping[str, Mapping[str, P.Scored]] | None = None, store=None) -> EvalResult:
    """Score every feature set in `sets` (name -> dataset -> videos) on the tasks `which`, with intervals.
    The reference set (default 'raw') is scored first; the others get paired changes against it.
    datasets: task -> dataset name. versions: feature set -> aam_version (None for raw/baselines).
    reference_cache: task -> the reference's (Scored, attributes), filled here and reused when present: the
    caller keys it by the reference's videos, seeds and probe settings (the ablations score raw once).
    scored: name -> task -> a Scored of that set's videos with these seeds and settings, used instead of running the
    task (with a reference_cache holding the raw it was paired with).
    store: the readers' and attackers' outputs are kept in (and taken from) its score cache (score_cache.py)."""
    with score_cache.kept_in(store):
        return _score_sets(sets, which, datasets, split, seeds, probe_kwargs, reference, versions, created_at, log,
                           reference_cache, scored)


def _score_sets(sets, which, datasets, split, seeds, probe_kwargs, reference, versions, created_at, log,
                reference_cache, scored) -> EvalResult:
    probe_kwargs = dict(probe_kwargs or {})
    versions = dict(versions or {})
    created_at = created_at or _now()
    names = [reference] + [n for n in sets if n != reference] if reference in sets else list(sets)
    out = EvalResult()
    for task in which:
        ds = datasets[task]
        kw = probe_kwargs.get(task) or (probe_kwargs.get("privacy") if task == "clip_privacy" else None) or \
            (probe_kwargs.get("bias") if task.startswith("bias") else None) or {}
        ref_sc, attrs = None, None
        for name in names:
            videos = list((sets[name] or {}).get(ds) or [])
            if not videos:
                out.skipped[f"{name}:{task}" if name != reference else task] = f"dataset {ds!r} is not in the store"
                continue
            cached = reference_cache.get(task) if reference_cache is not None and name == reference else None
            if task in (scored or {}).get(name, {}):
                cached = (scored[name][task], None)
            key = score_cache.key("scored", task, split, list(seeds), dict(kw), attrs, videos) \
                if cached is None else None
            if key is not None and key in _SCORES:
                cached = _SCORES[key]
            MEASUREMENTS["reused" if cached is not None else "scored"] += 1
            sc, why = cached if cached is not None else run_task(task, videos, split, seeds, kw, attrs)
            if key is not None:
                _remember(key, (sc, why))
            if name == reference and reference_cache is not None and cached is None:
                reference_cache[task] = (sc, why)
            if sc is None:
                out.skipped[f"{name}:{task}" if name != reference else task] = f"dataset {ds!r}: {why}"
                if log:
                    log(f"{name}: skipping {task}: {why}")
                continue
            if name == reference:
                ref_sc = sc
                attrs = sc.details.get("attributes")
            elif ref_sc is not None and "readers" in sc.details:
                sc = R.judged_by(sc, ref_sc.details["strongest"])  # utility: raw's strongest reader judges
            out.scored.setdefault(task, {})[name] = sc
            out.extend(scored_rows(sc, name, versions.get(name), "all" if task == "gait" else split, created_at,
                                   ref=ref_sc if name != reference else None))
    return out


# ---------------------------------------------------------------- the lead's entry point

def apply_features(videos: Sequence[VideoFeatures], features_fn: Callable) -> list[VideoFeatures]:
    """features_fn over every video's clip sequence (T, D) -> (T, D'); the labels stay."""
    return [dataclasses.replace(v, feats=np.ascontiguousarray(np.asarray(features_fn(v.feats), np.float32)),
                                meta=dict(v.meta)) for v in videos]


def score_features(store, features_fn: Callable | None = None, split: str = "val",
                   seeds: Sequence[int] = range(P.N_SEEDS), which: Sequence[str] = ("ar", "tad", "ad", "privacy",
                                                                                      "clip_privacy"),
                   name: str = "candidate", datasets: Mapping[str, str] | None = None,
                   probe_kwargs: Mapping[str, dict] | None = None, features=None, raw=None) -> list[dict]:
    """Score raw latents and features_fn(raw) of a store on `split` ('val': never the report's test split),
    without publishing anything. features_fn maps one video's clip latents (T, D) float32 -> (T, D') (a per-clip
    map applied to a (T, D) array works as is). Or pass `features`: dataset -> videos already transformed, and
    `raw`: dataset -> the raw videos they came from (default: the store's, every video).
    Returns rows (see module doc): raw rows, the candidate's rows and its paired changes vs raw
    (delta_*, retention_*, leakage_removed), each with value, sd, ci_low, ci_high, chance, n_seeds."""
    from splavu_core.evaluation.suite import load_feature_sets
    from splavu_core.ingest.datasets import task_datasets as role_datasets

    ds = role_datasets(store, dict(datasets or {}))
    which = [t for t in which if t in ds]
    raw = load_feature_sets(store, which, "raw", datasets=ds) if raw is None else \
        {d: raw[d] for d in dict.fromkeys(ds[t] for t in which)}
    if features is None:
        assert features_fn is not None, "score_features: pass features_fn or features"
        features = {d: apply_features(v, features_fn) for d, v in raw.items()}
    return list(score_sets({"raw": raw, name: features}, which, ds, split=split, seeds=list(seeds),
                           probe_kwargs=probe_kwargs))
