"""The utility reader suite: for each utility task, readers whose capacity does not depend on the table they read.

A weak reader flatters an anonymizer as a weak attacker does: the convex TAD probe read a 19% loss as "no change"
where a trained detection head read 6%. So each task is read by several readers, every one of fixed capacity
(fixed once, on raw demo features, before any anonymizer was scored), and judged by the reader STRONGEST ON RAW,
paired with itself on the table under test (scoring.py): the judge never depends on the table it judges.

    ar   linear   multinomial logistic probe on standardised clips (protocols.action_recognition; convex)
         mlp      D -> 512 -> C MLP (dropout 0.5) on standardised video means (the mean of a video's clips),
                  AdamW 1e-3 / wd 1e-2, 100 epochs of batches of 128 videos
    tad  convex   per-clip softmax on a clip and its neighbours (protocols.temporal_detection)
         head     TADHead: two temporal convs of 64 channels + focal/GIoU loss, 150 full-batch AdamW epochs
                  (protocols.temporal_detection_head)
    ad   linear   per-clip logistic scorer on video labels (protocols.anomaly_detection; convex)
         mlp      per-clip D -> 128 -> 1 MLP on the same video labels, AdamW 1e-3 / wd 5e-4, 100 full-batch epochs;
                  frame AUC of its clip scores. (A MIL head, ADHead with the top-k MIL loss, was tried: its seeds
                  spread by 0.15 AUC on the demo's raw features, so it cannot judge; docs/history.md.)

Every reader runs with the same seeds; one Scored per task carries each reader's headline as `<metric>[<reader>]`
and the plain metric names of the strongest reader on THIS table (details["strongest"]); `judged_by` rebinds
the plain names to another reader (raw's strongest) so a paired change compares a reader with itself.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from splavu_core.evaluation import protocols as P
from splavu_core.evaluation import score_cache
from splavu_core.evaluation.attackers import Standardiser
from splavu_core.tasks.metrics import frame_labels, frame_scores

HEADLINE = {"ar": "top1", "tad": "mAP", "ad": "auc"}
MLP_HIDDEN, MLP_EPOCHS, MLP_BATCH, MLP_DROPOUT = 512, 100, 128, 0.5
AD_HIDDEN, AD_EPOCHS = 128, 100


@dataclass(frozen=True)
class Reader:
    task: str
    name: str
    capacity: str


SUITE = (Reader("ar", "linear", "multinomial logistic regression on standardised clips, L2 0.1"),
         Reader("ar", "mlp", f"D -> {MLP_HIDDEN} -> C MLP on standardised video means, dropout {MLP_DROPOUT}, "
                               f"{MLP_EPOCHS} epochs"),
         Reader("tad", "convex", "per-clip softmax on a clip and its 2 neighbours, L2 0.1"),
         Reader("tad", "head", "TADHead, 2 temporal convs x 64 channels, 150 epochs"),
         Reader("ad", "linear", "per-clip logistic scorer on video labels, L2 1"),
         Reader("ad", "mlp", f"per-clip D -> {AD_HIDDEN} -> 1 MLP on video labels, {AD_EPOCHS} epochs"))
NAMES: dict[str, tuple[str, ...]] = {t: tuple(r.name for r in SUITE if r.task == t) for t in HEADLINE}
CAPACITY = {(r.task, r.name): r.capacity for r in SUITE}


# ---------------------------------------------------------------- the two trained readers that protocols.py lacks

def action_recognition_mlp(train: P.Videos, test: P.Videos, seeds: Sequence[int] = P.seeds_from(),
                           classes: Sequence[str] | None = None, **_) -> P.Scored:
    """S independent D -> 512 -> C MLPs (dropout 0.5) trained at once (stacked weights) on standardised video means
    (the mean over a video's clips); top-1 of each test video's mean."""
    classes = list(classes) if classes is not None else sorted({v.meta["action"] for v in train})
    index = {c: i for i, c in enumerate(classes)}
    tr_means = np.stack([v.feats.astype(np.float64).mean(0) for v in train])
    std = Standardiser(tr_means)
    X = torch.from_numpy(std(tr_means))                                               # (N, D)
    XT = torch.from_numpy(std(np.stack([v.feats.astype(np.float64).mean(0) for v in test])))
    Y = torch.tensor([index[v.meta["action"]] for v in train])
    seeds = list(seeds)
    layers = _stacked_mlp(seeds, X.shape[1], MLP_HIDDEN, len(classes))
    opt = torch.optim.AdamW(layers, lr=1e-3, weight_decay=1e-2)
    gens = [torch.Generator().manual_seed(s) for s in seeds]
    for _ in range(MLP_EPOCHS):
        orders = torch.stack([torch.randperm(len(X), generator=g) for g in gens])    # (S, N)
        for a in range(0, len(X), MLP_BATCH):
            idx = orders[:, a:a + MLP_BATCH]
            loss = F.cross_entropy(_forward(layers, X[idx], dropout=MLP_DROPOUT, gens=gens).transpose(1, 2), Y[idx],
                                   reduction="none").mean(1).sum()
            opt.zero_grad()
            loss.backward()
            opt.step()
    with torch.no_grad():
        probs = torch.softmax(_forward(layers, XT.expand(len(seeds), -1, -1)), -1).numpy()  # (S, Nt, C)
    return P.ar_scored(probs, test, classes)


def anomaly_detection_mlp(train: P.Videos, test: P.Videos, seeds: Sequence[int] = P.seeds_from(), **_) -> P.Scored:
    """A per-clip D -> 128 -> 1 MLP trained per seed on the video labels only (every clip of an anomalous training
    video a positive, each video and each label weighing the same, as the linear probe), full batch; each test clip
    scored, frame-level ROC AUC."""
    labels = [v.meta.get("anomaly") for v in train]
    assert set(labels) == {0, 1}, f"anomaly_detection_mlp: train needs normal and anomalous videos, got {set(labels)}"
    std = Standardiser(P.all_clips(train))
    X = torch.from_numpy(std(P.all_clips(train)))                                 # (N, D)
    y = torch.tensor([lab for v, lab in zip(train, labels) for _ in range(len(v.feats))], dtype=torch.float32)
    n_pos = sum(labels)
    cw = {1: 0.5 / n_pos, 0: 0.5 / (len(labels) - n_pos)}
    w = torch.tensor([cw[lab] / len(v.feats) for v, lab in zip(train, labels) for _ in range(len(v.feats))])
    xt = [torch.from_numpy(std(v.feats)) for v in test]
    scores = []
    for s in seeds:
        torch.manual_seed(s)
        net = torch.nn.Sequential(torch.nn.Linear(X.shape[1], AD_HIDDEN), torch.nn.ReLU(), torch.nn.Linear(AD_HIDDEN, 1))
        opt = torch.optim.AdamW(net.parameters(), lr=1e-3, weight_decay=5e-4)
        for _ in range(AD_EPOCHS):
            loss = (F.binary_cross_entropy_with_logits(net(X)[:, 0], y, reduction="none") * w).sum()
            opt.zero_grad()
            loss.backward()
            opt.step()
        with torch.no_grad():
            scores.append([frame_scores(v, net(x)[:, 0].numpy()) for v, x in zip(test, xt)])
    return P.ad_scored(scores, [frame_labels(v) for v in test], test)


def _stacked_mlp(seeds: Sequence[int], d_in: int, hidden: int, d_out: int) -> list[torch.Tensor]:
    """[W1 (S, D, H), b1 (S, 1, H), W2 (S, H, C), b2 (S, 1, C)] with nn.Linear's default init, per seed."""
    params = []
    for s in seeds:
        torch.manual_seed(s)
        l1, l2 = torch.nn.Linear(d_in, hidden), torch.nn.Linear(hidden, d_out)
        params.append((l1.weight.T, l1.bias[None], l2.weight.T, l2.bias[None]))
    return [torch.stack([p[k].detach().clone() for p in params]).requires_grad_() for k in range(4)]


def _forward(layers: list[torch.Tensor], x: torch.Tensor, dropout: float = 0.0, gens=None) -> torch.Tensor:
    """x (S, B, D) -> (S, B, C); dropout on the hidden units (training), each seed's mask from its own generator."""
    W1, b1, W2, b2 = layers
    h = torch.relu(torch.baddbmm(b1, x, W1))                                         # (S, B, H)
    if dropout:
        keep = torch.stack([torch.rand(h.shape[1:], generator=g) >= dropout for g in gens])
        h = h * keep / (1 - dropout)
    return torch.baddbmm(b2, h, W2)


# ---------------------------------------------------------------- the suite as one Scored per task

def _run(task: str, reader: str, train, test, seeds, kw: dict) -> P.Scored:
    """One reader's Scored; its outputs come from the store's score cache when they were computed before."""
    return score_cache.computed("reader", (task, reader, list(train), list(test), list(seeds), kw),
                                lambda: _fit(task, reader, train, test, seeds, dict(kw)),
                                to_kept=lambda sc: sc.outputs, from_kept=lambda o: P.from_outputs(o, test))


def _fit(task: str, reader: str, train, test, seeds, kw: dict) -> P.Scored:
    if task == "ar":
        return (P.action_recognition if reader == "linear" else action_recognition_mlp)(train, test, seeds, **kw)
    if task == "ad":
        return (P.anomaly_detection if reader == "linear" else anomaly_detection_mlp)(train, test, seeds, **kw)
    classes = kw.pop("classes")
    fn = P.temporal_detection if reader == "convex" else P.temporal_detection_head
    return fn(train, test, classes, seeds, **kw)


def read(task: str, train: P.Videos, test: P.Videos, seeds: Sequence[int], readers: Sequence[str] | None = None,
         **kw) -> P.Scored:
    """Every reader of `task` (default: the whole suite) trained fresh on `train`, scored on `test`; one Scored whose
    plain metrics are the strongest reader's on these features and `<headline>[<reader>]` each reader's."""
    readers = list(readers or NAMES[task])
    unknown = set(readers) - set(NAMES[task])
    assert not unknown, f"unknown {task} reader(s) {sorted(unknown)}; the suite is {NAMES[task]}"
    by = {r: _run(task, r, train, test, list(seeds), dict(kw)) for r in readers}
    m = HEADLINE[task]
    mean = {r: float(np.nanmean([sc.metrics[m](s, None) for s in range(sc.n_seeds)])) for r, sc in by.items()}
    best = max(readers, key=lambda r: (mean[r], -readers.index(r)))
    return judged_by(_merge(task, by, mean), best)


def _merge(task: str, by: dict[str, P.Scored], mean: dict[str, float]) -> P.Scored:
    first = next(iter(by.values()))
    assert all(sc.test_ids == first.test_ids for sc in by.values()), f"{task}: readers scored different videos"
    return dataclasses.replace(first, details={"readers": by, "reader_value": mean,
                                               "capacity": {r: CAPACITY[(task, r)] for r in by}})


def judged_by(sc: P.Scored, reader: str) -> P.Scored:
    """`sc` (from `read`) with its plain metric names bound to `reader`'s: the judge of a paired comparison.
    The bracketed per-reader headlines stay."""
    by = sc.details["readers"]
    assert reader in by, f"{sc.task}: reader {reader!r} was not run (have {sorted(by)})"
    own = by[reader]
    m = HEADLINE[sc.task]
    metrics = {**own.metrics, **{f"{m}[{r}]": s.metrics[m] for r, s in by.items()}}
    chance = {**own.chance, **{f"{m}[{r}]": s.chance[m] for r, s in by.items()}}
    return dataclasses.replace(own, metrics=metrics, chance=chance, n_seeds=min(s.n_seeds for s in by.values()),
                               n_boot=min(s.n_boot for s in by.values()),
                               same_outputs=all(s.same_outputs for s in by.values()),
                               details={**own.details, **sc.details, "strongest": reader})
