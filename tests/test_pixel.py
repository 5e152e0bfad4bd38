"""Pixel-space baselines: each transform on hand-made frames, the person masks (rendered and HOG on a real
video), and the variant store that never touches the raw one."""
import dataclasses
import hashlib
import shutil
from pathlib import Path

import numpy as np
import pytest

from splavu_core.extract.pixel import (
    BASELINES,
    HogPeopleDetector,
    PixelAnonymizer,
    PixelError,
    PixelTransform,
    RenderedMasks,
    read_masks,
)
from splavu_core.ingest.masks import mask_path
from splavu_core.store.feature_store import FeatureStore, StoreError

VTEST = Path(__file__).parent / "data" / "vtest_people.mp4"


def _frames(n=2, h=16, w=16, seed=0):
    return np.random.default_rng(seed).integers(1, 256, (n, h, w, 3), dtype=np.uint8)


# ---------------------------------------------------------------- transforms on hand-made frames

def test_blacken_sets_exactly_the_person_pixels_to_black():
    frames = _frames()
    masks = np.zeros(frames.shape[:3], bool)
    masks[:, 4:8, 5:9] = True
    out = PixelTransform("blacken", dilate=0)(frames, masks)
    assert (out[masks] == 0).all() and (out[~masks] == frames[~masks]).all()
    assert frames.min() > 0  # the input had no black pixel to begin with


def test_mask_is_grown_to_cover_the_person_edges():
    frames = _frames(1, 20, 20)
    masks = np.zeros((1, 20, 20), bool)
    masks[0, 10, 10] = True
    out = PixelTransform("blacken", dilate=0.1)(frames, masks)  # 0.1 x 20 px = 2 px each side
    black = (out[0] == 0).all(-1)
    assert black[8:13, 8:13].all() and black.sum() == 25


def test_blur_smooths_the_person_region_and_nothing_else():
    frames = _frames(1, 64, 64)
    masks = np.zeros((1, 64, 64), bool)
    masks[0, 16:48, 16:48] = True
    out = PixelTransform("blur", sigma=0.05, dilate=0)(frames, masks)
    assert (out[~masks] == frames[~masks]).all()
    inner = (slice(None), slice(24, 40), slice(24, 40))
    assert out[inner].std() < 0.25 * frames[inner].std()  # sigma 3.2 px averages the noise away
    flat = np.full((1, 32, 32, 3), 77, np.uint8)  # a constant image stays constant: the kernel sums to 1
    assert (PixelTransform("blur", sigma=0.1)(flat, np.ones((1, 32, 32), bool)) == 77).all()


def test_downsampling_removes_detail_finer_than_its_factor():
    def stripes(period):
        col = (np.arange(32) // (period // 2)) % 2 * 255
        return np.broadcast_to(col[None, None, :, None], (1, 32, 32, 3)).astype(np.uint8).copy()

    down2, down4 = BASELINES["down2"], BASELINES["down4"]
    assert down2(stripes(2)).std() < 1                  # 1-px stripes: gone at 2x
    assert down2(stripes(4)).std() > 50                 # 2-px stripes survive 2x ...
    assert down4(stripes(4)).std() < 1                  # ... but not 4x
    flat = np.full((1, 32, 32, 3), 200, np.uint8)
    assert (down4(flat) == 200).all() and down4(flat).shape == flat.shape


def test_region_baselines_refuse_to_run_without_masks(tmp_path):
    with pytest.raises(PixelError, match="mask_source"):
        PixelAnonymizer.named("blur", "none")
    assert PixelAnonymizer.named("down2").masks is None  # whole-frame baselines need none
    with pytest.raises(PixelError, match="unknown pixel baseline"):
        PixelAnonymizer.named("pixelate")
    video = tmp_path / "clip_007.mp4"
    with pytest.raises(PixelError, match=r"clip_007\.mask\.npz"):
        RenderedMasks()(video, np.arange(4), np.zeros((4, 8, 8, 3), np.uint8))


def test_provenance_suffixes_the_fingerprint_per_transform():
    prov = {"encoder_fingerprint": "videomae-0123456789abcdef", "dim": 32}
    a = PixelAnonymizer.named("down2").provenance(prov)
    b = PixelAnonymizer.named("down4").provenance(prov)
    assert a["encoder_fingerprint"].startswith("videomae-0123456789abcdef+pixel_down2-")
    assert a["encoder_fingerprint"] != b["encoder_fingerprint"] and a["base_encoder_fingerprint"] == prov["encoder_fingerprint"]
    assert a["pixel_baseline"]["transform"] == {"kind": "downsample", "sigma": 0.0, "factor": 2, "dilate": 0.02}


# ---------------------------------------------------------------- person masks

def test_rendered_masks_are_exactly_where_the_actor_is(tiny_bench):
    from splavu_core.ingest.synth.datasets import plan, render_plan
    from splavu_core.ingest.synth.figure import COOL_COLOURS, HAIR_COLOURS, SKIN_TONES

    bench, _ = tiny_bench
    p = plan("tiny", 0)["ar"][0]
    frames, masks = render_plan(p, with_masks=True)
    assert masks.shape == frames.shape[:3] and 0.02 < masks.mean() < 0.5
    # the same video with another-looking actor differs only inside the mask
    other = dataclasses.replace(p.actor, skin=(p.actor.skin + 2) % 4, hair=HAIR_COLOURS[(HAIR_COLOURS.index(p.actor.hair) + 1) % 4],
                                shirt=COOL_COLOURS[0] if p.actor.shirt != COOL_COLOURS[0] else COOL_COLOURS[1])
    assert other.skin != p.actor.skin and SKIN_TONES[other.skin] != SKIN_TONES[p.actor.skin]
    frames2 = render_plan(dataclasses.replace(p, actor=other))
    changed = (frames != frames2).any(-1)
    assert changed.mean() > 0.3 * masks.mean() and not (changed & ~masks).any()
    # and `generate` wrote them beside the video
    stored = read_masks(mask_path(bench / "ar" / p.path))
    assert (stored == masks).all()


def test_hog_finds_the_pedestrians_in_a_real_video():
    from splavu_core.ingest.video import DecordVideo

    v = DecordVideo(VTEST)
    idx = np.arange(0, v.info.n_frames, 4)
    frames = v.frames(idx)
    hog = HogPeopleDetector()
    masks = hog(VTEST, idx, frames)
    cover = masks.mean((1, 2))
    assert (cover > 0).mean() >= 0.75, f"people found in too few frames: {cover}"
    assert cover.max() < 0.4, f"masks cover too much of the frame: {cover}"
    boxes = np.concatenate([hog.boxes(f) for f in frames])
    assert len(boxes) and np.median((boxes[:, 3] - boxes[:, 1]) / (boxes[:, 2] - boxes[:, 0])) > 1.5  # upright people
    blurred = PixelAnonymizer("blur", BASELINES["blur"], hog)(VTEST, idx, frames)
    grown = PixelTransform("blacken")(np.full_like(frames, 255), masks) == 0  # the blur's region, dilation included
    assert (blurred[~grown.all(-1)] == frames[~grown.all(-1)]).all() and (blurred != frames).any()


# ---------------------------------------------------------------- the variant store

def _tree_hash(d: Path) -> dict:
    return {str(p.relative_to(d)): hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(d.rglob("*")) if p.is_file()}


def test_baseline_stores_are_their_own_and_never_touch_raw(tiny_store, run_baseline, tmp_path):
    from splavu_core.store import costs

    root = tmp_path / "store"
    shutil.copytree(tiny_store, root)
    raw = FeatureStore(root)
    before, fp = _tree_hash(root / "latents"), raw.encoder_fingerprint()

    md = run_baseline(root, "down4", datasets=["ar"])
    assert md["skipped"] is False and md["shards_extracted"] >= 1 and md["quarantined"] == 0
    skipped = run_baseline(root, "blur", datasets=["ar"])  # no masks configured: said, nothing written
    assert skipped["skipped"] is True and "mask_source" in skipped["reason"]
    assert not (root / "baselines" / "pixel_blur").exists()
    run_baseline(root, "blacken", datasets=["ar"], mask_source="rendered")

    assert _tree_hash(root / "latents") == before and raw.encoder_fingerprint() == fp
    for name in ("pixel_down4", "pixel_blacken"):
        b = FeatureStore(root / "baselines" / name)
        assert b.encoder_fingerprint().startswith(f"{fp}+{name}-")
        with pytest.raises(StoreError, match="refusing"):
            raw.claim(b.provenance())  # the raw store can never take a baseline's latents
        for shard in b.committed_shards():
            r, p = raw.read_shard(shard, with_static=False), b.read_shard(shard, with_static=False)
            assert r.index.select(["video_id", "clip_index", "start_frame"]).equals(p.index.select(["video_id", "clip_index", "start_frame"]))
            assert p.clips.shape == r.clips.shape and not np.allclose(p.clips, r.clips, atol=1e-4)
        assert set(costs.entries(b, name, "extract")) == set(b.committed_shards())
    # a rerun resumes: every shard already extracted with this transform is skipped
    again = run_baseline(root, "down4", datasets=["ar"])
    assert again["shards_extracted"] == 0 and again["shards_skipped"] == md["shards_extracted"]


def test_a_baseline_whose_person_masks_are_missing_stops_and_writes_nothing(tiny_store, run_baseline, tmp_path,
                                                                            monkeypatch):
    """Videos raw extracted but the transform cannot (here: no mask file, as after `make demo`, which skips them)
    stop the baseline with the file and the fix named, before its shard is written: not 0 clips scored later."""
    from splavu_core.extract import pixel as pixel_mod

    root = tmp_path / "store"
    shutil.copytree(tiny_store, root)
    shutil.rmtree(root / "baselines", ignore_errors=True)
    monkeypatch.setattr(pixel_mod, "mask_path", lambda video: Path(video).with_name("missing.mask.npz"))
    with pytest.raises(Exception, match=r"pixel baseline blacken, shard ar-\d+: \d+ of the videos raw extracted "
                                        r"failed here \(nothing written\), e\.g\. .*missing\.mask\.npz: no person mask"):
        run_baseline(root, "blacken", datasets=["ar"], mask_source="rendered")
    store = root / "baselines" / "pixel_blacken"
    assert not store.exists() or not FeatureStore(store).committed_shards()


def test_baselines_without_a_version_to_score_stop_before_extracting(tiny_store, tmp_path, capsys):
    """`splavu baselines` scores the baselines beside an AAM version: on a store with none it says so at once,
    not after re-encoding every video; --no-evaluate extracts without one."""
    from pipeline.cli import main

    root = tmp_path / "store"
    shutil.copytree(tiny_store, root)
    shutil.rmtree(root / "baselines", ignore_errors=True)
    for ledger in [*root.glob("aam_*"), root / "aam"]:  # whatever other tests recorded in the shared store
        shutil.rmtree(ledger) if ledger.is_dir() else ledger.unlink(missing_ok=True)
    assert main(["--store", str(root), "baselines", "--only", "down4", "--dataset", "ar"]) == 2
    err = capsys.readouterr().err
    assert "no AAM version" in err and "splavu train" in err
    assert not (root / "baselines").exists()
