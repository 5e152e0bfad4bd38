"""Private AND reusable? Label-free recentring members beside keep and the class recentring, on validation
(issue 40's exploration, prints JSON lines).

    python benchmarks/reuse_sweep.py --store store --k 14 --fits ar,tad,ad ar

Each member is fitted twice or more (--fits: the task sets whose labels the fit may read); a task outside a fit's
set is one it never saw, so "ar" alone reads TAD and AD as tasks nobody fitted for. Every member is scored in one
pass per fit by the attacker suite and the reader suite (keep_curve.score_family: probe seeds, a bootstrap over the
scored videos, raw's strongest judging). Members (all share the keep fit of their task set):

    keep            the keep subspace alone
    recentre        each video's kept mean -> its expected trained class (the default)
    codebook C      the same stage on C k-means clusters of the fitted tasks' training video means: no class label
    app r           class recentring confined to the r directions along which a video's kept mean follows its own
                    static clips (appearance, label-free): the rest of the mean (what unseen tasks read) stays
    codebook C app r  both
    clipwise C      k-means of the pool's kept clips; each clip's expected centroid, the video moved by the mean of
                    its clips' offsets (a video of several activities keeps its mix); C = 0: the config's count
                    (the default's stage); --strengths a < 1: moved that share of the way (" a0.5")
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import time

import numpy as np

from splavu_core.aam.keep import apply_keep, fit_recentre
from splavu_core.aam.closed_form import fit_utility_keep, n_centroids, recentre_classes
from splavu_core.evaluation import trivial
from splavu_core.evaluation.keep_curve import load_inputs, score_family
from splavu_core.store.feature_store import FeatureStore


def recentre_map(rfit, u=None):
    """Per-video map on kept clips: the mean moved to its expected centroid, only within span(u) when given."""
    def f(z):
        m = z.mean(0)
        d = m - rfit.centroids
        q = np.einsum("ck,kl,cl->c", d, rfit.precision, d)
        w = np.exp(-0.5 * (q - q.min()))
        w /= w.sum()
        scale = min(1.0, float(rfit.gate) / max(float(q.min()), 1e-12))
        off = scale * (w @ rfit.centroids - m)
        if u is not None:
            off = u @ (u.T @ off)
        return (z + off).astype(np.float32)
    return f


def clipwise_map(rfit, temperature=1.0, strength=1.0):
    """Per-video map on kept clips: each CLIP's expected centroid, and the video moved by the mean of its clips'
    offsets to them. A long video of several activities keeps its mix (each clip is matched on its own) while the
    offset every clip shares (who is in it) goes. strength < 1 moves it that share of the way (the frontier between
    keep alone, 0, and the full stage, 1)."""
    def f(z):
        d = z[:, None, :] - rfit.centroids[None]                                  # (T, C, k)
        q = np.einsum("tck,kl,tcl->tc", d, rfit.precision, d)                      # (T, C)
        w = np.exp(-0.5 * (q - q.min(1, keepdims=True)) / temperature)
        w /= w.sum(1, keepdims=True)
        s = np.minimum(1.0, float(rfit.gate) / np.maximum(q.min(1), 1e-12))        # (T,)
        off = strength * (s[:, None] * (w @ rfit.centroids - z)).mean(0)           # (k,)
        return (z + off).astype(np.float32)
    return f


def appearance_directions(data, fit) -> np.ndarray:
    """(k, k) orthonormal directions, most appearance-driven first: the kept video means regressed on the kept
    means of the same videos' static clips (ridge), and the principal directions of what that regression explains.
    Reads no label: static clips show who and where, one frame, no motion."""
    keep_idx = [i for i, a in enumerate(data.static_actions) if len(a)]
    a = np.stack([apply_keep(fit, data.static[i]).mean(0) for i in keep_idx]).astype(np.float64)    # (V, k)
    m = np.stack([apply_keep(fit, data.static_actions[i]).mean(0) for i in keep_idx]).astype(np.float64)
    a, m = a - a.mean(0), m - m.mean(0)
    lam = 1e-2 * np.trace(a.T @ a) / a.shape[1]
    b = np.linalg.solve(a.T @ a + lam * np.eye(a.shape[1]), a.T @ m)                                  # (k, k)
    p = a @ b                                                                                        # explained part
    w, v = np.linalg.eigh(p.T @ p)
    order = np.argsort(w)[::-1]
    share = w[order] / max(w.sum(), 1e-12)
    r2 = 1 - ((m - p) ** 2).sum() / (m ** 2).sum()
    return v[:, order], share, float(r2)


def members_of(inp, tasks, k, codebooks, ranks, seed=0, pool_all=False, quantiles=(), clip_codebooks=(),
               temperatures=(1.0,), strengths=(1.0,), gate_mults=(1.0,), appfree_ranks=()):
    from sklearn.cluster import KMeans

    d = inp.data
    fit = fit_utility_keep(d, tasks, k, inp.cfg)
    keep = lambda f: apply_keep(fit, f)  # noqa: E731
    out = {"keep": keep}
    info = {}
    videos, labels = recentre_classes(d, tasks)
    dirs, share, r2 = appearance_directions(d, fit)
    info["appearance_r2"] = round(r2, 3)
    info["appearance_share"] = [round(float(s), 3) for s in share[:8]]
    rf = None
    if len(set(labels)) >= 2:
        means = np.stack([keep(v.feats).mean(0) for v in videos])
        rf = fit_recentre(means, labels, inp.cfg.recentre_quantile)
        out["recentre"] = lambda f, m=recentre_map(rf): m(keep(f))
        for r in ranks:
            out[f"app {r}"] = lambda f, m=recentre_map(rf, dirs[:, :r]): m(keep(f))
    train = {"ar": d.ar_train, "tad": d.tad_train, "ad": d.ad_train}
    pool = [v for t in (train if pool_all else tasks) for v in train[t]]  # pool_all: every training video, unlabelled
    pm = np.stack([keep(v.feats).mean(0) for v in pool])
    for c in codebooks:
        lab = KMeans(c, n_init=4, random_state=seed).fit_predict(pm).astype(str)
        cf = fit_recentre(pm, lab, inp.cfg.recentre_quantile)
        out[f"codebook {c}"] = lambda f, m=recentre_map(cf): m(keep(f))
        for qt in quantiles:
            cq = fit_recentre(pm, lab, qt)
            out[f"codebook {c} q{qt:g}"] = lambda f, m=recentre_map(cq): m(keep(f))
        for r in ranks:
            out[f"codebook {c} app {r}"] = lambda f, m=recentre_map(cf, dirs[:, :r]): m(keep(f))
    pc = np.concatenate([keep(v.feats) for v in pool])                              # (N, k) kept clips
    for c in clip_codebooks:
        c = c or n_centroids(d, tasks, inp.cfg)  # 0: as many as the config's recentring fits
        lab = KMeans(c, n_init=4, random_state=seed).fit_predict(pc).astype(str)
        for qt in dict.fromkeys([inp.cfg.recentre_quantile, *quantiles]):
            cf0 = fit_recentre(pc, lab, qt)
            for g in gate_mults:
                cf = dataclasses.replace(cf0, gate=np.asarray(cf0.gate * g, np.float32))
                for t in temperatures:
                    for a in strengths:
                        out[f"clipwise {c} q{qt:g}" + (f" t{t:g}" if t != 1 else "") + (f" a{a:g}" if a != 1 else "")
                            + (f" g{g:g}" if g != 1 else "")] = lambda f, m=clipwise_map(cf, t, a): m(keep(f))
    for r in appfree_ranks:  # cluster clips on what is not appearance: the top-r label-free appearance directions out
        c = n_centroids(d, tasks, inp.cfg)
        u = dirs[:, :r]
        lab = KMeans(c, n_init=4, random_state=seed).fit_predict(pc - (pc @ u) @ u.T).astype(str)
        cf0 = fit_recentre(pc, lab, inp.cfg.recentre_quantile)
        for g in gate_mults:
            cf = dataclasses.replace(cf0, gate=np.asarray(cf0.gate * g, np.float32))
            out[f"clipwise {c} appfree {r}" + (f" g{g:g}" if g != 1 else "")] = \
                lambda f, m=clipwise_map(cf): m(keep(f))
    return out, info


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--store", default="store")
    ap.add_argument("--k", type=int, default=14)
    ap.add_argument("--fits", nargs="+", default=["ar,tad,ad", "ar"])
    ap.add_argument("--codebooks", type=int, nargs="*", default=[15, 40])
    ap.add_argument("--ranks", type=int, nargs="*", default=[4, 8])
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--split", default="val")
    ap.add_argument("--pool-all", action="store_true", help="codebooks on every training video (unlabelled), not "
                    "only the fitted tasks' videos")
    ap.add_argument("--clip-codebooks", type=int, nargs="*", default=[],
                    help="clipwise members: k-means of the pool's kept CLIPS, each clip matched on its own")
    ap.add_argument("--temperatures", type=float, nargs="*", default=[1.0],
                    help="clipwise members: posterior temperatures (> 1: softer matching)")
    ap.add_argument("--strengths", type=float, nargs="*", default=[1.0],
                    help="clipwise members: the share of the way each video is moved (0: keep alone; 1: the stage)")
    ap.add_argument("--gate-mults", type=float, nargs="*", default=[1.0],
                    help="clipwise members: the gate (distance past which a clip is moved less) times these (1e9: none)")
    ap.add_argument("--appfree-ranks", type=int, nargs="*", default=[],
                    help="clipwise members clustered with the top-r label-free appearance directions projected out")
    ap.add_argument("--quantiles", type=float, nargs="*", default=[], help="codebooks' gate quantiles beside the config's")
    ap.add_argument("--members", nargs="*", help="only these member names (default: all)")
    ap.add_argument("--pca", action="store_true", help="score the same-width PCA beside")
    args = ap.parse_args()
    store = FeatureStore(args.store)
    t0 = time.perf_counter()
    inp = load_inputs(store)
    sets, members = {}, []
    for fit_tasks in args.fits:
        tasks = tuple(t for t in fit_tasks.split(",") if t and t in inp.cfg.tasks)
        maps, info = members_of(inp, tasks, args.k, args.codebooks, args.ranks, pool_all=args.pool_all,
                                quantiles=args.quantiles, clip_codebooks=args.clip_codebooks,
                                temperatures=args.temperatures, strengths=args.strengths,
                                gate_mults=args.gate_mults, appfree_ranks=args.appfree_ranks)
        maps = {n: f for n, f in maps.items() if not args.members or n in args.members}
        print(json.dumps({"fit": list(tasks), **info}), flush=True)
        for name, fn in maps.items():
            full = f"{name} | fit {','.join(tasks)}"
            sets[full] = {ds: [dataclasses.replace(v, feats=fn(v.feats)) for v in vs] for ds, vs in inp.raw.items()}
            members.append({"name": full, "k": args.k, "seen": list(tasks)})
    if args.pca:
        base = trivial.baseline_sets(inp.raw, trivial.training_clips(inp.raw, inp.datasets), args.k)
        sets[f"pca_{args.k}"] = base[f"pca_{args.k}"]
        members.append({"name": f"pca_{args.k}", "k": args.k, "seen": []})
    raw = score_family(store, inp, sets, members, [], split=args.split, seeds=args.seeds)
    for m in members:
        print(json.dumps(m), flush=True)
    print(json.dumps({"split": args.split, "raw": raw, "seconds": round(time.perf_counter() - t0, 1)}), flush=True)


if __name__ == "__main__":
    main()
