"""The synthetic benchmark: determinism, real H.264 decoded by decord, dataset contents."""

import json

import numpy as np
import pytest

from splavu_core.ingest.manifest import load_manifest
from splavu_core.ingest.synth.datasets import BIAS_ACTION, CLIP_LEN, DATASETS, generate, plan, render_plan
from splavu_core.ingest.synth.figure import ACTIONS, ACTIONS_V2, PRIVATE_ATTRIBUTES
from splavu_core.ingest.video import DecordVideo


def test_every_dataset_written_with_valid_manifest(tiny_bench):
    root, summary = tiny_bench
    assert set(summary) == set(DATASETS)
    for name in DATASETS:
        m = load_manifest(root / name / "manifest.csv")  # validates every row and file
        assert len(m.rows) == summary[name]["videos"] > 0


def test_same_seed_gives_identical_bytes_and_frames(tiny_bench, tmp_path):
    root, _ = tiny_bench
    generate(tmp_path, "tiny", seed=0, workers=1, datasets=("ar", "tad"), benchmark="v1")  # other worker count
    for name in ("ar", "tad"):
        assert (tmp_path / name / "manifest.csv").read_bytes() == (root / name / "manifest.csv").read_bytes()
        for vid in ("videos/ar_00000.mp4", "videos/ar_00007.mp4") if name == "ar" else ("videos/tad_00001.mp4",):
            assert (tmp_path / name / vid).read_bytes() == (root / name / vid).read_bytes()
            a, b = DecordVideo(tmp_path / name / vid).all_frames(), DecordVideo(root / name / vid).all_frames()
            assert np.array_equal(a, b)


def test_other_seed_differs(tiny_bench, tmp_path):
    root, _ = tiny_bench
    generate(tmp_path, "tiny", seed=1, workers=1, datasets=("privacy",), benchmark="v1")
    assert (tmp_path / "privacy" / "manifest.csv").read_bytes() != (root / "privacy" / "manifest.csv").read_bytes()


def test_decord_round_trip_matches_rendered_frames(tiny_bench):
    root, _ = tiny_bench
    p = plan("tiny", 0)["ar"][3]
    rendered = render_plan(p)
    v = DecordVideo(root / "ar" / p.path)
    assert v.info.n_frames == p.n_frames and (v.info.height, v.info.width) == rendered.shape[1:3]
    assert v.info.fps == pytest.approx(16.0)
    decoded = v.all_frames().astype(np.float64)
    mse = np.mean((decoded - rendered) ** 2)
    psnr = 10 * np.log10(255 ** 2 / mse)
    assert psnr > 27, f"H.264 round trip too lossy: PSNR {psnr:.1f} dB"  # 4:2:0 chroma on sharp edges
    other = render_plan(plan("tiny", 0)["ar"][4])[: len(decoded)]
    assert 10 * np.log10(255 ** 2 / np.mean((decoded[: len(other)] - other) ** 2)) < psnr - 8


def test_labels_are_consistent(tiny_bench):
    root, _ = tiny_bench
    ar = load_manifest(root / "ar" / "manifest.csv")
    assert {r["action"] for r in ar.rows} == set(ACTIONS)  # tiny_bench is v1 (conftest)
    assert all(r["split"] in ("train", "val", "test") for r in ar.rows)
    # AR subjects are disjoint across splits (cross-subject protocol)
    subj = {s: {r["subject_id"] for r in ar.rows if r["split"] == s} for s in ("train", "val", "test")}
    assert not (subj["train"] & subj["test"]) and not (subj["train"] & subj["val"])
    priv = load_manifest(root / "privacy" / "manifest.csv")
    assert set(priv.attributes) == set(PRIVATE_ATTRIBUTES)
    for a in PRIVATE_ATTRIBUTES:  # every attribute takes both values
        assert {r[f"attr_{a}"] for r in priv.rows} == {0, 1}
    tad = load_manifest(root / "tad" / "manifest.csv")
    for r in tad.rows:
        v = DecordVideo(root / "tad" / r["path"])
        assert 1 <= len(r["segments"]) <= 4
        for s, e, label in r["segments"]:
            assert label in ACTIONS and 0 <= s < e <= v.info.n_frames / v.info.fps
    ad = load_manifest(root / "ad" / "manifest.csv")
    assert {r["anomaly"] for r in ad.rows} == {0, 1}
    assert all((r["anomaly"] == 1) == bool(r["anomaly_intervals"]) for r in ad.rows)


def test_bias_splits_are_skewed_then_balanced():
    plans = plan("demo", 0)
    for name, favoured in (("bias_f", "f"), ("bias_m", "m")):
        train = [p for p in plans[name] if p.split == "train"]
        chosen = [p.row["group"] for p in train if p.row["action"] == BIAS_ACTION]
        others = [p.row["group"] for p in train if p.row["action"] != BIAS_ACTION]
        assert np.mean([g == favoured for g in chosen]) > 0.85
        assert np.mean([g != favoured for g in others]) > 0.9
        test = [p.row["group"] for p in plans[name] if p.split == "test"]
        assert test.count("f") == test.count("m")


def test_v3_is_v2_plus_shortcut_test_videos_in_the_bias_sets_only():
    v2, v3 = plan("demo", 0, "v2"), plan("demo", 0, "v3")
    for name in v2:
        assert v3[name][:len(v2[name])] == v2[name], name                      # v2's videos, in order, unchanged
        extra = v3[name][len(v2[name]):]
        if name not in ("bias_f", "bias_m"):
            assert not extra, name
            continue
        assert len(extra) == 300 and {p.split for p in extra} == {"test"}
        assert {p.row["action"] for p in extra} == {BIAS_ACTION}
        groups = [p.row["group"] for p in extra]
        assert groups.count("f") == groups.count("m") == 150
        assert len({p.row["subject_id"] for p in v3[name]}) == len(v3[name])   # one person per video, as in v2
        assert len({p.key for p in v3[name]}) == len(v3[name])


def test_a_v3_run_keeps_the_v2_videos_it_shares(tmp_path):
    """Only the bias sets differ: a v2 folder of gait is v3's (stamped v2); a v2 bias folder is upgraded in place."""
    from splavu_core.ingest.synth.datasets import BenchmarkMismatch

    generate(tmp_path, "tiny", seed=0, workers=1, datasets=("gait",), benchmark="v2")
    before = {p.name: p.stat().st_mtime_ns for p in (tmp_path / "gait" / "videos").iterdir()}
    generate(tmp_path, "tiny", seed=0, workers=1, datasets=("gait",), benchmark="v3")
    assert {p.name: p.stat().st_mtime_ns for p in (tmp_path / "gait" / "videos").iterdir()} == before
    assert json.loads((tmp_path / "gait" / "benchmark.json").read_text())["benchmark"] == "v2"
    # a v2 bias folder is v3's first videos: kept, the shortcut test videos added, the stamp moved on
    generate(tmp_path, "tiny", seed=0, workers=2, datasets=("bias_f",), benchmark="v2", masks=False)
    before = {p.name: p.stat().st_mtime_ns for p in (tmp_path / "bias_f" / "videos").iterdir()}
    generate(tmp_path, "tiny", seed=0, workers=2, datasets=("bias_f",), benchmark="v3", masks=False)
    after = {p.name: p.stat().st_mtime_ns for p in (tmp_path / "bias_f" / "videos").iterdir()}
    assert {k: after[k] for k in before} == before and len(after) == len(before) + 8
    rows = load_manifest(tmp_path / "bias_f" / "manifest.csv").rows
    assert len(rows) == len(after) and [r["action"] for r in rows[-8:]] == [BIAS_ACTION] * 8
    assert json.loads((tmp_path / "bias_f" / "benchmark.json").read_text())["benchmark"] == "v3"
    with pytest.raises(BenchmarkMismatch, match=r"bias_f holds benchmark .*'v3'.*not .*'v2'"):
        generate(tmp_path, "tiny", seed=0, workers=1, datasets=("bias_f",), benchmark="v2")


def test_static_privacy_videos_do_not_move(tiny_bench):
    root, _ = tiny_bench
    frames = DecordVideo(root / "privacy" / "videos/privacy_00000.mp4").all_frames().astype(int)
    assert len(frames) == CLIP_LEN
    still = np.abs(frames - frames[0]).mean(axis=(1, 2, 3)).max()
    moving = DecordVideo(root / "ar" / "videos/ar_00000.mp4").all_frames()[:CLIP_LEN].astype(int)
    assert still < 2.0 < np.abs(moving - moving[0]).mean(axis=(1, 2, 3)).max()  # still: only codec drift


def test_gait_walks_share_body_and_gait_but_not_clothes():
    plans = plan("demo", 0)["gait"]
    by_subject = {}
    for p in plans:
        by_subject.setdefault(p.row["subject_id"], []).append(p.actor)
    for actors in by_subject.values():
        assert len({(a.skin, a.female, a.stride_hz, a.arm_swing) for a in actors}) == 1
    assert any(len({(a.shirt, a.striped, a.scene) for a in actors}) > 1 for actors in by_subject.values())


def test_unknown_scale_is_refused():
    with pytest.raises(ValueError, match="unknown scale"):
        plan("huge", 0)


# ---------------------------------------------------------------- benchmark versions
# Digests taken from the code before benchmark versions existed: v1 must keep its bytes.
V1_FRAMES = {"ar": ("f1dff76b374f52ea", "1ebc42c1087a1bb7"), "privacy": ("61aca763d7476276", "ab82f4309abe18ac"),
             "tad": ("03479158c6782d30", "8ec209c456eb915c"), "ad": ("78fef7a1fcd66139", "880279c5e15c1eab"),
             "bias_f": ("bbfd5ee59b5e6218", "df974343e1d5c236"), "gait": ("76ae4014d5121fcc", "41ead613fb919404")}
V1_MANIFESTS = {"ar": "81ab01d0853b2cca", "tad": "68aea198b5c5d74f", "ad": "33059014382b562a",
                "bias_f": "ccdc80a4deadd604", "gait": "c6a8879e15d8da8f", "privacy": "1f5b8cb4db245351"}


def _sha(b: bytes) -> str:
    import hashlib

    return hashlib.sha256(b).hexdigest()[:16]


def test_v1_still_renders_the_bytes_it_did_before_v2():
    import json

    from splavu_core.ingest.synth.datasets import manifest_rows

    plans = plan("tiny", 0, "v1")
    for name, (frames_sha, masks_sha) in V1_FRAMES.items():
        frames, masks = render_plan(plans[name][1], with_masks=True)
        assert (_sha(frames.tobytes()), _sha(masks.tobytes())) == (frames_sha, masks_sha), name
    for name, sha in V1_MANIFESTS.items():
        rows = manifest_rows(plans[name])
        if name in ("tad", "ad"):  # their subject_id column came later (who is in each video); nothing else moved
            assert all(r.pop("subject_id") for r in rows), name
        assert _sha(json.dumps(rows).encode()) == sha, name


def test_tad_and_ad_videos_name_their_actor_so_intervals_resample_people():
    """TAD and AD draw each video's actor from a small pool per split, so one person plays in several videos: the
    manifest says who (subject_id), and the bootstrap resamples people (protocols.subject_clusters)."""
    from splavu_core.evaluation.protocols import subject_clusters
    from splavu_core.tasks.features import VideoFeatures

    for name in ("tad", "ad"):
        plans = plan("demo", 0)[name]
        by = {}
        for p in plans:
            by.setdefault(p.row["subject_id"], []).append(p)
        assert all(len({id(p.actor) for p in ps}) == 1 for ps in by.values()), name  # one id, one actor
        splits = {s: {p.row["subject_id"] for p in plans if p.split == s} for s in ("train", "val", "test")}
        assert not splits["train"] & (splits["val"] | splits["test"]) and not splits["val"] & splits["test"], name
        test = [p for p in plans if p.split == "test"]
        assert len(splits["test"]) < len(test) / 2, name  # people repeat: resampling videos would overstate n
        videos = [VideoFeatures(p.video_id, "test", np.zeros((1, 2), np.float32), np.zeros(1), np.ones(1), 16,
                                16.0, {"subject_id": p.row["subject_id"]}) for p in test]
        assert len(set(subject_clusters(videos).tolist())) == len(splits["test"]), name


def test_v2_adds_interactions_to_every_action_dataset_and_v4_is_the_default():
    from splavu_core.ingest.synth.datasets import BENCHMARKS, DEFAULT_BENCHMARK
    from splavu_core.ingest.synth.figure import ACTIONS_V2, INTERACTIONS

    assert DEFAULT_BENCHMARK == "v4"
    v1, v2 = plan("tiny", 0, "v1"), plan("tiny", 0, "v2")
    assert {p.row["action"] for p in v2["ar"]} == set(ACTIONS_V2) and {p.row["action"] for p in v1["ar"]} == set(ACTIONS)
    for name in ("ar", "bias_f", "bias_m"):
        assert set(INTERACTIONS) <= {a for p in v2[name] for a, _, _ in p.timeline}
    used = {a for p in v2["tad"] + v2["ad"] for a, _, _ in p.timeline}
    assert used & set(INTERACTIONS) and not ({a for p in v1["tad"] + v1["ad"] for a, _, _ in p.timeline} & set(INTERACTIONS))
    assert set(BENCHMARKS["v2"]["normal"]) & set(INTERACTIONS)  # anomalies stay the v1 ones
    # close-ups and gait walks do not change between versions
    for name in ("privacy", "gait"):
        assert [render_plan(p).tobytes() for p in v1[name][:2]] == [render_plan(p).tobytes() for p in v2[name][:2]]


def test_drink_eat_phone_share_one_motion_and_differ_only_inside_the_person_region():
    from splavu_core.ingest.synth.figure import pose, random_actor
    from splavu_core.ingest.synth.render import render

    actor = random_actor(np.random.default_rng(3))
    t = np.arange(32) / 16
    poses = [pose(a, t, actor, 1.0, 0.4) for a in ("drink", "eat", "phone")]
    assert np.array_equal(poses[0], poses[1]) and np.array_equal(poses[0], poses[2])
    assert np.ptp(poses[0][:, 3]) > 1.0  # the right shoulder really moves (hand up to the face)
    renders = [render(actor, [(a, 0, 32)], 32, np.random.default_rng(9), with_masks=True)
               for a in ("drink", "eat", "phone")]
    (f0, m0) = renders[0]
    for f, m in renders[1:]:
        differ = (f.astype(int) - f0.astype(int)).any(-1)                       # (T, H, W)
        assert differ.any(), "the objects must be visible"
        assert not (differ & ~(m | m0)).any(), "drink/eat/phone may differ only inside the person region"
    # at the face, the object covers part of the person and lies inside the person's box, as in real footage
    from PIL import Image

    from splavu_core.ingest.synth.figure import Prop, draw_actor

    q = poses[0][np.argmax(poses[0][:, 3] < -0.5)]                              # a frame with the hand up

    def draw(prop, bg):
        img = Image.new("RGB", (112, 112), bg)
        draw_actor(img, actor, q, (56, 70), 90.0, prop)
        return np.asarray(img).astype(int)
    mug = Prop("cup", (238, 238, 242))
    body, with_cup = draw(None, (0, 0, 0)).any(-1), draw(mug, (0, 0, 0)).any(-1)   # silhouettes
    cup = (draw(None, (0, 0, 255)) != draw(mug, (0, 0, 255))).any(-1)            # the cup's own pixels
    ys, xs = np.nonzero(body)
    inside_box = cup[ys.min():ys.max() + 1, xs.min():xs.max() + 1].sum()
    assert (cup & body).sum() > 0.3 * cup.sum(), "the cup must cover the person"
    assert inside_box == cup.sum() and (with_cup >= body).all()


def test_a_folder_of_another_benchmark_is_refused_not_mixed(tmp_path):
    from splavu_core.ingest.synth.datasets import BenchmarkMismatch

    generate(tmp_path, "tiny", seed=0, workers=1, datasets=("gait",), benchmark="v1")
    before = sorted(p.name for p in (tmp_path / "gait" / "videos").iterdir())
    with pytest.raises(BenchmarkMismatch, match=r"gait holds benchmark .*'v1'.*not .*'v2'"):
        generate(tmp_path, "tiny", seed=0, workers=1, datasets=("gait",))
    with pytest.raises(BenchmarkMismatch, match="seed"):
        generate(tmp_path, "tiny", seed=1, workers=1, datasets=("gait",), benchmark="v1")
    assert sorted(p.name for p in (tmp_path / "gait" / "videos").iterdir()) == before
    (tmp_path / "gait" / "benchmark.json").unlink()  # a folder written before versions existed
    with pytest.raises(BenchmarkMismatch, match="no benchmark.json"):
        generate(tmp_path, "tiny", seed=0, workers=1, datasets=("gait",), benchmark="v1")


def test_v2_same_seed_gives_identical_bytes_whatever_the_workers(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    generate(a, "tiny", seed=0, workers=1, datasets=("ar",))
    generate(b, "tiny", seed=0, workers=2, datasets=("ar",))
    files = sorted(p.relative_to(a) for p in a.rglob("*") if p.is_file())
    assert len(files) == 2 * 90 + 2  # videos + masks, manifest, benchmark.json
    assert files == sorted(p.relative_to(b) for p in b.rglob("*") if p.is_file())
    assert all((a / f).read_bytes() == (b / f).read_bytes() for f in files)


def test_videos_without_masks_have_the_same_bytes_and_masks_come_later(tiny_bench, tmp_path):
    """`make demo` renders videos only (the masks are ~45% of rendering, read only by pixel baselines with rendered
    masks): the same bytes as with masks, and a later call with masks adds the masks without touching the videos."""
    from splavu_core.ingest.masks import mask_path, read_masks

    root, _ = tiny_bench
    generate(tmp_path, "tiny", seed=0, workers=1, datasets=("tad",), masks=False, benchmark="v1")
    vid = "videos/tad_00001.mp4"
    assert (tmp_path / "tad" / vid).read_bytes() == (root / "tad" / vid).read_bytes()
    assert (tmp_path / "tad" / "manifest.csv").read_bytes() == (root / "tad" / "manifest.csv").read_bytes()
    assert not mask_path(tmp_path / "tad" / vid).exists()
    mtime = (tmp_path / "tad" / vid).stat().st_mtime_ns
    generate(tmp_path, "tiny", seed=0, workers=1, datasets=("tad",), benchmark="v1")
    assert (tmp_path / "tad" / vid).stat().st_mtime_ns == mtime
    assert np.array_equal(read_masks(mask_path(tmp_path / "tad" / vid)), read_masks(mask_path(root / "tad" / vid)))


def test_evaluation_extras_leave_the_planned_videos_and_training_set_alone(monkeypatch):
    """The demo's evaluation-only videos (ar/tad/ad_extra) come after every other video of their dataset, from a
    generator and actors of their own: without them the same videos are planned, so the AAM's training set and its
    fit do not change when the evaluation sets grow."""
    from splavu_core.ingest.synth import datasets

    with_extra = plan("demo", 0, "v3")
    bare = {k: v for k, v in datasets.SCALES["demo"].items() if not k.endswith("_extra")}
    monkeypatch.setitem(datasets.SCALES, "demo", bare)
    without = plan("demo", 0, "v3")
    for name in ("ar", "tad", "ad"):
        n = len(without[name])
        assert len(with_extra[name]) > n
        assert [(p.video_id, p.split, p.n_frames, p.timeline, p.row) for p in with_extra[name][:n]] == \
               [(p.video_id, p.split, p.n_frames, p.timeline, p.row) for p in without[name]]
        extra = with_extra[name][n:]
        assert {p.split for p in extra} == {"val", "test"} and not any(p.static for p in extra)
    ar_extra = with_extra["ar"][len(without["ar"]):]
    counts = {(p.split, p.row["action"]) for p in ar_extra}
    for split in ("val", "test"):  # each action in turn: the grown splits stay balanced
        per_action = [sum(p.split == split and p.row["action"] == a for p in ar_extra) for a in ACTIONS]
        assert max(per_action) - min(per_action) <= 1 and (split, ACTIONS[0]) in counts
    old_subjects = {p.row["subject_id"] for p in without["ar"]}
    assert not old_subjects & {p.row["subject_id"] for p in ar_extra}  # new people, never train actors


def test_v4_is_v3_plus_holdouts_of_their_own_people():
    """v4 adds to ar, privacy, tad and ad the validation and selection videos the gates and the publish rule read
    (SCALES' holdouts), after every v3 video and from generators of their own: v3's videos (the AAM's training set
    among them) are unchanged, and the holdouts' people are nobody else's."""
    from splavu_core.ingest.synth.datasets import SCALES

    v3, v4 = plan("demo", 0, "v3"), plan("demo", 0, "v4")
    for name in v3:
        assert v4[name][:len(v3[name])] == v3[name], name
        added = v4[name][len(v3[name]):]
        want = SCALES["demo"]["holdouts"].get(name, {})
        assert {p.split for p in added} == set(want), name
        for split, spec in want.items():
            videos, people = (spec, spec) if name == "privacy" else spec
            mine = [p for p in added if p.split == split]
            assert len(mine) == videos
            if name != "privacy":  # (a close-up is a still frame of its own: static)
                assert not any(p.static for p in mine)
                assert len({p.row["subject_id"] for p in mine}) <= people
                others = {p.row["subject_id"] for p in v4[name] if p not in mine}
                assert not {p.row["subject_id"] for p in mine} & others, (name, split)
    # a v3 folder of a changed dataset is kept and extended (its first videos are v4's), the others stay v3's
    assert len({p.key for p in v4["privacy"]}) == len(v4["privacy"])


def test_a_v4_run_extends_a_v3_folder_in_place(tmp_path):
    import json

    from splavu_core.ingest.synth import datasets

    datasets.generate(tmp_path, "tiny", seed=0, workers=1, datasets=("ad",), benchmark="v3", masks=False)
    before = {p.name: p.stat().st_mtime_ns for p in (tmp_path / "ad" / "videos").iterdir()}
    datasets.generate(tmp_path, "tiny", seed=0, workers=1, datasets=("ad",), benchmark="v4", masks=False)
    assert json.loads((tmp_path / "ad" / "benchmark.json").read_text())["benchmark"] == "v4"
    after = {p.name: p.stat().st_mtime_ns for p in (tmp_path / "ad" / "videos").iterdir()}
    assert {k: after[k] for k in before} == before  # nothing rendered again
