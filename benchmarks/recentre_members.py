"""Members around the default's recentring, on validation (anonymizer v6's exploration; prints JSON lines).

    python benchmarks/recentre_members.py --store store [--cluster-seeds 0 1] [--members default tau0.05 ...]
        [--anchors anchors.npz] [--which privacy,clip_privacy,reid,ar]

Each member is the default (keep k = 11 + recentring on k-means clusters of the training clips) with one change to
how a clip is matched to the clusters or what replaces the video's mean, refitted from the store's cached latents
for each k-means seed (TrainConfig.seed) and scored by the gates' own scoring (score_features: the attacker and
reader suites, 5 probe seeds, bootstrap over people) beside the same-width PCA. Nothing is published. Members:

    default        the shipped default
    k<N>           the keep width N (the default 11)
    tau<T>         the posterior over centroids at temperature T (< 1 sharper, > 1 flatter)
    sample[-tau<T>]  one centroid DRAWN per clip from its posterior (randomised response; keyed by the clip's bytes
                   as the adapter keys it, keep.clip_uniforms: the same rows as recentre_draw) instead of the mean
    top<M>         the posterior cut to its M most likely centroids (renormalised) before the mean or the draw
    vid[-poe]      the video's MEAN matched and one centroid for the whole video (poe: at temperature T / its clips, the
                   product of its clips' posteriors); with sample, one draw per video keyed by the video's bytes
    split<A>       (with sample) the leading A keep directions (the most utility per unit of the rest) from the
                   posterior's mean at T = 1, as the default, and only the others from the drawn centroid
    salt<N>        (with sample) another draw of the same member: each clip's uniform shifted by N golden ratios mod 1,
                   for the spread of a drawn member's figures over draws
    clusters<N>    N training clips per centroid (the default 50: 80 centroids on the demo)
    blind<L>       matching that ignores appearance: the training static clips' between-video scatter (kept space),
                   L times the within-cluster covariance's trace, added to the matching covariance
    wapp<W>        the keep fit's keep_w_app = W (between-video static scatter avoided)
    wappw<W>       the same with keep_app_within: only the WITHIN-ACTION part of that scatter (each AR training video's
                   mean static clip minus its action's mean of them: who and where, not the action's context);
                   blindw<L>: the matching made blind to that part (as blind)
    ninit<N>       k-means keeps the best of N initialisations (the default 4): is the seed spread local optima?
    still[<F>]     the training static clips (one frame repeated: no motion) clustered too (F times as many clips per
                   cluster), every still cluster published as ONE vector (their mean): a clip that shows no motion
                   says nothing of who stands in it; reads no label
    dyn            the clusters drawn on what motion adds (the static-bearing training videos' clips minus their own
                   video's static clips' mean), their centroids the un-anchored clips' means: clusters of actions
                   that mix appearances; published videos matched as the default (no static clip needed)
    anchor         each clip minus its video's anchor (a static clip of the same video, encoded for EVERY video:
                   --anchors, written by benchmarks/anchor_sweep.py's encode_anchors) before keep and recentring
    ctx            anchor, plus the anchor's expected action context (with_anchor's context: class averages of the
                   AR training videos' anchors weighted by the anchor's action posterior)
    anchor-match   clusters and posterior on anchored clips, the published centroids un-anchored

Measured 2026-12-05 (demo store, world seeds 0 and 1): docs/history.md, "Anonymizer v6".
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import re
import time

import numpy as np
from sklearn.cluster import KMeans

from splavu_core.aam.closed_form import fit_utility_keep, n_centroids, recentre_pool
from splavu_core.aam.config import TrainConfig
from splavu_core.aam.keep import apply_keep, clip_uniforms, drawn, fit_recentre, top_cut, within_action_static
from splavu_core.aam.training_data import load_training_data
from splavu_core.evaluation import trivial
from splavu_core.evaluation.scoring import score_features
from splavu_core.evaluation.suite import load_feature_sets
from splavu_core.ingest.datasets import task_datasets
from splavu_core.store.feature_store import FeatureStore

KNOBS = ("default", "k", "tau", "sample", "clusters", "blind", "wapp", "ninit", "still", "dyn", "anchor", "match",
         "ctx", "top", "salt", "vid", "poe", "split", "wappw", "blindw")
METRICS = ("leakage_removed", "linkage_removed", "retention_top1", "retention_mAP", "retention_auc")


def parse(name: str) -> dict:
    """A member's name -> its changes from the default."""
    out = {}
    for part in name.split("-"):
        m = re.fullmatch(r"([a-z]+)([0-9.]*)", part)
        if not m or m[1] not in KNOBS:
            raise SystemExit(f"unknown member {name!r} (see the module doc)")
        out[m[1]] = float(m[2]) if m[2] else True
    return out


def with_anchor(data, raw, anchors, mu, context=False):
    """Each clip minus its video's anchor (plus the training anchors' mean); context: plus the anchor's expected
    action context instead, the AR training videos' mean anchor of each action weighted by a shrunk LDA's posterior
    of the video's anchor (utility labels only): what a still frame says about the action, in class averages."""
    shift = {i: mu for i in anchors}
    if context:
        from sklearn.discriminant_analysis import LinearDiscriminantAnalysis

        a = np.stack([anchors[v.video_id] for v in data.ar_train])
        y = np.array([v.meta["action"] for v in data.ar_train])
        lda = LinearDiscriminantAnalysis(solver="lsqr", shrinkage="auto").fit(a, y)
        means = np.stack([a[y == c].mean(0) for c in lda.classes_])                    # (C, D)
        ids = list(anchors)
        shift = dict(zip(ids, lda.predict_proba(np.stack([anchors[i] for i in ids])) @ means))

    def f(v):
        return dataclasses.replace(v, feats=(v.feats - anchors[v.video_id] + shift[v.video_id]).astype(np.float32))
    d = dataclasses.replace(data, ar_train=[f(v) for v in data.ar_train], ar_val=[f(v) for v in data.ar_val],
                            tad_train=[f(v) for v in data.tad_train], ad_train=[f(v) for v in data.ad_train])
    return d, {k: [f(v) for v in vs] for k, vs in raw.items()}


def member_map(m: dict, data, data_out, cfg: TrainConfig):
    """(clip latents matched (T, D), clip latents published (T, D)) -> (T, k) for one video."""
    cfg = cfg.replace(recentre_cluster_clips=int(m.get("clusters", cfg.recentre_cluster_clips)),
                      keep_w_app=float(m.get("wapp", m.get("wappw", cfg.keep_w_app))),
                      keep_app_within=bool(m.get("wappw")))  # wappw: only the within-action scatter of the stills
    k = int(m.get("k", cfg.keep))
    fit = fit_utility_keep(data, cfg.tasks, k, cfg)
    fit_out = fit_utility_keep(data_out, cfg.tasks, k, cfg) if data_out is not data else fit
    clips = np.concatenate([apply_keep(fit, v.feats) for v in recentre_pool(data, cfg.tasks)]).astype(np.float64)
    out = np.concatenate([apply_keep(fit_out, v.feats) for v in recentre_pool(data_out, cfg.tasks)])
    if m.get("dyn"):  # clusters drawn on what motion adds (each clip minus its own video's static clips' mean)
        moving = [a for a in data.static_actions if len(a)]
        anchor = [s.mean(0) for a, s in zip(data.static_actions, data.static) if len(a)]
        a_mu = np.mean(anchor, 0)
        clips = np.concatenate([apply_keep(fit, a) for a in moving]).astype(np.float64)
        out = np.concatenate([apply_keep(fit_out, a) for a in moving])
        dyn = np.concatenate([apply_keep(fit, a - s + a_mu) for a, s in zip(moving, anchor)]).astype(np.float64)
        c = max(2, len(dyn) // cfg.recentre_cluster_clips)
        lab = KMeans(c, n_init=int(m.get("ninit", 4)), random_state=cfg.seed).fit_predict(dyn)
    else:
        lab = KMeans(n_centroids(data, cfg.tasks, cfg), n_init=int(m.get("ninit", 4)),
                     random_state=cfg.seed).fit_predict(clips)
    labels = np.array([f"c{i:05d}" for i in lab])
    if m.get("still"):  # still clusters: k-means of the training static clips, each published as ONE still vector
        st = data.static.reshape(-1, data.static.shape[-1])
        sk = apply_keep(fit, st).astype(np.float64)
        n = max(2, round(len(sk) / cfg.recentre_cluster_clips * float(m["still"] if m["still"] is not True else 1)))
        slab = KMeans(n, n_init=4, random_state=cfg.seed).fit_predict(sk)
        clips, labels = np.concatenate([clips, sk]), np.concatenate([labels, [f"s{i:05d}" for i in slab]])
        still = apply_keep(fit_out, data_out.static.reshape(st.shape)).mean(0, keepdims=True)
        out = np.concatenate([out, np.repeat(still, len(sk), 0)])
    # the default's own fit (centroids, shrunk shared precision, gate): the matched rows' clusters; what a
    # centroid publishes is the mean of the same rows as published (un-anchored, still vector)
    rfit = fit_recentre(clips, labels, cfg.recentre_quantile, per_clip=True)
    classes = np.unique(labels)
    cent, prec, gate = rfit.centroids.astype(np.float64), rfit.precision.astype(np.float64), float(rfit.gate)
    cent_out = np.stack([out[labels == c].mean(0) for c in classes])                  # (C, k) published
    if m.get("blind") or m.get("blindw"):
        st = within_action_static(data.static, data.static_ids, data.ar_train) if m.get("blindw") else data.static
        app = apply_keep(fit, st.reshape(-1, st.shape[-1])).reshape(len(st), st.shape[1], k).mean(1)
        a = np.cov(app.astype(np.float64), rowvar=False)
        cov = np.linalg.inv(prec)
        prec = np.linalg.inv(cov + (m.get("blind") or m["blindw"]) * a * np.trace(cov) / np.trace(a))
        within = clips - cent[np.searchsorted(classes, labels)]
        gate = np.quantile(np.einsum("vk,kl,vl->v", within, prec, within), cfg.recentre_quantile)
    tau = float(m.get("tau", 1.0))

    def uniforms(x):  # (..., D) -> (...): keyed as the adapter keys them; salt N: shifted by N golden ratios mod 1
        return (clip_uniforms(x) + float(m.get("salt", 0)) * 0.6180339887) % 1.0

    def f(x, x_out):
        z, zo = apply_keep(fit, x), apply_keep(fit_out, x_out)
        if m.get("vid"):  # the video's mean matched, ONE centroid for the whole video (poe: temperature / clips)
            d = z.mean(0) - cent                                                            # (C, k)
            q = np.einsum("ck,kl,cl->c", d, prec, d)
            t = tau / (len(z) if m.get("poe") else 1)
            w = top_cut(np.exp(-0.5 * (q - q.min()) / t)[None], int(m.get("top", 0)))[0]
            w /= w.sum()
            if m.get("sample"):  # one draw keyed by the whole video's bytes
                w = drawn(w[None], uniforms(x.reshape(1, -1)))[0]
            s = min(1.0, gate / max(q.min(), 1e-12))
            return (zo + s * (w @ cent_out - zo.mean(0))).astype(np.float32)
        d = z[:, None, :] - cent
        q = np.einsum("tck,kl,tcl->tc", d, prec, d)                                     # (T, C)
        w = top_cut(np.exp(-0.5 * (q - q.min(1, keepdims=True)) / tau), int(m.get("top", 0)))
        w /= w.sum(1, keepdims=True)
        if m.get("sample"):  # one draw per clip, as the adapter's recentre_draw
            w = drawn(w, uniforms(x))
        target = w @ cent_out                                                           # (T, k)
        if m.get("split"):  # the leading `split` keep directions from the posterior's mean at T = 1, the rest drawn
            a = int(m["split"])
            w1 = np.exp(-0.5 * (q - q.min(1, keepdims=True)))
            target[:, :a] = (w1 / w1.sum(1, keepdims=True) @ cent_out)[:, :a]
        s = np.minimum(1.0, gate / np.maximum(q.min(1), 1e-12))
        return (zo + (s[:, None] * (target - zo)).mean(0)).astype(np.float32)
    return f


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--store", required=True)
    ap.add_argument("--members", nargs="+", default=["default", "tau0.05", "sample", "sample-tau4", "clusters200",
                                                     "wapp1", "blind1"])
    ap.add_argument("--cluster-seeds", type=int, nargs="+", default=[0, 1])
    ap.add_argument("--anchors", help="npz of per-video anchors (anchor, anchor-match members)")
    ap.add_argument("--which", default="privacy,clip_privacy,reid,ar")
    ap.add_argument("--probe-seeds", type=int, default=5)
    ap.add_argument("--pca", action="store_true", help="also score the same-width PCA (trivial baseline)")
    ap.add_argument("--unseen", action="store_true",
                    help="also each utility task of --which refitted WITHOUT its labels (leave one task out): "
                         "'<task>_unseen' keys")
    args = ap.parse_args(argv)
    store = FeatureStore(args.store)
    which = args.which.split(",")
    data = load_training_data(store)
    datasets = task_datasets(store, {})
    raw = load_feature_sets(store, which, "raw", datasets=datasets)
    cfg = TrainConfig()
    anchored = None
    if args.anchors:
        z = np.load(args.anchors)
        anchors = dict(zip(z["ids"].tolist(), z["anchors"]))
        mu = np.mean([anchors[v.video_id] for v in data.ar_train + data.tad_train + data.ad_train], 0)
        anchored = with_anchor(data, raw, anchors, mu)
        contexted = with_anchor(data, raw, anchors, mu, context=True)

    def scored(feats, tasks, suffix=""):
        rows = score_features(store, split="val", seeds=range(args.probe_seeds), which=tasks, features=feats)
        return {r["task"] + suffix: [round(r[x], 3) for x in ("value", "ci_low", "ci_high")]
                for r in rows if r["feature_set"] == "candidate" and r["metric"] in METRICS}

    def emit(name, seed, feats, t, extra=None):
        line = {"member": name, "cluster_seed": seed, **scored(feats, which), **(extra or {}),
                "seconds": round(time.perf_counter() - t, 1)}
        print(json.dumps(line), flush=True)

    if args.pca:
        t = time.perf_counter()
        k = cfg.keep
        emit(f"pca_{k}", None, trivial.baseline_sets(raw, trivial.training_clips(raw, datasets), k)[f"pca_{k}"], t)
    for name in args.members:
        m = parse(name)
        if (m.get("anchor") or m.get("match") or m.get("ctx")) and anchored is None:
            raise SystemExit(f"{name}: pass --anchors")
        uses_anchor = m.get("anchor") or m.get("match")
        fit_data, fit_raw = contexted if m.get("ctx") else anchored if uses_anchor else (data, raw)
        out_data, out_raw = (data, raw) if m.get("match") else (fit_data, fit_raw)
        def features(c):
            f = member_map(m, fit_data, out_data, c)
            return {d: [dataclasses.replace(v0, feats=f(v.feats, v0.feats)) for v, v0 in zip(vs, out_raw[d])]
                    for d, vs in fit_raw.items()}

        for seed in args.cluster_seeds:
            t = time.perf_counter()
            extra = {}
            for task in [x for x in cfg.tasks if x in which] if args.unseen else []:
                others = tuple(x for x in cfg.tasks if x != task)
                extra.update(scored(features(cfg.replace(seed=seed, tasks=others)), [task], "_unseen"))
            emit(name, seed, features(cfg.replace(seed=seed)), t, extra)


if __name__ == "__main__":
    main()
