"""The keep family: a k-dim utility subspace fitted from utility labels only, published k wide end to end."""
import dataclasses
import shutil

import dagster as dg
import numpy as np
import pyarrow.parquet as pq
import pytest
from test_anonymizer_privacy import flip_private_labels, toy_videos

from splavu_core.aam.keep import apply_keep, apply_recentre, fit_keep, fit_recentre
from splavu_core.store.feature_store import FeatureStore
from splavu_core.tasks.features import VideoFeatures

KEEP = dict(epochs=2, batch=64, pretrain_head_epochs=1, tasks=("ar",), adapter={"keep": 4, "layers": 0, "mixer": "mlp", "projection_rank": 0},
            diagnose_points=1, diagnose_steps=30)
# fit_keep's weights for the tests of the fit itself: the task scatter alone, barely shrunk
BARE = dict(w_motion=0.0, w_app=0.0, ridge=1e-3, tad_phases=3, w_dynamic=0.0)


def _videos(actions, labels):
    return [VideoFeatures(video_id=str(i), split="train", feats=a, clip_start_s=np.arange(len(a), dtype=float),
                          clip_end_s=np.arange(len(a), dtype=float) + 1, n_frames=16 * len(a), fps=16.0,
                          meta={"action": f"a{int(y)}"}) for i, (a, y) in enumerate(zip(actions, labels))]


def test_keep_keeps_the_action_directions_and_drops_appearance():
    static, actions, labels = toy_videos()
    fit = fit_keep({"ar": _videos(actions, labels)}, static, k=2, **BARE)
    clips, y = np.concatenate(actions), np.repeat(labels, 4)
    z = apply_keep(fit, clips)
    assert z.shape == (len(clips), 2)
    # appearance (dims 0-5, per video) is nearly gone: between-video spread of the kept static clips is small
    kept_static = apply_keep(fit, static.reshape(-1, static.shape[-1])).reshape(len(static), -1, 2)
    app_share = np.cov(kept_static.mean(1), rowvar=False).trace() / np.cov(z, rowvar=False).trace()
    assert app_share < 0.05, app_share
    # the three actions stay apart: nearest class centre recovers the label
    centres = np.stack([z[y == c].mean(0) for c in range(3)])
    pred = np.argmin(((z[:, None] - centres[None]) ** 2).sum(-1), 1)
    assert (pred == y).mean() > 0.95
    with pytest.raises(AssertionError, match="k must be"):
        fit_keep({"ar": _videos(actions, labels)}, static, k=0, **BARE)


def test_motion_directions_fill_the_space_no_task_asked_for():
    """With no utility label the keep stage keeps what varies within a video (appearance does not)."""
    static, actions, labels = toy_videos()
    fit = fit_keep({"ar": _videos(actions, np.zeros_like(labels))}, static, k=3, **{**BARE, "w_motion": 1.0})
    kept_static = apply_keep(fit, static.reshape(-1, static.shape[-1])).reshape(len(static), -1, 3)
    z = apply_keep(fit, np.concatenate(actions))
    assert np.cov(kept_static.mean(1), rowvar=False).trace() < 0.2 * np.cov(z, rowvar=False).trace()


def test_what_motion_adds_finds_the_actions_without_any_label():
    """S_dyn (moving clips minus their own video's static clips) keeps the action content and no appearance, with
    no label at all; within-video motion alone (here: noise) cannot tell which directions the actions use."""
    static, actions, labels = toy_videos()
    unlabelled = {"ar": _videos(actions, np.zeros_like(labels))}
    dynamic = [a - s.mean(0) for a, s in zip(actions, static)]
    y = np.repeat(labels, 4)

    def nearest_centre_accuracy(fit):
        z = apply_keep(fit, np.concatenate(actions))
        centres = np.stack([z[y == c].mean(0) for c in range(3)])
        return (np.argmin(((z[:, None] - centres[None]) ** 2).sum(-1), 1) == y).mean(), z

    # with shrinkage: a ratio criterion alone prefers the low-variance noise directions (all of their variance is
    # "dynamic"); isotropic variance added to the rest outweighs them
    fit = fit_keep(unlabelled, static, k=2, dynamic=dynamic, **{**BARE, "w_dynamic": 1.0, "ridge": 1.0})
    acc, z = nearest_centre_accuracy(fit)
    unshrunk = fit_keep(unlabelled, static, k=2, dynamic=dynamic, **{**BARE, "w_dynamic": 1.0})
    assert nearest_centre_accuracy(unshrunk)[0] < 0.8
    kept_static = apply_keep(fit, static.reshape(-1, static.shape[-1])).reshape(len(static), -1, 2)
    assert acc > 0.95 and np.cov(kept_static.mean(1), rowvar=False).trace() < 0.05 * np.cov(z, rowvar=False).trace()
    motion = fit_keep(unlabelled, static, k=2, **{**BARE, "w_motion": 1.0, "ridge": 1.0})
    motion_only, _ = nearest_centre_accuracy(motion)
    assert motion_only < 0.8, motion_only


def _recentre_toy(n=120, k=4, seed=0):
    """Kept video means: action centroids 6 apart in dims 0-1, a per-video appearance offset (the attribute's
    sign) in dims 2-3; T = 5 clips per video with within-video motion."""
    rng = np.random.default_rng(seed)
    labels = rng.integers(3, size=n)
    attr = rng.integers(2, size=n)
    cent = np.zeros((3, k))
    cent[:, :2] = 6 * np.array([[0, 0], [1, 0], [0, 1]])
    means = cent[labels] + 0.3 * rng.normal(size=(n, k))
    means[:, 2] += np.where(attr == 1, 1.0, -1.0)
    videos = [m + 0.5 * rng.normal(size=(5, k)) for m in means]
    return [v.astype(np.float32) for v in videos], labels.astype(str), attr


def test_recentring_replaces_who_in_a_videos_mean_and_keeps_its_motion():
    videos, labels, attr = _recentre_toy()
    fit = fit_recentre(np.stack([v.mean(0) for v in videos]), labels, 0.8)
    out = [apply_recentre(fit, v) for v in videos]
    means = np.stack([o.mean(0) for o in out])
    # who: the appearance offset no longer separates the attribute's two groups (it did by 2 units)
    gap = lambda m: abs(m[attr == 1, 2].mean() - m[attr == 0, 2].mean())  # noqa: E731
    assert gap(np.stack([v.mean(0) for v in videos])) > 1.5 and gap(means) < 0.2, gap(means)
    # what: a video's mean becomes its action's centroid (all but the training videos past the gate's 0.8 quantile,
    # which are moved less); motion: the within-video deviations are unchanged
    err = np.abs(means - fit.centroids[np.searchsorted(np.unique(labels), labels)]).max(1)
    assert 0.75 <= (err < 0.05).mean() < 1 and err.max() < 1.0, np.sort(err)
    for v, o in zip(videos, out):
        np.testing.assert_allclose(o - o.mean(0), v - v.mean(0), atol=1e-5)
    # a video far from every training action (a new class) keeps most of its own mean
    novel = np.array([[-30.0, -30.0, 1.0, 0.0]], np.float32).repeat(5, 0)
    assert np.abs(apply_recentre(fit, novel).mean(0) - novel.mean(0)).max() < 0.05 * 30


def test_a_drawn_centroid_is_one_codebook_entry_drawn_from_the_tempered_posterior():
    """recentre_draw = T: each clip publishes ONE centroid, drawn with the posterior's probabilities at temperature
    T, keyed by the clip's bytes (the same clip, the same draw); numpy (the curve) and torch (the adapter) agree."""
    import torch

    from splavu_core.aam.keep import RecentreFit, apply_recentre, clip_uniforms
    from splavu_core.aam.model import Recentre

    rng = np.random.default_rng(0)
    raw = rng.normal(size=(4000, 1, 8)).astype(np.float32)             # distinct clips: their bytes key the draws
    u = clip_uniforms(raw)                                             # (4000, 1)
    assert u.shape == (4000, 1) and np.array_equal(u, clip_uniforms(raw.copy())) and abs(u.mean() - 0.5) < 0.02
    cent = np.array([[0.0, 0.0], [2.0, 0.0]], np.float32)
    z = np.tile(np.array([0.6, 0.0], np.float32), (4000, 1, 1))        # every clip at the same kept point
    rec = Recentre(2, 2, per_clip=True, draw=4.0)
    rec.centroids.copy_(torch.from_numpy(cent))
    rec.precision.copy_(torch.eye(2))
    rec.gate.fill_(1e6)                                                # never moved less: the pure draw
    with torch.no_grad():
        out = rec(torch.from_numpy(z), None, torch.from_numpy(u)).numpy()[:, 0]   # (4000, 2)
    first = (out == cent[0]).all(1)
    assert (first | (out == cent[1]).all(1)).all()                     # every row IS a centroid, no mixture
    p = 1 / (1 + np.exp(-(1.96 - 0.36) / 8))                           # posterior of centroid 0 at T = 4
    assert abs(first.mean() - p) < 4 * np.sqrt(p * (1 - p) / 4000), (first.mean(), p)
    fit = RecentreFit(centroids=cent, precision=np.eye(2, dtype=np.float32), gate=np.float32(1e6), per_clip=True)
    np_rows = np.stack([apply_recentre(fit, zi, 4.0, ui) for zi, ui in zip(z, u)])[:, 0]
    np.testing.assert_array_equal(np_rows, out)
    mean = apply_recentre(fit, z[0])                                   # no draw: the posterior's mean, no centroid
    assert not any(np.allclose(mean[0], c) for c in cent)


@pytest.mark.parametrize("on,draw,top", [("clips", 0.0, 0), ("classes", 0.0, 0), ("clips", 4.0, 0), ("clips", 4.0, 3),
                                         ("clips", 0.0, 3)])
def test_recentring_adapter_is_per_video_and_matches_the_curves_fit(tiny_store, on, draw, top):
    """The adapter aam_model trains (torch) and the keep curve's member (numpy) give the same rows, and a video's
    rows do not depend on the other videos of its batch; on either kind of centroid."""
    import torch

    from splavu_core.aam.closed_form import fit_closed_form, n_centroids
    from splavu_core.aam.config import TrainConfig
    from splavu_core.aam.train import train_aam
    from splavu_core.aam.training_data import load_training_data
    from splavu_core.evaluation.suite import anonymize_videos
    from splavu_core.publish.anonymized_tables import load_video_features

    store = FeatureStore(tiny_store)
    data = load_training_data(store, ad=None)
    adapter_kw = {**KEEP["adapter"], "recentre": True, **({"recentre_draw": draw} if draw else {}),
                  **({"recentre_top": top} if top else {})}
    cfg = TrainConfig.from_flat({**KEEP, "tasks": ("ar", "tad"), "adapter": adapter_kw,
                                 "recentre_on": on, "recentre_cluster_clips": 16,
                                 # draws need several centroids to differ from the mean: no pooling of the tiny store
                                 **({"recentre_min_people": 1} if draw or top else {})})
    adapter, acfg, summary = train_aam(data, cfg, log=None)
    clips = sum(len(v.feats) for v in data.ar_train + data.tad_train)
    want = len(data.classes) if on == "classes" else clips // 16
    assert acfg.recentre and want == n_centroids(data, cfg.tasks, cfg)
    if on == "classes":
        assert acfg.centroids == want
    else:  # clusters of fewer than recentre_min_people people were pooled into their nearest neighbours
        assert 2 <= acfg.centroids <= want and summary["keep"]["recentre"]["fewest_people"] >= cfg.recentre_min_people
    assert summary["keep"]["recentre"]["classes"] == acfg.centroids and summary["keep"]["recentre"]["on"] == on
    maps = fit_closed_form(data, cfg.tasks, 4, cfg)
    assert set(maps) == {False, True}
    fn = maps[True]
    videos = load_video_features(store, source="raw", datasets=["ar"])[:12]
    published = anonymize_videos(adapter, videos)
    for v, p in zip(videos, published):
        np.testing.assert_allclose(p.feats, fn(v.feats), atol=1e-4)
    alone = anonymize_videos(adapter, videos[3:4])[0].feats
    np.testing.assert_allclose(alone, published[3].feats, atol=1e-6)  # batch-mates change float order only
    # a video is recentred on its own mean: not the lone-clip map (one clip = one video)
    with torch.no_grad():
        lone = adapter(torch.from_numpy(videos[3].feats)).numpy()
    assert len(videos[3].feats) > 1 and not np.allclose(lone, alone, atol=1e-3)
    if draw or top:  # drawn or cut per clip: published twice, the same rows; not the full posterior's mean
        assert (acfg.recentre_draw, acfg.recentre_top) == (draw, top)
        np.testing.assert_array_equal(anonymize_videos(adapter, videos)[5].feats, published[5].feats)
        mean_fn = fit_closed_form(data, cfg.tasks, 4, cfg.replace(recentre_draw=0.0, recentre_top=0))[True]
        assert not draw or not np.allclose(mean_fn(videos[5].feats), published[5].feats, atol=1e-3)
        return
    if on == "clips":  # no task's classes: a store that trains TAD alone recentres too
        assert acfg.recentre_clips
        _, acfg, _ = train_aam(data, cfg.replace(tasks=("tad",), selection="last"), log=None)
        assert acfg.recentre and acfg.centroids == max(2, sum(len(v.feats) for v in data.tad_train) // 16)
        return
    # AD trained too: its training videos' labels (normal / anomalous) are two more centroids; without task 'ar'
    # there are none: the adapter says so and publishes keep alone
    from splavu_core.aam.closed_form import recentre_classes

    full = load_training_data(store)
    _, labels = recentre_classes(full, ("ar", "ad"))
    assert {"anomaly=0", "anomaly=1"} <= set(labels) and set(labels) - {"anomaly=0", "anomaly=1"} == set(data.classes)
    _, acfg_ad, _ = train_aam(full, cfg.replace(tasks=("ar", "ad")), log=None)
    assert acfg_ad.centroids == len(data.classes) + 2 and recentre_classes(full, ("ar",))[1] == \
        [v.meta["action"] for v in full.ar_train]
    msgs = []
    tad_only = cfg.replace(tasks=("tad",), selection="last")
    _, acfg, _ = train_aam(data, tad_only, log=msgs.append)
    assert not acfg.recentre and any("recentre: off" in m for m in msgs)


@pytest.mark.parametrize("adapter,extra", [
    ({"keep": 4, "layers": 0, "mixer": "mlp", "projection_rank": 0}, {}),
    ({"keep": 4, "layers": 0, "mixer": "mlp", "projection_rank": 0, "recentre": True}, {"recentre_cluster_clips": 16}),
    ({"keep": 4, "layers": 0, "mixer": "mlp", "projection_rank": 0, "recentre": True}, {"recentre_on": "classes"}),
    ({"keep": 4, "layers": 0, "mixer": "mlp", "projection_rank": 0, "recentre": True, "recentre_draw": 4.0},
     {"recentre_cluster_clips": 16}),
    ({"keep": 4, "layers": 0, "mixer": "mlp", "projection_rank": 0}, {"keep_w_dynamic": 1.0, "keep_w_app": 1.0}),
    ({"keep": 4, "layers": 0, "mixer": "mlp", "projection_rank": 0, "recentre": True, "recentre_draw": 4.0, "recentre_top": 2},
     {"keep_w_app": 3.0, "keep_app_within": True, "recentre_cluster_clips": 16}),
    ({"keep": 4, "layers": 1, "mixer": "mlp", "hidden": 16, "projection_rank": 4}, {})])
def test_keep_training_never_reads_private_attribute_labels(tiny_store, tmp_path, adapter, extra):
    from splavu_core.aam.io import adapter_version
    from splavu_core.aam.config import TrainConfig
    from splavu_core.aam.train import train_aam
    from splavu_core.aam.training_data import load_training_data

    root = tmp_path / "store"
    shutil.copytree(tiny_store, root)
    store = FeatureStore(root)

    def version():
        cfg = TrainConfig.from_flat({**KEEP, "tasks": ("ar", "tad"), "adapter": adapter, **extra})
        a, acfg, _ = train_aam(load_training_data(store, ad=None), cfg, log=None)
        return adapter_version(a, acfg, store.encoder_fingerprint())

    before = version()
    assert flip_private_labels(root) >= 2, "the training datasets must carry attr_* labels for this to mean anything"
    assert version() == before, "the keep adapter changed when only private-attribute labels changed"


def test_a_keep_adapter_publishes_k_wide_tables_end_to_end(tiny_store, tmp_path, monkeypatch):
    """aam_model with keep = 4 (Dagster config, as a user sets it), then the shard's table, the catalog's typed
    view and the in-memory evaluation all see 4-wide features."""
    from assets.aam import aam_model
    from assets.resources import StoreResource
    from splavu_core.evaluation.scoring import score_sets
    from splavu_core.evaluation.suite import load_feature_sets
    from splavu_core.publish.anonymized_tables import anonymize_shard, load_video_features
    from splavu_core.serve.analyst import query
    from splavu_core.serve.catalog import build_catalog
    from splavu_core.store.ledger import read_versions, set_current

    root = tmp_path / "store"
    shutil.copytree(tiny_store, root)
    store = FeatureStore(root)
    res = dg.materialize([aam_model], resources={"store": StoreResource(root=str(root))}, run_config={"ops": {
        "aam_model": {"config": {"keep": 4, "layers": 0, "mixer": "mlp", "projection_rank": 0, "tasks": ["ar"], "diagnose_steps": 30,
                                 "operating_point": "as_given"}}}})
    version = res.asset_materializations_for_node("aam_model")[0].metadata["version"].value
    info = anonymize_shard(store, "ar-000", root / "aam" / version)
    assert info["dim"] == 4 and info["rows"] > 0
    t = pq.read_table(root / "anonymized" / version / "ar-000.parquet")
    assert t.schema.field("feature").type.list_size == 4
    set_current(store, version)
    build_catalog(store)
    width = query(store, "SELECT len(feature) AS n FROM anonymized_features LIMIT 1").to_pylist()[0]["n"]
    assert width == 4
    videos = load_video_features(store, source="anonymized", version=version, shards=["ar-000"])
    assert videos and all(v.feats.shape[1] == 4 for v in videos)
    assert version in read_versions(store)["version"].to_pylist()
    raw = load_feature_sets(store, ["ar"], "raw")
    rows = score_sets({"keep": {"ar": videos}}, ["ar"], {"ar": "ar"}, seeds=[0], versions={"keep": version})
    assert any(r["metric"] == "top1" for r in rows) and raw["ar"][0].feats.shape[1] > 4


def test_heldout_classes_fit_never_sees_the_classes_it_is_probed_on(tiny_store, monkeypatch):
    """New action classes: per fold the fit reads AR alone without the held-out classes, and AR is probed on
    those classes' videos only, raw vs member, with intervals."""
    from splavu_core.evaluation import keep_curve as kc

    store = FeatureStore(tiny_store)
    inp = kc.load_inputs(store)
    folds = 2
    assert len(inp.data.classes) >= 2 * folds, inp.data.classes
    fitted = []
    real = kc.fit_closed_form

    def spy(data, tasks, k, cfg):
        fitted.append((set(data.classes), {v.meta["action"] for v in data.ar_train + data.ar_val}, tuple(tasks)))
        return real(data, tasks, k, cfg)

    monkeypatch.setattr(kc, "fit_closed_form", spy)
    members = kc.heldout_classes(store, inp, [4], folds=folds, seeds=[0, 1], recentres=[True, False])
    assert len(members) == 2 * folds and len(fitted) == folds  # one fit per fold serves both members
    for m in members:
        classes, seen_actions, tasks = fitted[m["fold"]]
        unseen = set(m["unseen"])
        assert unseen == set(inp.data.classes[m["fold"]::folds]) and tasks == ("ar",)
        assert not unseen & classes and not unseen & seen_actions  # the fit never read a held-out class
        value, lo, hi, chance = m["raw_top1"]
        assert 0 < chance < 1 and set(m) >= {"k", "recentre", "fold", "unseen", "ar"}
        # raw's top-1 on the held-out classes' validation videos only: chance is 1 / their classes, and the
        # interval is the bootstrap's over those few videos (convex probe: the seeds agree): it has a width unless
        # the top-1 sits at a bound (every resample then scores the same)
        assert chance == pytest.approx(1 / len(unseen)) and (hi - lo > 0) == (0 < value < 1), (value, lo, hi)
        ret = m["ar"]  # retention on the held-out classes; NaN only when raw is at chance on them (tiny encoder)
        assert (ret[2] - ret[1] > 0) if not np.isnan(ret[0]) else lo <= chance
    assert {m["recentre"] for m in members} == {True, False}


def test_recentring_clusters_read_no_label(tiny_store):
    """The clusters come from the pool's kept clips alone: relabelling every training video (actions, segments,
    anomaly labels) changes neither the clips clustered nor which cluster each belongs to. Subject ids stay: they
    only pool clusters of too few people (recentre_min_people)."""
    import dataclasses

    from splavu_core.aam.closed_form import recentre_targets
    from splavu_core.aam.config import TrainConfig
    from splavu_core.aam.training_data import load_training_data

    data = load_training_data(FeatureStore(tiny_store))
    cfg = TrainConfig.from_flat({"recentre_cluster_clips": 16})
    rng = np.random.default_rng(0)
    proj = rng.standard_normal((data.dim, 4)).astype(np.float32)
    publish = lambda x: x @ proj  # noqa: E731  a fixed map: the keep fit (which reads utility labels) is not under test

    def relabel(vs):
        return [dataclasses.replace(v, meta={"action": "x", "segments": [], "anomaly": 0,
                                             "subject_id": v.meta.get("subject_id")}) for v in vs]

    means, labels = recentre_targets(data, ("ar", "tad", "ad"), cfg, publish)
    other = dataclasses.replace(data, ar_train=relabel(data.ar_train), tad_train=relabel(data.tad_train),
                                ad_train=relabel(data.ad_train))
    means2, labels2 = recentre_targets(other, ("ar", "tad", "ad"), cfg, publish)
    np.testing.assert_array_equal(means, means2)
    assert labels == labels2 and 2 <= len(set(labels)) <= len(means) // 16


def test_within_action_static_is_the_stills_scatter_inside_each_action():
    """keep_app_within's S_app input: each AR video's mean static clip minus its action's mean; other videos' statics
    (TAD, AD) are left out; the action label is the only label read."""
    from splavu_core.aam.keep import within_action_static

    rng = np.random.default_rng(0)
    static = rng.normal(size=(7, 3, 5)).astype(np.float32)
    ids = [f"v{i}" for i in range(7)]
    labels = [0, 0, 1, 1, 1, 0]                                  # v6 is no AR training video
    ar = [dataclasses.replace(v, video_id=f"v{i}") for i, v in enumerate(_videos([static[i] for i in range(6)],
                                                                                    labels))]
    out = within_action_static(static, ids, ar)
    assert out.shape == (6, 1, 5)
    means = static[:6].mean(1)
    for c in (0, 1):
        rows = [i for i, y in enumerate(labels) if y == c]
        np.testing.assert_allclose(out[rows, 0], means[rows] - means[rows].mean(0), atol=1e-6)
    with pytest.raises(ValueError, match="keep_app_within needs static clips of >= 2 AR training videos"):
        within_action_static(static, ids, ar[:1])


def test_every_recentring_centroid_averages_clips_of_at_least_min_people_people():
    """What a version's parameters hold of any one person: a k-means cluster of clips of fewer than
    recentre_min_people people is pooled into the nearest cluster that has them (closed_form.pooled_clusters)."""
    from splavu_core.aam.closed_form import pooled_clusters

    rng = np.random.default_rng(0)
    x = np.concatenate([rng.normal(c, 0.1, (20, 2)) for c in ((0, 0), (5, 0), (0, 5), (7, 1))])   # (80, 2)
    labels = np.repeat(np.arange(4), 20)
    people = np.concatenate([np.tile(np.arange(10), 6).astype(str), np.full(20, "loner")])  # cluster 3: one person
    out = pooled_clusters(x, labels, people, 3)
    assert set(out) == {0, 1, 2} and (out[:60] == labels[:60]).all()
    d = [np.linalg.norm(x[60:].mean(0) - x[labels == c].mean(0)) for c in range(3)]
    assert (out[60:] == int(np.argmin(d))).all()                           # joined the nearest cluster that has them
    assert all(len(set(people[out == c])) >= 3 for c in set(out))
    assert (pooled_clusters(x, labels, people, 1) == labels).all()         # 1: no guarantee asked, nothing pooled
    ten = pooled_clusters(x, labels, people, 10)                           # the 10 shared people hold clusters 0-2
    assert set(ten) == {0, 1, 2} and all(len(set(people[ten == c])) >= 10 for c in set(ten))
    two = pooled_clusters(x, labels, people, 11)                           # 11 people cannot hold 2 centroids of 11:
    assert len(set(two)) == 2                                               # two are kept, the record says how many
