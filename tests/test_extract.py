"""Latent extraction into the store: quarantine, atomic shard commit, idempotence, concurrency, sensor."""
import hashlib
import os
import shutil
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import dagster as dg
import numpy as np
import pytest

from assets.partitions import shards
from assets.resources import EncoderResource, StoreResource
from pipeline.definitions import defs
from pipeline.runner import ingest, materialize_shard
from pipeline.sensors import inbox_sensor
from splavu_core.extract.shards import extract_shard
from splavu_core.ingest.manifest import load_manifest
from splavu_core.ingest.synth.figure import random_actor
from splavu_core.ingest.synth.render import render
from splavu_core.ingest.video import write_mp4
from splavu_core.store.feature_store import FeatureStore, StoreError

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture
def small_dataset(tiny_bench, tmp_path):
    """Six AR videos of the tiny benchmark plus one bad file of each kind."""
    root, _ = tiny_bench
    ds = tmp_path / "ds"
    (ds / "videos").mkdir(parents=True)
    m = load_manifest(root / "ar" / "manifest.csv")
    lines = ["video_id,path,split,action"]
    for r in m.rows[:6]:
        shutil.copy(root / "ar" / r["path"], ds / r["path"])
        lines.append(f"{r['video_id']},{r['path']},{r['split']},{r['action']}")
    good = (ds / m.rows[0]["path"]).read_bytes()
    bad = {"corrupt": np.random.default_rng(4000).bytes(4000), "truncated": good[: len(good) // 3], "empty": b"",
           "unsupported": b"this is a text file, not a video\n" * 50}
    for name, data in bad.items():
        (ds / "videos" / f"{name}.mp4").write_bytes(data)
        lines.append(f"{name},videos/{name}.mp4,train,wave")
    rng = np.random.default_rng(0)
    write_mp4(ds / "videos" / "short.mp4", render(random_actor(rng), [("wave", 0, 8)], 8, rng), fps=16)
    lines.append("short,videos/short.mp4,train,wave")
    (ds / "manifest.csv").write_text("\n".join(lines) + "\n")
    return ds


def shard_bytes(store_root, shard):
    d = Path(store_root) / "latents" / shard
    files = sorted(p for p in d.rglob("*") if p.is_file() and p.name != "quarantine.parquet")
    return {str(p.relative_to(d)): hashlib.sha256(p.read_bytes()).hexdigest() for p in files}


def run(inst, store_root, shard, checkpoint):
    return materialize_shard(inst, shard, StoreResource(root=str(store_root)), EncoderResource(checkpoint=str(checkpoint)))


def test_bad_videos_are_quarantined_not_fatal(small_dataset, tiny_videomae, tmp_path):
    inst = dg.DagsterInstance.ephemeral()
    store = tmp_path / "store"
    (key,) = ingest(inst, StoreResource(root=str(store)), "mixed", str(small_dataset / "manifest.csv"), 64,
                    roles="ar")  # a training role: its train videos get static clips
    res = run(inst, store, key, tiny_videomae)
    md = {m.asset_key.path[-1]: m.metadata for m in res.asset_materializations_for_node("extracted_latents")}
    assert md["clip_latents"]["quarantined"].value == 5 and md["clip_latents"]["videos"].value == 6
    data = FeatureStore(store).read_shard(key)
    q = {r["video_id"]: r["error"] for r in data.quarantine.to_pylist()}
    assert set(q) == {"corrupt", "truncated", "empty", "unsupported", "short"}
    assert "empty file" in q["empty"] and "too short: 8 frames, a clip needs 16" in q["short"]
    for vid, err in q.items():
        assert f"{vid}.mp4" in err  # every reason names the file
    assert np.isfinite(data.clips).all() and not (np.abs(data.clips).sum(1) == 0).any()
    assert set(data.index.column("video_id").to_pylist()).isdisjoint(q)
    # static latents only for training videos, K each, in frame order
    train = {r["video_id"] for r in load_manifest(small_dataset / "manifest.csv").rows if r["split"] == "train"} - set(q)
    assert data.static.shape == (len(train), EncoderResource().static_k, 32)
    assert set(data.static_index.column("video_id").to_pylist()) == train


def test_clip_index_matches_sampling(small_dataset, tiny_videomae):
    from splavu_core.extract.encoders.vfm import load_encoder
    from splavu_core.extract.sampling import ClipSampling

    rows = load_manifest(small_dataset / "manifest.csv").rows[:2]
    out = extract_shard("t-000", rows, small_dataset, load_encoder(tiny_videomae, device="cpu"), ClipSampling(static_k=0))
    idx = out.index.to_pylist()
    first = [r for r in idx if r["video_id"] == rows[0]["video_id"]]
    assert [(r["clip_index"], r["start_frame"], r["end_frame"]) for r in first] == [(i, 16 * i, 16 * i + 16) for i in range(len(first))]
    assert first[1]["start_s"] == pytest.approx(1.0) and first[1]["end_s"] == pytest.approx(2.0)
    assert out.static.shape[0] == 0


def test_rerun_is_idempotent_and_other_encoder_is_refused(small_dataset, tiny_videomae, tmp_path):
    inst = dg.DagsterInstance.ephemeral()
    store = tmp_path / "store"
    (key,) = ingest(inst, StoreResource(root=str(store)), "mixed", str(small_dataset / "manifest.csv"), 64)
    run(inst, store, key, tiny_videomae)
    before = shard_bytes(store, key)
    mtimes = {p: p.stat().st_mtime_ns for p in (store / "latents" / key).rglob("*")}
    res = run(inst, store, key, tiny_videomae)
    md = {m.asset_key.path[-1]: m.metadata for m in res.asset_materializations_for_node("extracted_latents")}
    assert md["clip_latents"]["skipped"].value is True
    assert shard_bytes(store, key) == before
    assert {p: p.stat().st_mtime_ns for p in (store / "latents" / key).rglob("*")} == mtimes
    from conftest import save_tiny_videomae

    other = save_tiny_videomae(tmp_path / "other", seed=7)
    with pytest.raises(StoreError, match="refusing to append latents of encoder"):
        run(inst, store, key, other)
    assert shard_bytes(store, key) == before  # nothing lost


KILL_SCRIPT = textwrap.dedent("""
    import os, sys, signal
    import pyarrow.parquet as pq
    from splavu_core.extract.encoders.vfm import load_encoder
    from splavu_core.extract.shards import extract_shard, manifest_hash
    from splavu_core.ingest.datasets import shard_rows
    from splavu_core.extract.sampling import ClipSampling
    from splavu_core.store.feature_store import FeatureStore
    store, shard, ckpt = FeatureStore(sys.argv[1]), sys.argv[2], sys.argv[3]
    real = pq.write_table
    def write_then_die(table, where, **kw):  # killed mid-shard: after the Zarr arrays, at the first index table
        real(table, where, **kw)
        os.kill(os.getpid(), signal.SIGKILL)
    pq.write_table = write_then_die
    enc, s = load_encoder(ckpt, device="cpu"), ClipSampling()
    m, rows = shard_rows(store, shard)
    store.write_shard(shard, extract_shard(shard, rows, m.root, enc, s), enc.provenance(s), manifest_hash(rows))
""")


def test_killed_process_leaves_no_visible_shard_and_rerun_is_byte_identical(small_dataset, tiny_videomae, tmp_path):
    inst = dg.DagsterInstance.ephemeral()
    ref_store, store = tmp_path / "ref", tmp_path / "store"
    (key,) = ingest(inst, StoreResource(root=str(ref_store)), "mixed", str(small_dataset / "manifest.csv"), 64)
    ingest(inst, StoreResource(root=str(store)), "mixed", str(small_dataset / "manifest.csv"), 64)
    run(inst, ref_store, key, tiny_videomae)  # uninterrupted reference
    proc = subprocess.run([sys.executable, "-c", KILL_SCRIPT, str(store), key, str(tiny_videomae)], cwd=REPO,
                          capture_output=True, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert proc.returncode == -signal.SIGKILL, proc.stderr.decode()[-2000:]
    assert list((store / "latents" / ".staging").iterdir()), "the killed writer should have left staging debris"
    assert not (store / "latents" / key).exists() and FeatureStore(store).committed_shards() == []
    run(inst, store, key, tiny_videomae)
    assert not list((store / "latents" / ".staging").iterdir())
    assert shard_bytes(store, key) == shard_bytes(ref_store, key)


CONCURRENT_SCRIPT = textwrap.dedent("""
    import sys, dagster as dg
    from assets.resources import EncoderResource, StoreResource
    from pipeline.runner import materialize_shard
    inst = dg.DagsterInstance.ephemeral()
    inst.add_dynamic_partitions("shards", [sys.argv[2]])
    r = materialize_shard(inst, sys.argv[2], StoreResource(root=sys.argv[1]), EncoderResource(checkpoint=sys.argv[3]))
    sys.exit(0 if r.success else 1)
""")


def test_two_shards_in_parallel_processes_are_both_correct(small_dataset, tiny_videomae, tmp_path):
    inst = dg.DagsterInstance.ephemeral()
    seq, par = tmp_path / "seq", tmp_path / "par"
    keys = ingest(inst, StoreResource(root=str(seq)), "mixed", str(small_dataset / "manifest.csv"), 6)
    ingest(inst, StoreResource(root=str(par)), "mixed", str(small_dataset / "manifest.csv"), 6)
    assert len(keys) == 2
    for k in keys:
        run(inst, seq, k, tiny_videomae)
    procs = [subprocess.Popen([sys.executable, "-c", CONCURRENT_SCRIPT, str(par), k, str(tiny_videomae)], cwd=REPO,
                              env={**os.environ, "PYTHONPATH": str(REPO)}, stderr=subprocess.PIPE) for k in keys]
    for p in procs:
        assert p.wait(timeout=300) == 0, p.stderr.read().decode()[-2000:]
    for k in keys:
        assert shard_bytes(par, k) == shard_bytes(seq, k)


def test_inbox_sensor_adds_partition_and_requests_run(small_dataset, tmp_path):
    inst = dg.DagsterInstance.ephemeral()
    store = StoreResource(root=str(tmp_path / "store"), inbox=str(tmp_path / "inbox"))
    (tmp_path / "inbox").mkdir()
    ctx = dg.build_sensor_context(instance=inst, resources={"store": store})
    assert isinstance(inbox_sensor(ctx), dg.SkipReason)
    shutil.copytree(small_dataset, tmp_path / "inbox" / "Batch 7")
    result = inbox_sensor(dg.build_sensor_context(instance=inst, resources={"store": store}))
    assert [r.partition_key for r in result.run_requests] == ["inbox_batch_7-000"]
    assert result.dynamic_partitions_requests[0].partition_keys == ["inbox_batch_7-000"]
    inst.add_dynamic_partitions(shards.name, ["inbox_batch_7-000"])
    assert isinstance(inbox_sensor(dg.build_sensor_context(instance=inst, resources={"store": store})), dg.SkipReason)


def test_definitions_load():
    graph = defs.resolve_asset_graph()
    keys = {k.to_user_string() for k in graph.get_all_asset_keys()}
    assert {"video_manifest", "clip_latents", "static_latents"} <= keys
    assert defs.get_job_def("extract_latents") is not None
    assert defs.get_sensor_def("inbox_sensor") is not None
    dg.Definitions.validate_loadable(defs)  # what `dagster dev` checks: partition mappings, resources, jobs


def _reference_embeddings(enc, clips: np.ndarray) -> np.ndarray:
    """The demo encoder's latents the plain way, one clip at a time, with preprocessing spelt out as it was before
    extraction was sped up (float copy, resize, crop, (x * rescale - mean) / std), in the layout embed_prepared uses."""
    import torch
    import torch.nn.functional as F

    p = enc.preprocess
    out = []
    for clip in clips:
        x = torch.from_numpy(np.ascontiguousarray(clip)).permute(0, 3, 1, 2).float()  # (T, 3, H, W)
        H, W = x.shape[-2:]
        if min(H, W) != p.short_side:
            s = p.short_side / min(H, W)
            x = F.interpolate(x, size=(round(H * s), round(W * s)), mode="bilinear", align_corners=False, antialias=True)
        h, w = x.shape[-2:]
        top, left = (h - p.crop) // 2, (w - p.crop) // 2
        x = x[..., top:top + p.crop, left:left + p.crop]
        x = (x * p.rescale - torch.tensor(p.mean).view(1, 3, 1, 1)) / torch.tensor(p.std).view(1, 3, 1, 1)
        x = x[None].permute(0, 1, 3, 4, 2).contiguous().permute(0, 1, 4, 2, 3)
        with torch.no_grad():
            out.append(enc.model(pixel_values=x).last_hidden_state.mean(1)[0].numpy())
    return np.stack(out)


def test_fast_extraction_keeps_the_demo_encoders_latents_bit_for_bit(tiny_bench, tmp_path):
    """The extraction path (in-place preprocessing, channels-last batches, several encoder workers of one thread,
    mixed batches of clips and static clips) gives exactly the latents of the plain one-clip-at-a-time path, on
    a real 576x768 H.264 video (the resize path) and on synthetic 112 px ones (no resize); and the demo encoder's
    fingerprint is the one every store of it records."""
    from splavu_core.extract.encoders.vfm import load_encoder
    from splavu_core.extract.sampling import ClipSampling
    from splavu_core.ingest.video import DecordVideo

    enc = load_encoder(device="cpu")
    # weights + config + preprocessing + sampling: K = 4 static clips since the demo was resized (stores of K = 10
    # keep theirs, and a resource with static_k=10 still writes them)
    assert enc.fingerprint(ClipSampling()) == "videomae-a1f4d9db0b9b8a13"
    assert enc.fingerprint(ClipSampling(static_k=10)) == "videomae-23aa74e9917a12f7"
    root, _ = tiny_bench
    m = load_manifest(root / "tad" / "manifest.csv")
    real = tmp_path / "real"
    (real / "videos").mkdir(parents=True)
    shutil.copy(REPO / "tests" / "data" / "vtest_people.mp4", real / "videos" / "people.mp4")
    rows = [{"video_id": "people", "path": "videos/people.mp4", "split": "train"}]
    s = ClipSampling(clip_len=16, static_k=3)
    for base, rs in ((real, rows), (m.root, m.rows[:2])):
        out = extract_shard("pin", rs, base, enc, s, batch_size=5, workers=2, static_splits=("train", "val", "test"))
        got_clips, got_static = [], []
        for r in rs:
            v = DecordVideo(base / r["path"])
            spans = s.clips(v.info.n_frames, v.info.fps)
            got_clips.append(_reference_embeddings(enc, np.stack([v.frames(c.frames) for c in spans])))
            still = v.frames(s.static_frames(v.info.n_frames))
            got_static.append(_reference_embeddings(enc, np.repeat(still[:, None], 16, axis=1)))
        assert np.array_equal(out.clips, np.concatenate(got_clips))
        assert np.array_equal(out.static, np.stack(got_static))


def _shard_of(store_root, shard, rows, root, enc, sampling, **kw):
    """Extract and commit one shard; its committed bytes and its quarantine (video, error) pairs."""
    from splavu_core.extract.shards import manifest_hash

    out = extract_shard(shard, rows, root, enc, sampling, static_splits=("train", "val", "test"), **kw)
    FeatureStore(store_root).write_shard(shard, out, enc.provenance(sampling), manifest_hash(rows))
    return shard_bytes(store_root, shard), [(q["video_id"], q["error"]) for q in out.quarantine.to_pylist()]


def test_decoder_processes_write_the_zarr_bytes_of_decode_threads(small_dataset, tiny_bench, tiny_videomae, tmp_path):
    """Issue 61: decoder processes + preparation on the device give the shard the threads path (SPLAVU_DECODE_WORKERS=0,
    as before) gives, byte for byte, and quarantine the same videos with the same reasons: the resize path (tiny
    encoder, 112 px videos, five bad files and a short one) and the crop path the workers take themselves (the demo
    encoder on its own 112 px videos, beside a real 576x768 video that it resizes)."""
    from splavu_core.extract.encoders.vfm import load_encoder
    from splavu_core.extract.sampling import ClipSampling

    root, _ = tiny_bench
    real = tmp_path / "real"
    shutil.copytree(root / "tad", real)
    shutil.copy(REPO / "tests" / "data" / "vtest_people.mp4", real / "people.mp4")
    tad = load_manifest(root / "tad" / "manifest.csv").rows[:3]
    cases = [(load_manifest(small_dataset / "manifest.csv").rows, small_dataset, load_encoder(tiny_videomae, device="cpu")),
             ([{"video_id": "people", "path": "people.mp4", "split": "train"}, *tad], real, load_encoder(device="cpu"))]
    s = ClipSampling(clip_len=16, static_k=3)
    for i, (rows, base, enc) in enumerate(cases):
        threads = _shard_of(tmp_path / f"threads{i}", "s-000", rows, base, enc, s, decoders=0, batch_size=5)
        for n in (1, 2):
            assert _shard_of(tmp_path / f"proc{i}{n}", "s-000", rows, base, enc, s, decoders=n, batch_size=5) == threads
    assert len(threads[0]) > 3 and not threads[1]
    assert {v for v, _ in _shard_of(tmp_path / "q", "q-000", cases[0][0], small_dataset, cases[0][2], s)[1]} == \
        {"corrupt", "truncated", "empty", "unsupported", "short"}


def _decoder_pids() -> list[int]:
    """This process's decoder processes (splavu_core/extract/decode_pool.py), from /proc."""
    pids = []
    for d in Path("/proc").iterdir():
        try:
            if d.name.isdigit() and int((d / "stat").read_text().rsplit(")", 1)[1].split()[1]) == os.getpid() \
                    and b"decode_pool" in (d / "cmdline").read_bytes():
                pids.append(int(d.name))
        except (OSError, IndexError, ValueError):
            continue
    return pids


def test_a_decoder_process_that_dies_stops_the_shard_with_a_clear_error(tiny_bench, tiny_videomae, tmp_path):
    """A decoder killed mid-shard (the OOM killer, say) fails the shard at once, naming the process, how it died, the
    video it held and the setting; nothing is committed; the next extraction starts new decoders and succeeds."""
    from splavu_core.extract.decode import ExtractError
    from splavu_core.extract.decode_pool import close_idle
    from splavu_core.extract.encoders.vfm import load_encoder
    from splavu_core.extract.sampling import ClipSampling
    from splavu_core.extract.shards import manifest_hash

    close_idle()  # the decoders of earlier tests: only this shard's are then alive to be killed
    root, _ = tiny_bench
    m = load_manifest(root / "ar" / "manifest.csv")
    rows, enc, s = m.rows[:8], load_encoder(tiny_videomae, device="cpu"), ClipSampling()
    store = FeatureStore(tmp_path / "store")
    killed = []

    def kill_one(done):
        if not killed:
            killed.append(_decoder_pids()[0])
            os.kill(killed[0], signal.SIGKILL)

    def extract():
        return extract_shard("die-000", rows, m.root, enc, s, decoders=2, progress=kill_one)

    with pytest.raises(ExtractError) as e:
        store.produce_shard("die-000", enc.provenance(s), manifest_hash(rows), extract)
    msg = str(e.value)
    assert f"decoder process {killed[0]} was killed by SIGKILL" in msg and "SPLAVU_DECODE_WORKERS" in msg
    assert "while decoding" in msg and ".mp4" in msg and "nothing of this shard was written" in msg
    assert store.committed("die-000") is None and killed[0] not in _decoder_pids()
    marker, skipped = store.produce_shard("die-000", enc.provenance(s), manifest_hash(rows),
                                          lambda: extract_shard("die-000", rows, m.root, enc, s, decoders=2))
    assert not skipped and marker["videos"] == 8


def test_gpu_decoding_asked_for_without_a_gpu_names_the_setting(small_dataset, tiny_videomae, monkeypatch):
    import torch

    from splavu_core.extract.decode import ExtractError
    from splavu_core.extract.encoders.vfm import load_encoder
    from splavu_core.extract.sampling import ClipSampling

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU: tests/test_gpu_decode.py")
    rows = load_manifest(small_dataset / "manifest.csv").rows[:1]
    monkeypatch.setenv("SPLAVU_DECODER", "nvdec")
    with pytest.raises(ExtractError, match=r"SPLAVU_DECODER=nvdec asks for GPU decoding, but no CUDA device"):
        extract_shard("g-000", rows, small_dataset, load_encoder(tiny_videomae, device="cpu"), ClipSampling())
    monkeypatch.setenv("SPLAVU_DECODER", "auto")  # auto: the CPU decoders here
    assert len(extract_shard("g-000", rows, small_dataset, load_encoder(tiny_videomae, device="cpu"),
                             ClipSampling()).clips) > 0


def test_the_next_shard_reuses_the_decoder_processes(small_dataset, tiny_videomae):
    """`splavu extract` runs every shard in one process: the decoders of one shard decode the next (starting them
    costs about half a second a shard), also after a shard with bad videos."""
    from splavu_core.extract.encoders.vfm import load_encoder
    from splavu_core.extract.sampling import ClipSampling

    rows, enc = load_manifest(small_dataset / "manifest.csv").rows, load_encoder(tiny_videomae, device="cpu")
    extract_shard("a-000", rows, small_dataset, enc, ClipSampling(), decoders=2)
    before = sorted(_decoder_pids())
    extract_shard("b-000", rows[:2], small_dataset, enc, ClipSampling(), decoders=2)
    assert len(before) >= 2 and sorted(_decoder_pids()) == before
