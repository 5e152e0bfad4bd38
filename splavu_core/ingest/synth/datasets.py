"""The synthetic benchmark: plans every video of every dataset, renders and encodes them.

Planning is cheap and sequential (it fixes every random choice from the seed); rendering and
encoding run in worker processes, each video from its own seeded generator, so the output is the
same whatever the number of workers.
"""
from __future__ import annotations

import csv
import json
import os
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from splavu_core.ingest.masks import mask_path, write_masks
from splavu_core.ingest.synth.figure import ACTIONS, ACTIONS_V2, PRIVATE_ATTRIBUTES, Actor, random_actor
from splavu_core.ingest.synth.render import FPS, random_shot, render

CLIP_LEN = 16
NORMAL_ACTIVITY = ("walk_left", "walk_right", "wave", "clap", "squat", "turn")
ANOMALIES = ("fall", "kick", "punch", "jump")
BIAS_ACTION = "clap"
DATASETS = ("ar", "privacy", "tad", "ad", "bias_f", "bias_m", "gait")
# v1: ten motion-only actions. v2: plus five hand-object interactions that need the person's interior
# (figure.INTERACTIONS); privacy close-ups and gait walks are the same in both. v3 (default): v2 plus, in the bias
# sets only, extra test videos of the shortcut action for each group (SCALES' bias_shortcut), so the per-group gap
# on that action can be measured; every other dataset is v2's, video for video (`changes`, stamp_benchmark).
BENCHMARKS = {"v1": dict(actions=ACTIONS, normal=NORMAL_ACTIVITY),
              "v2": dict(actions=ACTIONS_V2, normal=NORMAL_ACTIVITY + ("drink", "phone", "read"))}
BENCHMARKS["v3"] = dict(BENCHMARKS["v2"], shortcut_test=True, parent="v2", changes=("bias_f", "bias_m"))
# v4 (default): v3 plus the holdouts each scored dataset has of its own (SCALES' `holdouts`): a selection split, which
# only the publish rule scores, and more validation videos and people, so the gates' intervals can decide (the
# close-up part to about +-0.05, AR retention a 5% loss); planned after every other video of the dataset from a
# generator of their own, so every video before them (the AAM's training set among them) is v3's
BENCHMARKS["v4"] = dict(BENCHMARKS["v3"], holdout_sets=True, parent="v3", changes=("ar", "privacy", "tad", "ad"))
DEFAULT_BENCHMARK = "v4"
HOLDOUT_KEYS = {"select": 0, "val": 1}  # each holdout's generator: [seed, dataset, 4, key]
STAMP = "benchmark.json"

# per scale: videos per split (AR: per action), and actor pools. holdouts (v4): dataset -> split -> (videos, people)
# (privacy: videos, each a person of its own); at tiny scale none, so the holdouts are carved from train there
SCALES = {
    "tiny": dict(ar=(3, 1, 2), ar_actors=(12, 4, 8), privacy=(48, 32), tad=(6, 2, 4), ad=(6, 6),
                 bias=(3, 2), bias_shortcut=4, gait=(4, 2), tad_frames=(96, 128), ad_frames=(128, 160)),
    # ar_extra / tad_extra / ad_extra: evaluation-only (val, test) videos added after the rest (_evaluation_extra),
    # sized so a 10% loss of AR or TAD utility shows beyond the noise of its retention interval (docs/benchmark.md).
    # bias_shortcut (v3): extra test videos of the shortcut action per group, so its per-group gap is ~+-0.1 wide
    "demo": dict(ar=(40, 10, 20), ar_actors=(80, 20, 40), privacy=(600, 300), tad=(80, 20, 40), ad=(80, 40),
                 bias=(30, 20), bias_shortcut=150, gait=(24, 4), tad_frames=(160, 224), ad_frames=(256, 384),
                 ar_extra=(300, 75), tad_extra=(100, 130), ad_extra=(40, 40),
                 holdouts={"privacy": {"select": 600, "val": 600}, "ar": {"select": (900, 150), "val": (1550, 200)},
                           "tad": {"select": (60, 20)}, "ad": {"select": (40, 10)}}),
    "large": dict(ar=(120, 30, 60), ar_actors=(240, 60, 120), privacy=(1800, 900), tad=(240, 60, 120),
                  ad=(240, 120), bias=(90, 60), bias_shortcut=450, gait=(72, 4), tad_frames=(160, 224),
                  ad_frames=(256, 384),
                  holdouts={"privacy": {"select": 1800, "val": 1800}, "ar": {"select": (2700, 450), "val": (4650, 600)},
                            "tad": {"select": (180, 60)}, "ad": {"select": (120, 30)}}),
}


@dataclass
class VideoPlan:
    dataset: str
    video_id: str
    split: str
    actor: Actor
    timeline: list            # [(action, start_frame, end_frame)]
    n_frames: int
    key: tuple                # seeds this video's own generator
    closeup: bool = False
    static: bool = False
    row: dict = field(default_factory=dict)

    @property
    def path(self) -> str:
        return f"videos/{self.video_id}.mp4"


def plan(scale: str, seed: int, benchmark: str = DEFAULT_BENCHMARK) -> dict[str, list[VideoPlan]]:
    """Every video of every dataset, with labels; deterministic in (scale, seed, benchmark)."""
    if scale not in SCALES:
        raise ValueError(f"unknown scale {scale!r}; choose one of {sorted(SCALES)}")
    if benchmark not in BENCHMARKS:
        raise ValueError(f"unknown benchmark {benchmark!r}; choose one of {sorted(BENCHMARKS)}")
    cfg = {**SCALES[scale], **BENCHMARKS[benchmark]}
    out = {}
    for code, name in enumerate(DATASETS):
        rng = np.random.default_rng([seed, code, 0])
        out[name] = {"ar": _plan_ar, "privacy": _plan_privacy, "tad": _plan_tad, "ad": _plan_ad,
                     "bias_f": _plan_bias, "bias_m": _plan_bias, "gait": _plan_gait}[name](name, cfg, rng, (seed, code))
    return out


def _key(base, i):
    return (*base, 1, i)


def _attrs(actor: Actor) -> dict[str, int]:
    """attr_* columns: the actor's private attributes, for evaluation only (training never reads them)."""
    return {f"attr_{k}": v for k, v in actor.attributes().items()}


def _subject(dataset: str, pool: str, index: int) -> str:
    """Who a TAD / AD video shows: one actor of a split's pool plays in several videos, so the bootstrap resamples
    the actor, not the video (its videos are not independent draws). The same draws as before: bytes unchanged.
    Hyphens: no AR subject id ("train_003") is a substring of it, which a byte scan for a forgotten id would match."""
    return f"{dataset}-{pool}-{index:03d}"


def _actor_pools(rng, sizes):
    return {s: [random_actor(rng) for _ in range(n)] for s, n in zip(("train", "val", "test"), sizes)}


def _plan_ar(name, cfg, rng, base):
    pools, plans = _actor_pools(rng, cfg["ar_actors"]), []

    def one(rng, split, pool, i, action, subject):
        a = int(rng.integers(len(pool)))
        n = CLIP_LEN * int(rng.integers(2, 4))
        return VideoPlan(name, f"{name}_{i:05d}", split, pool[a], [(action, 0, n)], n, _key(base, i),
                         row={"action": action, "subject_id": f"{subject}_{a:03d}", **_attrs(pool[a])})

    for split, per_action in zip(("train", "val", "test"), cfg["ar"]):
        for action in cfg["actions"]:
            for _ in range(per_action):
                plans.append(one(rng, split, pools[split], len(plans), action, split))
    actions = cfg["actions"]  # extras: actions in turn, so each split stays balanced

    def extra(rng, split, pool, i, j, who):
        return one(rng, split, pool, i, actions[j % len(actions)], who)
    return _holdouts("ar", cfg, base, _evaluation_extra("ar", cfg, base, plans, extra, pools=(20, 20)), extra)


def _plan_privacy(name, cfg, rng, base):
    plans = []

    def one(rng, split):  # a close-up of a new person
        i = len(plans)
        actor = random_actor(rng)
        pose_action = ("wave", "clap", "punch", "walk_left")[int(rng.integers(4))]
        plans.append(VideoPlan(name, f"{name}_{i:05d}", split, actor, [(pose_action, 0, CLIP_LEN)], CLIP_LEN,
                               _key(base, i), closeup=True, static=True, row=_attrs(actor)))

    for split, n in zip(("train", "test"), cfg["privacy"]):
        for _ in range(n):
            one(rng, split)
    if cfg.get("holdout_sets"):  # v4: each from a generator of its own, after the rest (whose bytes stay v3's)
        for split, n in cfg.get("holdouts", {}).get(name, {}).items():
            extra = np.random.default_rng([*base, 4, HOLDOUT_KEYS[split]])
            for _ in range(n):
                one(extra, split)
    return plans


def _timeline(rng, n_frames, n_segments, vocabulary, min_len, max_len):
    """Non-overlapping action segments separated by idle time."""
    for _ in range(100):
        lens = rng.integers(min_len, max_len + 1, n_segments)
        slack = n_frames - lens.sum() - 8 * (n_segments + 1)
        if slack >= 0:
            break
        n_segments = max(1, n_segments - 1)
    gaps = rng.multinomial(int(slack), np.ones(n_segments + 1) / (n_segments + 1)) + 8
    t, timeline = int(gaps[0]), []
    for k in range(n_segments):
        action = vocabulary[int(rng.integers(len(vocabulary)))]
        timeline.append((action, t, t + int(lens[k])))
        t += int(lens[k]) + int(gaps[k + 1])
    return timeline


def _evaluation_extra(name, cfg, base, plans, plan_one, pools=(10, 20)):
    """The scale's extra evaluation videos (`<name>_extra`: (val, test) counts), planned AFTER every other video of
    the dataset from a generator of their own, with actors of their own (pool "<split>x", passed to plan_one as
    `who`): the videos planned before (and so the AAM's training set) are the same with or without them.
    Evaluation-only: no static clips are encoded."""
    n_val, n_test = cfg.get(f"{name}_extra", (0, 0))
    rng = np.random.default_rng([*base, 2])
    extra = dict(zip(("val", "test"), (([random_actor(rng) for _ in range(n)]) for n in pools)))
    for split, n in (("val", n_val), ("test", n_test)):
        for j in range(n):
            plans.append(plan_one(rng, split, extra[split], len(plans), j, f"{split}x"))
    return plans


def _holdouts(name, cfg, base, plans, plan_one):
    """v4: the dataset's holdouts (SCALES' holdouts[name]: split -> (videos, people)), planned AFTER every other
    video of the dataset, each split from a generator of its own, with people of its own (pool "<split>h", passed to
    plan_one as `who`): the videos planned before are the same with or without them, and the selection split (planned
    first) does not move when validation grows. Evaluation-only: no static clips."""
    if not cfg.get("holdout_sets"):
        return plans
    for split, (n, people) in cfg.get("holdouts", {}).get(name, {}).items():
        rng = np.random.default_rng([*base, 4, HOLDOUT_KEYS[split]])
        pool = [random_actor(rng) for _ in range(people)]
        for j in range(n):
            plans.append(plan_one(rng, split, pool, len(plans), j, f"{split}h"))
    return plans


def _plan_tad(name, cfg, rng, base):
    pools, plans = _actor_pools(rng, (40, 10, 20)), []
    lo, hi = cfg["tad_frames"]

    def one(rng, split, pool, i, _j, who=None):
        n_frames = int(rng.integers(lo // CLIP_LEN, hi // CLIP_LEN + 1)) * CLIP_LEN
        timeline = _timeline(rng, n_frames, int(rng.integers(1, 5)), cfg["actions"], 24, 56)
        segs = [[round(a / FPS, 4), round(b / FPS, 4), act] for act, a, b in timeline]
        a = int(rng.integers(len(pool)))
        return VideoPlan(name, f"{name}_{i:05d}", split, pool[a], timeline, n_frames, _key(base, i),
                         row={"segments": json.dumps(segs), "subject_id": _subject(name, who or split, a),
                              **_attrs(pool[a])})

    for split, n in zip(("train", "val", "test"), cfg["tad"]):
        for j in range(n):
            plans.append(one(rng, split, pools[split], len(plans), j))
    return _holdouts("tad", cfg, base, _evaluation_extra("tad", cfg, base, plans, one), one)


def _plan_ad(name, cfg, rng, base):
    pools, plans = _actor_pools(rng, (40, 1, 20)), []
    lo, hi = cfg["ad_frames"]

    def one(rng, split, pool, i, j, who=None):
        n_frames = int(rng.integers(lo // CLIP_LEN, hi // CLIP_LEN + 1)) * CLIP_LEN
        timeline = _timeline(rng, n_frames, int(rng.integers(2, 6)), cfg["normal"], 24, 64)
        anomalous = j % 2 == 1
        intervals = []
        if anomalous:  # replace one or two normal segments by anomalies
            for k in rng.choice(len(timeline), size=min(len(timeline), int(rng.integers(1, 3))), replace=False):
                _, a, b = timeline[k]
                timeline[k] = (ANOMALIES[int(rng.integers(len(ANOMALIES)))], a, b)
                intervals.append([round(a / FPS, 4), round(b / FPS, 4)])
        a = int(rng.integers(len(pool)))
        return VideoPlan(name, f"{name}_{i:05d}", split, pool[a], timeline, n_frames, _key(base, i),
                         row={"anomaly": int(anomalous), "anomaly_intervals": json.dumps(sorted(intervals)),
                              "subject_id": _subject(name, who or split, a), **_attrs(pool[a])})

    for split, n in zip(("train", "test"), cfg["ad"]):
        for j in range(n):
            plans.append(one(rng, split, pools[split], len(plans), j))
    return _holdouts("ad", cfg, base, _evaluation_extra("ad", cfg, base, plans, one), one)


def stamp_benchmark(benchmark: str, dataset: str) -> str:
    """The benchmark that first defined this dataset's videos (a v3 folder of `ar` is v2's, byte for byte)."""
    b = BENCHMARKS[benchmark]
    if b.get("parent") and dataset not in b["changes"]:
        return stamp_benchmark(b["parent"], dataset)
    return benchmark


def _plan_bias(name, cfg, rng, base):
    """Train: BIAS_ACTION 95% by one group, every other action 95% by the other; test balanced. v3 adds
    `bias_shortcut` test videos of BIAS_ACTION per group after the rest, from a generator of their own (the videos
    before are v2's): the shortcut shows as a per-group gap on that action (protocols.bias, shortcut_gap)."""
    favoured_female = name == "bias_f"
    plans = []

    def one(split, action, female, gen):  # one short video of one action by a new person of the group
        i = len(plans)
        actor = random_actor(gen, female=female)
        plans.append(VideoPlan(name, f"{name}_{i:05d}", split, actor, [(action, 0, 2 * CLIP_LEN)], 2 * CLIP_LEN,
                               _key(base, i), row={"action": action, "group": "f" if female else "m",
                                                   "subject_id": f"{name}_{i:05d}", **_attrs(actor)}))

    for split, per_action in zip(("train", "test"), cfg["bias"]):
        for action in cfg["actions"]:
            for k in range(per_action):
                if split == "test":
                    female = k % 2 == 0
                else:
                    majority = favoured_female if action == BIAS_ACTION else not favoured_female
                    female = majority if rng.random() < 0.95 else not majority
                one(split, action, female, rng)
    if cfg.get("shortcut_test"):
        extra = np.random.default_rng([*base, 3])
        for k in range(2 * cfg["bias_shortcut"]):
            one("test", BIAS_ACTION, k % 2 == 0, extra)
    return plans


def _plan_gait(name, cfg, rng, base):
    """Several walks per subject; clothes, hat and scene change between walks, body and gait do not."""
    n_subjects, walks = cfg["gait"]
    plans = []
    for s in range(n_subjects):
        person = random_actor(rng)
        for w in range(walks):
            i = len(plans)
            actor = random_actor(rng, skin=person.skin, female=person.female, hair=person.hair,
                                 stride_hz=person.stride_hz, arm_swing=person.arm_swing, bounce=person.bounce,
                                 face_visible=person.face_visible)
            action = ("walk_left", "walk_right")[int(rng.integers(2))]
            plans.append(VideoPlan(name, f"{name}_{i:05d}", "test", actor, [(action, 0, 2 * CLIP_LEN)], 2 * CLIP_LEN,
                                   _key(base, i), row={"action": action, "subject_id": f"subject_{s:03d}", **_attrs(actor)}))
    return plans


def render_plan(p: VideoPlan, with_masks: bool = False):
    """(T, H, W, 3) uint8 frames of a planned video (and its (T, H, W) bool person masks)."""
    rng = np.random.default_rng(p.key)
    shot = random_shot(rng, closeup=p.closeup)
    return render(p.actor, p.timeline, p.n_frames, rng, shot=shot, static_frame=0 if p.static else None,
                  with_masks=with_masks)


def _missing(p: VideoPlan, root: Path, masks: bool = True) -> bool:
    return not (root / p.path).exists() or (masks and not mask_path(root / p.path).exists())


def _write_one(args):
    """Video and (masks=True) its true person masks (<stem>.mask.npz, the pixel baselines' person region).
    The video's bytes do not depend on whether masks are drawn (the silhouette is drawn beside the frame)."""
    p, root, masks = args
    from splavu_core.ingest.video import write_mp4

    frames, person = render_plan(p, with_masks=True) if masks else (render_plan(p), None)
    if not (root / p.path).exists():
        write_mp4(root / p.path, frames, FPS)
    if masks:
        write_masks(mask_path(root / p.path), person)
    return p.video_id


MANIFEST_COLUMNS = ("video_id", "path", "split", "action", "segments", "anomaly", "anomaly_intervals",
                    "subject_id", "group") + tuple(f"attr_{a}" for a in PRIVATE_ATTRIBUTES)


def manifest_rows(plans: list[VideoPlan]) -> list[dict]:
    present = {k for p in plans for k in p.row}
    cols = [c for c in MANIFEST_COLUMNS[3:] if c in present]
    return [{"video_id": p.video_id, "path": p.path, "split": p.split, **{c: p.row.get(c, "") for c in cols}}
            for p in plans]


class BenchmarkMismatch(ValueError):
    """A folder already holds another benchmark: keeping its videos would mix two worlds."""


def _check_stamp(root: Path, want: dict) -> None:
    stamp = root / STAMP
    if stamp.exists():
        have = json.loads(stamp.read_text())
        if have != want and not _extends(have, want, root.name):
            raise BenchmarkMismatch(f"{root} holds benchmark {have}, not {want}: its videos would be kept; "
                                    f"write to another folder or remove {root}")
    elif (root / "manifest.csv").exists():
        raise BenchmarkMismatch(f"{root} has videos but no {STAMP} (written before benchmark versions, i.e. v1 "
                                f"at its scale and seed): write to another folder or remove {root}")


def _extends(have: dict, want: dict, dataset: str) -> bool:
    """A folder of the parent benchmark that the wanted one only appends videos to (v2 -> v3 bias sets): kept, and
    the missing videos added (test_synth checks that v3's plans start with v2's)."""
    b = BENCHMARKS[want["benchmark"]]
    return (dataset in b.get("changes", ()) and have.get("benchmark") == stamp_benchmark(b.get("parent"), dataset)
            and {**have, "benchmark": want["benchmark"]} == want)


def generate(out: str | os.PathLike, scale: str = "demo", seed: int = 0, workers: int | None = None,
             datasets=DATASETS, progress=None, benchmark: str = DEFAULT_BENCHMARK,
             masks: bool = True) -> dict[str, dict]:
    """Write each dataset to `out/<name>/` (videos, their person masks, manifest.csv, benchmark.json).
    Returns a summary per dataset. masks=False: videos only (drawing the silhouettes is ~45% of rendering and only
    the pixel baselines' `rendered` masks read them; a later call with masks=True adds the missing ones).

    Existing videos are kept (same benchmark and seed, same bytes); only what is missing is rendered. A
    folder stamped with another benchmark, scale or seed is refused rather than mixed."""
    out = Path(out)
    plans = plan(scale, seed, benchmark)
    want = {name: {"benchmark": stamp_benchmark(benchmark, name), "scale": scale, "seed": seed} for name in datasets}
    for name in datasets:
        _check_stamp(out / name, want[name])
    workers = workers or min(4, os.cpu_count() or 1)
    summary = {}
    jobs = []
    for name in datasets:
        root = out / name
        (root / "videos").mkdir(parents=True, exist_ok=True)
        (root / STAMP).write_text(json.dumps(want[name]) + "\n")
        jobs += [(p, root, masks) for p in plans[name] if _missing(p, root, masks)]
    # longest videos first: the pool's last chunks are then short ones (measured: the demo's long AD videos,
    # planned last, left one worker rendering alone for the final ~90 s); each video has its own generator,
    # so the order changes no byte
    jobs.sort(key=lambda j: -j[0].n_frames)
    if workers > 1 and len(jobs) > 8:
        with ProcessPoolExecutor(workers) as ex:
            done = ex.map(_write_one, jobs, chunksize=4)
            for vid in done:
                if progress:
                    progress(vid)
    else:
        for job in jobs:
            vid = _write_one(job)
            if progress:
                progress(vid)
    for name in datasets:
        rows = manifest_rows(plans[name])
        tmp = out / name / "manifest.csv.part"
        with open(tmp, "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=list(rows[0]), lineterminator="\n")
            w.writeheader()
            w.writerows(rows)
        os.replace(tmp, out / name / "manifest.csv")
        splits = {}
        for p in plans[name]:
            splits[p.split] = splits.get(p.split, 0) + 1
        summary[name] = {"videos": len(rows), "frames": sum(p.n_frames for p in plans[name]),
                         "clips": sum(p.n_frames // CLIP_LEN for p in plans[name]), "splits": splits}
    return summary
