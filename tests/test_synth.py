"""The synthetic benchmark: determinism, real H.264 decoded by decord, dataset contents."""

import numpy as np
import pytest

from splavu_core.manifest import load_manifest
from splavu_core.synth.datasets import CLIP_LEN, DATASETS, BIAS_ACTION, generate, plan, render_plan
from splavu_core.synth.figure import ACTIONS, PRIVATE_ATTRIBUTES
from splavu_core.video import DecordVideo


def test_every_dataset_written_with_valid_manifest(tiny_bench):
    root, summary = tiny_bench
    assert set(summary) == set(DATASETS)
    for name in DATASETS:
        m = load_manifest(root / name / "manifest.csv")  # validates every row and file
        assert len(m.rows) == summary[name]["videos"] > 0


def test_same_seed_gives_identical_bytes_and_frames(tiny_bench, tmp_path):
    root, _ = tiny_bench
    generate(tmp_path, "tiny", seed=0, workers=1, datasets=("ar", "tad"))  # other worker count, same bytes
    for name in ("ar", "tad"):
        assert (tmp_path / name / "manifest.csv").read_bytes() == (root / name / "manifest.csv").read_bytes()
        for vid in ("videos/ar_00000.mp4", "videos/ar_00007.mp4") if name == "ar" else ("videos/tad_00001.mp4",):
            assert (tmp_path / name / vid).read_bytes() == (root / name / vid).read_bytes()
            a, b = DecordVideo(tmp_path / name / vid).all_frames(), DecordVideo(root / name / vid).all_frames()
            assert np.array_equal(a, b)


def test_other_seed_differs(tiny_bench, tmp_path):
    root, _ = tiny_bench
    generate(tmp_path, "tiny", seed=1, workers=1, datasets=("privacy",))
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
    assert {r["action"] for r in ar.rows} == set(ACTIONS)
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
