"""Three frontiers on one store's cached latents (prints JSON; research, not the product): the closed form (the keep
family with recentring), a learned stage (below; label-free: its adversary reads subject ids of training videos) and
the oracle, which reads the training videos' PRIVATE attribute labels and is never shipped. Member kinds:

    closed            closed k=K: keep k = K + recentring, the default's family (k = 11 is the default); k20-within
    learned           the learned stage against a subject adversary of weight l, seed s, recentred
    learned-stills    the same with the adversary on the static clips alone
    learned-offsets   no adversary: each clip regressed onto itself less l x its person's mean offset
    oracle-keep       keep k = K whose fit also avoids the attribute classes' scatter (weight w)
    oracle-stage      the learned stage against an attribute adversary
    oracle-mmd        the learned stage with an MMD between the clips with and without each attribute
    oracle-both       the learned stage against the subject adversary AND the attribute MMD: what the label-free
                      stage reads, plus the labels
    baselines         pca_K / randproj_K: trivial baselines of the same width (evaluation/trivial.py)

Every member is scored by the gates' own scoring (the attacker suite's strongest, raw's strongest reader, 5 probe
seeds, intervals over people) on --split (choose on val, report on test). Each run merges its members into --record
(a JSON file: per store and split, members by name), so a run can be resumed or extended. --plot draws a record
file's frontiers (close-ups removed against AR retention, one panel per store) and prints each learned or oracle
point's gain over the closed form at equal AR.

    python benchmarks/frontier.py --store store --split val --members closed learned oracle-both --record docs/frontier.json
    python benchmarks/frontier.py --plot docs/frontier.json --split val --png docs/frontier.png
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
from safetensors.torch import load_file, save_file

from splavu_core.aam.closed_form import fit_closed_form, fit_utility_keep, recentre_targets
from splavu_core.aam.keep import KeepFit, apply_recentre, fit_recentre, task_clips
from splavu_core.aam.training_data import TrainingData, load_oracle_labels
from splavu_core.evaluation import trivial
from splavu_core.evaluation.keep_curve import load_inputs, score_family
from splavu_core.store import costs
from splavu_core.store.feature_store import FeatureStore

PARTS = ("privacy", "clip_privacy", "reid", "ar", "tad", "ad")
KINDS = ("closed", "oracle-keep", "oracle-stage", "oracle-mmd", "oracle-both", "learned", "learned-stills", "learned-offsets", "baselines")


# ---------------------------------------------------------------- the learned stage
# A learned stage in keep's place, trained on cached latents. Research, measured here beside the closed form and
# the oracle; not a product option (docs/limitations.md says why).
#
#     g(x) = Qᵀ(x − μ) + W₂ gelu(W₁ (x − μ)/σ + b₁)        (T, D) -> (T, k); W₂ = 0 at the start: g starts as the keep fit
#     loss = Σ_t CE(head_t(g), y_t)                          utility: keep's own labels (AR action, TAD class/phase, AD)
#          + anchor · ‖g − keep‖² / E‖keep‖²                stay near the closed form: what no head reads is not thrown away
#          + lam · CE(adv(g), prior)                         push the adversary to the prior: it cannot tell who it sees
#     adv: k -> 512 -> out MLP (the attacker suite's mlp width), trained in alternation on g detached, adv_steps per step
#       "subjects":  which training subject a clip shows (subject ids of training videos: LABEL-FREE, no private
#                    attribute is read; the label-flip test covers it); "stills": the same on the static clips alone;
#       "offsets":   no adversary: each clip regressed onto itself less lam x its person's mean offset
#       THE ORACLE (the training videos' private attribute labels; never shipped, never a default): "attributes" (an
#       attribute adversary), "attributes-mmd" (an MMD per attribute instead), "subjects+attributes" (both terms)
#
# Recentring is fitted on g's clips as the default fits it on keep's (learned_map). Seeded and deterministic on
# CPU. A checkpoint (safetensors: stage, heads, adversary, both optimisers' moments; the epoch and the config in its
# metadata) is written every `save_every` epochs; a fit given the same path resumes from it.



@dataclasses.dataclass(frozen=True)
class StageConfig:
    adversary: str = "subjects"     # what the stage hides (the comment above); "attributes*" read private labels
    lam: float = 1.0                # weight of confusing the adversary
    anchor: float = 1.0             # weight of staying near the keep fit
    hidden: int = 256
    adv_hidden: int = 512
    epochs: int = 40
    batch: int = 512
    lr: float = 1e-3
    adv_steps: int = 2
    tad_phases: int = 3
    seed: int = 0
    save_every: int = 10


class Stage(nn.Module):
    def __init__(self, keep: KeepFit, std: np.ndarray, hidden: int):
        super().__init__()
        D, k = keep.proj.shape
        self.register_buffer("mean", torch.from_numpy(np.asarray(keep.mean, np.float32)))
        self.register_buffer("std", torch.from_numpy(np.asarray(std, np.float32)))
        self.register_buffer("proj", torch.from_numpy(np.asarray(keep.proj, np.float32)))
        self.inp = nn.Linear(D, hidden)
        self.out = nn.Linear(hidden, k)
        nn.init.zeros_(self.out.weight)
        nn.init.zeros_(self.out.bias)

    def keep(self, x: torch.Tensor) -> torch.Tensor:
        return (x - self.mean) @ self.proj                                   # (N, k)

    def forward(self, x: torch.Tensor) -> torch.Tensor:                   # (N, D) -> (N, k)
        return self.keep(x) + self.out(F.gelu(self.inp((x - self.mean) / self.std)))

    def numpy_map(self):
        def f(x: np.ndarray) -> np.ndarray:
            with torch.no_grad():
                return self(torch.from_numpy(np.ascontiguousarray(x, np.float32))).numpy()
        return f


def utility_sets(data: TrainingData, tasks, tad_phases: int) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """task -> ((N, D) clips, (N,) int labels): the labels the keep fit reads (keep.task_clips)."""
    train = {"ar": data.ar_train, "tad": data.tad_train, "ad": data.ad_train}
    out = {}
    for t in tasks:
        if train.get(t):
            x, y = task_clips(t, train[t], tad_phases)
            _, yi = np.unique(y, return_inverse=True)
            if yi.max() > 0:
                out[t] = (x.astype(np.float32), yi.astype(np.int64))
    return out


ORACLES = ("attributes", "attributes-mmd", "subjects+attributes")
ADVERSARIES = ("subjects", "stills", "offsets", *ORACLES)


def adversary_set(data: TrainingData, adversary: str) -> tuple[np.ndarray, np.ndarray | None, np.ndarray | None]:
    """((N, D) clips, (N,) who each shows as an int or None, (N, A) private attributes or None) for `adversary`.
    subjects: every clip of every training video and the static clips; stills: the static clips; the oracles: the
    static videos' static and moving clips, with data.attributes (which only load_oracle_labels sets)."""
    if adversary not in ADVERSARIES:
        raise ValueError(f"adversary must be one of {ADVERSARIES}, got {adversary!r}")
    videos = {v.video_id: v for v in data.ar_train + data.tad_train + data.ad_train}
    static_who = [videos[vid].meta.get("subject_id") if vid in videos else vid for vid in data.static_ids]
    xs, who, attrs = [], [], None
    if adversary in ORACLES:
        if data.attributes is None:
            raise ValueError("the attribute oracles need load_oracle_labels(store, data)")
        rows = []
        for i, sid in enumerate(static_who):
            c = np.concatenate([data.static[i]] + ([data.static_actions[i]] if data.static_actions is not None else []))
            xs.append(c)
            who.append([sid] * len(c))
            rows.append(np.repeat(data.attributes[i][None], len(c), 0))
        attrs = np.concatenate(rows).astype(np.float32)
    else:
        if adversary != "stills":  # stills: the static clips alone (no action in them to lose)
            xs = [v.feats for v in videos.values()]
            who = [[v.meta.get("subject_id")] * len(v.feats) for v in videos.values()]
        xs += list(data.static)
        who += [[sid] * len(c) for sid, c in zip(static_who, data.static)]
    _, y = np.unique(np.concatenate(who).astype(str), return_inverse=True)
    return np.concatenate(xs).astype(np.float32), y.astype(np.int64), attrs


def _confusion(logits: torch.Tensor, adversary: str, prior: torch.Tensor) -> torch.Tensor:
    """Cross-entropy of the adversary's prediction to the labels' prior: lowest when it says nothing."""
    if adversary == "attributes":
        return F.binary_cross_entropy_with_logits(logits, prior.expand_as(logits))
    return -(prior * F.log_softmax(logits, -1)).sum(-1).mean()


def _mmd(z: torch.Tensor, groups: torch.Tensor) -> torch.Tensor:
    """Σ_j MMD² between the clips with attribute j and those without (Gaussian kernels at 0.5, 1 and 2 times the
    median squared distance): zero when no attribute changes the distribution of z."""
    d2 = torch.cdist(z, z).pow(2)
    med = d2.detach().median().clamp_min(1e-6)
    kern = sum(torch.exp(-d2 / (b * med)) for b in (0.5, 1.0, 2.0))
    out = z.new_zeros(())
    for j in range(groups.shape[1]):
        a = groups[:, j] > 0.5
        if 1 < a.sum() < len(a) - 1:
            out = out + kern[a][:, a].mean() + kern[~a][:, ~a].mean() - 2 * kern[a][:, ~a].mean()
    return out


def _adv_loss(logits: torch.Tensor, y: torch.Tensor, adversary: str) -> torch.Tensor:
    return F.binary_cross_entropy_with_logits(logits, y) if adversary == "attributes" else F.cross_entropy(logits, y)


def _opt_tensors(prefix: str, opt: torch.optim.Optimizer) -> dict:
    return {f"{prefix}/{i}/{k}": v for i, s in opt.state_dict()["state"].items() for k, v in s.items()}


def _load_opt(opt: torch.optim.Optimizer, prefix: str, tensors: dict) -> None:
    sd = opt.state_dict()
    state: dict = {}
    for key, v in tensors.items():
        if key.startswith(prefix + "/"):
            _, i, k = key.split("/")
            state.setdefault(int(i), {})[k] = v
    opt.load_state_dict({"state": state, "param_groups": sd["param_groups"]})


def fit_stage(data: TrainingData, tasks, keep: KeepFit, cfg: StageConfig, checkpoint: str | Path | None = None,
              log=None) -> Stage:
    """The stage fitted from `keep` (its start) on the training data; resumes from `checkpoint` when it holds one of
    this config, writes it every cfg.save_every epochs."""
    torch.manual_seed(cfg.seed)
    util = utility_sets(data, tasks, cfg.tad_phases)
    if not util:
        raise ValueError("the learned stage needs the training videos of at least one utility task")
    xa, who, groups = adversary_set(data, cfg.adversary)
    ya = groups if cfg.adversary in ("attributes", "attributes-mmd") else who  # what the adversary reads
    both = cfg.adversary == "subjects+attributes"  # the adversary reads who, the MMD the attributes
    allx = np.concatenate([x for x, _ in util.values()] + [xa])
    stage = Stage(keep, allx.std(0) + 1e-6, cfg.hidden)
    k = keep.proj.shape[1]
    heads = nn.ModuleDict({t: nn.Linear(k, int(y.max()) + 1) for t, (_, y) in util.items()})
    out = ya.shape[1] if ya.ndim == 2 else int(ya.max()) + 1
    adv = nn.Sequential(nn.Linear(k, cfg.adv_hidden), nn.GELU(), nn.Linear(cfg.adv_hidden, out))
    prior = torch.from_numpy(ya.mean(0)) if ya.ndim == 2 else \
        torch.from_numpy(np.bincount(ya, minlength=out) / len(ya)).float()
    opt = torch.optim.AdamW([*stage.parameters(), *heads.parameters()], lr=cfg.lr, weight_decay=1e-4)
    opt_adv = torch.optim.AdamW(adv.parameters(), lr=cfg.lr, weight_decay=1e-4)
    with torch.no_grad():
        scale = float(stage.keep(torch.from_numpy(allx)).pow(2).sum(1).mean())
        if cfg.adversary == "offsets":  # each training person's mean kept clip, less everyone's: what says who it is
            ka = stage.keep(torch.from_numpy(xa)).double()
            per = torch.zeros(int(ya.max()) + 1, k, dtype=torch.float64).index_add_(0, torch.from_numpy(ya), ka)
            per = per / torch.from_numpy(np.bincount(ya)).double()[:, None]
            offsets = (per - ka.mean(0)).float()                                       # (people, k)
    tensors = {k: torch.from_numpy(v) for k, v in (("xa", xa), ("ya", ya), ("groups", groups)) if v is not None}
    util_t = {t: (torch.from_numpy(x), torch.from_numpy(y)) for t, (x, y) in util.items()}
    start, meta = 0, json.dumps(dataclasses.asdict(cfg), sort_keys=True)
    path = Path(checkpoint) if checkpoint else None
    if path and path.exists():
        from safetensors import safe_open
        with safe_open(str(path), "pt") as f:
            saved = f.metadata() or {}
        if saved.get("config") == meta:
            st = load_file(str(path))
            for name, mod in (("stage", stage), ("heads", heads), ("adv", adv)):
                mod.load_state_dict({k[len(name) + 1:]: v for k, v in st.items() if k.startswith(name + ".")})
            _load_opt(opt, "opt", st)
            _load_opt(opt_adv, "opt_adv", st)
            start = int(saved["epoch"])
    n_steps = int(np.ceil(max(len(xa), *(len(x) for x, _ in util.values())) / cfg.batch))
    for epoch in range(start, cfg.epochs):
        if epoch % cfg.save_every == 0 or epoch == start:  # batches drawn from the epoch: a resumed fit draws the same
            rng = np.random.default_rng([cfg.seed, epoch])
        order = {t: rng.permutation(np.resize(np.arange(len(x)), n_steps * cfg.batch)) for t, (x, _) in util.items()}
        order_a = rng.permutation(np.resize(np.arange(len(xa)), n_steps * cfg.batch))
        for s in range(n_steps):
            sl = slice(s * cfg.batch, (s + 1) * cfg.batch)
            bx, by = tensors["xa"][order_a[sl]], tensors["ya"][order_a[sl]]
            opt.zero_grad()
            if cfg.adversary == "offsets":          # regress each clip onto itself less lam x its person's offset
                target = stage.keep(bx) - cfg.lam * offsets[by]
                loss = (stage(bx) - target).pow(2).sum(1).mean() / scale
            elif cfg.adversary == "attributes-mmd":  # no adversary: the attributes' groups made alike in distribution
                loss = cfg.lam * _mmd(stage(bx), by)
            else:
                for _ in range(cfg.adv_steps):      # the adversary catches up with the stage as it is now
                    opt_adv.zero_grad()
                    _adv_loss(adv(stage(bx).detach()), by, cfg.adversary).backward()
                    opt_adv.step()
                z = stage(bx)
                loss = cfg.lam * _confusion(adv(z), cfg.adversary, prior)
                if both:
                    loss = loss + cfg.lam * _mmd(z, tensors["groups"][order_a[sl]])
            for t, (x, y) in util_t.items():
                idx = order[t][sl]
                z = stage(x[idx])
                loss = loss + F.cross_entropy(heads[t](z), y[idx])
                loss = loss + cfg.anchor * (z - stage.keep(x[idx])).pow(2).sum(1).mean() / scale
            loss.backward()
            opt.step()
        done = epoch + 1
        if path and (done % cfg.save_every == 0 or done == cfg.epochs):
            st = {**{f"stage.{k}": v for k, v in stage.state_dict().items()},
                  **{f"heads.{k}": v for k, v in heads.state_dict().items()},
                  **{f"adv.{k}": v for k, v in adv.state_dict().items()},
                  **_opt_tensors("opt", opt), **_opt_tensors("opt_adv", opt_adv)}
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(".tmp")
            save_file({k: v.contiguous() for k, v in st.items()}, str(tmp), metadata={"config": meta,
                                                                                     "epoch": str(done)})
            tmp.replace(path)
        if log and (done % 10 == 0 or done == cfg.epochs):
            log(f"learned stage ({cfg.adversary}, lam {cfg.lam:g}, seed {cfg.seed}): epoch {done}/{cfg.epochs}, "
                f"loss {loss.item():.3f}")
    stage.eval()
    return stage


def attribute_rows(data) -> np.ndarray:
    """(A·V, 1, D): per attribute and static video, the mean static clip of the videos sharing its value. The keep
    fit's S_app (the between-row scatter, trace-normalised) is then the sum of the attributes' between-class scatters."""
    means = data.static.astype(np.float64).mean(1)                                     # (V, D)
    rows = []
    for a in data.attributes.T:                                                         # (V,) per attribute
        rows.append(np.where(a[:, None] > 0.5, means[a > 0.5].mean(0), means[a <= 0.5].mean(0)))
    return np.concatenate(rows)[:, None, :].astype(np.float32)


def learned_map(data, tasks, cfg, publish):
    """publish (T, D) -> (T, k), then recentring fitted on its clips as the default fits it on keep's."""
    means, labels = recentre_targets(data, tasks, cfg, publish)
    fit = fit_recentre(means, labels, cfg.recentre_quantile, per_clip=cfg.recentre_on == "clips")
    return lambda f: apply_recentre(fit, publish(f))


def members_of(kind: str, inp, store, ks, ws, lams, stage_seeds, ckpt_dir, log, only=(), **stage_kw):
    """name -> (per-video map, the member's fields); only: these names alone (none fitted but them)."""
    data, cfg, tasks = inp.data, inp.cfg, inp.cfg.tasks
    wanted = lambda name: not only or name in only  # noqa: E731
    out = {}
    if kind == "closed":
        for k in ks:
            if wanted(f"closed k={k}"):
                out[f"closed k={k}"] = (fit_closed_form(data, tasks, k, cfg)[True], {"k": k})
        if wanted("closed k20-within"):
            within = cfg.replace(keep=20, keep_w_app=3.0, keep_app_within=True)
            out["closed k20-within"] = (fit_closed_form(data, tasks, 20, within)[True], {"k": 20, "within": True})
    elif kind == "oracle-keep":
        odata = load_oracle_labels(store, data)
        adata = dataclasses.replace(odata, static=attribute_rows(odata), static_actions=None)
        for k in ks:
            for w in ws:
                c = cfg.replace(keep_w_app=w, keep_app_within=False, keep_w_dynamic=0.0)
                if wanted(f"oracle keep k={k} w={w:g}"):
                    out[f"oracle keep k={k} w={w:g}"] = (fit_closed_form(adata, tasks, k, c)[True], {"k": k, "w": w})
    elif kind in ("oracle-stage", "oracle-mmd", "oracle-both", "learned", "learned-stills", "learned-offsets"):
        adversary = {"oracle-stage": "attributes", "oracle-mmd": "attributes-mmd",
                     "oracle-both": "subjects+attributes", "learned": "subjects",
                     "learned-stills": "stills", "learned-offsets": "offsets"}[kind]
        oracle = kind.startswith("oracle")
        sdata = load_oracle_labels(store, data) if oracle else data
        for k in ks:
            keep = fit_utility_keep(data, tasks, k, cfg)
            for lam in lams:
                for seed in (stage_seeds[:1] if oracle else stage_seeds):
                    scfg = StageConfig(adversary=adversary, lam=lam, seed=seed, **stage_kw)
                    extra = "".join(f" {f.name}={getattr(scfg, f.name):g}" for f in dataclasses.fields(scfg)
                                    if f.name in stage_kw and getattr(scfg, f.name) != f.default)
                    name = f"{kind.replace('-', ' ')} k={k} l={lam:g}{extra}" + ("" if oracle else f" s={seed}")
                    if not wanted(name):
                        continue
                    t0 = time.perf_counter()
                    ck = Path(ckpt_dir) / (name.replace(" ", "_").replace("=", "") + ".safetensors") if ckpt_dir else None
                    stage = fit_stage(sdata, tasks, keep, scfg, ck, log=log)
                    out[name] = (learned_map(data, tasks, cfg, stage.numpy_map()),
                                 {"k": k, "lam": lam, "seed": seed, **stage_kw,
                                  "fit_seconds": round(time.perf_counter() - t0, 1)})
    elif kind == "baselines":
        clips = trivial.training_clips(inp.raw, inp.datasets)
        for k in ks:
            for name, (mu, q) in trivial.fit(clips, k).items():
                if wanted(name):
                        out[name] = (lambda x, mu=mu, q=q: ((np.asarray(x, np.float64) - mu) @ q).astype(np.float32),
                                 {"k": k})
    else:
        raise ValueError(f"unknown member kind {kind!r}; choose from {KINDS}")
    return out


def run(args) -> dict:
    store = FeatureStore(args.store)
    inp = load_inputs(store)
    which = [t for t in PARTS if t in inp.datasets and t in inp.which and t in args.parts]
    inp = dataclasses.replace(inp, which=which)
    record_path = Path(args.record)
    records = json.loads(record_path.read_text()) if record_path.is_file() else []
    key = {"store": str(args.store), "encoder": store.encoder_fingerprint(), "split": args.split}
    entry = next((r for r in records if all(r.get(k) == v for k, v in key.items())), None)
    if entry is None:
        entry = {**key, "members": []}
        records.append(entry)
    if args.label:
        entry["label"] = args.label
    for kind in args.members:
        ks = args.k_closed if kind in ("closed", "oracle-keep") else args.k
        built = members_of(kind, inp, store, ks, args.w, args.lam, args.stage_seeds, args.checkpoints,
                           print if args.verbose else None, only=args.only or (), epochs=args.epochs,
                           anchor=args.anchor, adv_steps=args.adv_steps)
        sets = {n: {d: [dataclasses.replace(v, feats=np.ascontiguousarray(fn(v.feats), np.float32)) for v in vs]
                    for d, vs in inp.raw.items()} for n, (fn, _) in built.items()}
        members = [{"name": n, "kind": kind, **fields} for n, (_, fields) in built.items()]
        t0 = time.perf_counter()
        score_family(store, inp, sets, members, [], split=args.split, seeds=args.seeds)
        for m in members:
            m["score_seconds"] = round((time.perf_counter() - t0) / max(len(members), 1), 1)
            old = next((o for o in entry["members"] if o["name"] == m["name"]), None)
            if old:
                old.update(m)
            else:
                entry["members"].append(m)
            print(json.dumps(m))
        entry.update(costs.provenance())
        tmp = record_path.with_name(record_path.name + ".tmp")
        tmp.write_text(json.dumps(records, indent=1) + "\n")
        tmp.replace(record_path)
    return entry


# ---------------------------------------------------------------- the plot

STYLE = {"closed": ("closed form (keep k + recentring)", "o-", "tab:blue"),
         "learned": ("learned stage, label-free (median of seeds, range)", "s-", "tab:green"),
         "oracle-both": ("oracle: subject adversary + attribute MMD", "^-", "tab:red"),
         "oracle-stage": ("oracle: attribute adversary", "^:", "salmon"),
         "oracle-mmd": ("oracle: attribute MMD", "d:", "darkred"),
         "oracle-keep": ("oracle keep (avoids attribute scatter)", "v:", "tab:orange"),
         "baselines": ("PCA / random projection, same width", "x", "grey")}


def series(entry: dict, kind: str) -> list[tuple[float, float, float, float, str]]:
    """(close-ups removed, its spread low, high, AR, label) per point of `kind`; the learned stage's seeds pooled per
    (k, lam) to their median, the spread their range."""
    ms = [m for m in entry["members"] if m.get("kind") == kind and "privacy" in m and "ar" in m]
    if kind != "learned":
        return [(m["privacy"][0], m["privacy"][1], m["privacy"][2], m["ar"][0], m["name"]) for m in ms]
    groups: dict = {}
    for m in ms:  # one point per configuration: the name less its seed
        groups.setdefault(m["name"].rsplit(" s=", 1)[0], []).append(m)
    out = []
    for name, g in sorted(groups.items(), key=lambda kv: (kv[1][0]["k"], kv[1][0]["lam"], kv[0])):
        p = [m["privacy"][0] for m in g]
        out.append((float(np.median(p)), min(p), max(p), float(np.median([m["ar"][0] for m in g])),
                    f"{name} ({len(g)} seeds)"))
    return out


def gains(entry: dict, kind: str = "learned", floor: float = 0.95) -> list[dict]:
    """Each point of `kind` (series) against the closed form at equal AR: its close-up removal less the closed form's
    best among members whose AR is at least as high (none: the closed form's AR never gets there). Points below
    `floor` AR are left out: a gate refuses them."""
    closed = series(entry, "closed")
    out = []
    for x, lo, hi, ar, label in series(entry, kind):
        if ar < floor:
            continue
        above = [c for c in closed if c[3] >= ar]
        best = max(above, key=lambda c: c[0]) if above else None
        out.append({"point": label, "closeups": round(x, 4), "spread": [round(lo, 4), round(hi, 4)], "ar": round(ar, 4),
                    "closed_form_at_equal_ar": best and {"name": best[4], "closeups": best[0], "ar": best[3]},
                    "gain": best and round(x - best[0], 4)})
    return out


def plot(records: list[dict], split: str, png: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    entries = [r for r in records if r["split"] == split]
    cols = min(2, len(entries))
    rows = -(-len(entries) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(6.2 * cols, 4.6 * rows), squeeze=False)
    for ax in axes.flat[len(entries):]:
        ax.axis("off")
    for ax, e in zip(axes.flat, entries):
        for kind, (label, fmt, color) in STYLE.items():
            pts = sorted(series(e, kind), key=lambda p: -p[3])  # drawn from most AR kept to least
            if not pts:
                continue
            x = [p[0] for p in pts]
            ax.errorbar(x, [p[3] for p in pts], xerr=[[p[0] - p[1] for p in pts], [p[2] - p[0] for p in pts]],
                        fmt=fmt, color=color, label=label, ms=5, lw=1, capsize=2)
        ax.margins(0.05)
        ax.axhline(0.97, color="grey", ls=":", lw=1)
        ax.axvline(0.75, color="grey", ls=":", lw=1)
        ax.set_title(e.get("label") or f"{e['encoder']} ({Path(e['store']).name}), {split}", fontsize=9)
        ax.set_xlabel("close-up leakage removed (strongest attacker)")
        ax.set_ylabel("AR retention (raw's strongest reader)")
    axes.flat[0].legend(fontsize=7, loc="lower left")
    fig.tight_layout()
    fig.savefig(png, dpi=90)
    plt.close(fig)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--store")
    ap.add_argument("--split", choices=["select", "val", "test"], default="val")
    ap.add_argument("--members", nargs="+", choices=KINDS, default=["closed"])
    ap.add_argument("--only", nargs="+", help="score only these member names")
    ap.add_argument("--parts", nargs="+", choices=PARTS, default=["privacy", "ar"])
    ap.add_argument("--k", type=int, nargs="+", default=[11], help="the learned stages' widths")
    ap.add_argument("--k-closed", type=int, nargs="+", default=[8, 11, 14, 17, 20, 24])
    ap.add_argument("--w", type=float, nargs="+", default=[1.0, 3.0, 10.0], help="oracle keep's attribute weights")
    ap.add_argument("--lam", type=float, nargs="+", default=[0.0, 1.0, 3.0, 10.0])
    ap.add_argument("--stage-seeds", type=int, nargs="+", default=[0, 1, 2, 3])
    ap.add_argument("--epochs", type=int, default=StageConfig.epochs)
    ap.add_argument("--anchor", type=float, default=StageConfig.anchor)
    ap.add_argument("--adv-steps", type=int, default=StageConfig.adv_steps)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4], help="probe seeds")
    ap.add_argument("--checkpoints", help="folder for the learned stages' safetensors checkpoints (resumable)")
    ap.add_argument("--record", default="docs/frontier.json")
    ap.add_argument("--label", help="what the plot calls this store (default: its encoder and folder)")
    ap.add_argument("--plot", help="draw this record file's frontiers (no scoring)")
    ap.add_argument("--png", default="docs/frontier.png")
    ap.add_argument("-v", "--verbose", action="store_true")
    args = ap.parse_args(argv)
    if args.plot:
        records = json.loads(Path(args.plot).read_text())
        plot(records, args.split, Path(args.png))
        print(json.dumps({"png": args.png, "gains": {f"{r['encoder']} {Path(r['store']).name}": {
            kind: gains(r, kind) for kind in ("learned", "oracle-both", "oracle-stage", "oracle-mmd", "oracle-keep")}
            for r in records if r["split"] == args.split}}, indent=1))
        return
    if not args.store:
        ap.error("--store is required unless --plot")
    run(args)


if __name__ == "__main__":
    main()
