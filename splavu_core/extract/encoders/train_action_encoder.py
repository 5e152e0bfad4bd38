"""Train the second demo encoder the way real video foundation models are trained: actions, plus masked-video
reconstruction, and nothing about the people.

    python -m splavu_core.extract.encoders.train_action_encoder --out DIR --steps 3000                  # CPU or GPU
    python -m splavu_core.extract.encoders.train_action_encoder --out DIR --device cuda --bf16 --workers 14 --minutes 7 --steps auto
    python -m splavu_core.extract.encoders.train_action_encoder --out DIR --resume ...                  # continue DIR's last state

The first demo encoder (`train_demo`) learns appearance on purpose: supervised heads for skin, hair, shirt, scene
and gait. No real VFM has those. This one is trained as VideoMAE-B is: a self-supervised masked-video-reconstruction
objective (transformers' `VideoMAEForPreTraining`, 90% tube masking, normalised-pixel targets) plus a supervised
action head over the v2 world's actions (`train_demo.CLASSES`), on clips rendered by `train_demo.sample_clip` from
generator keys disjoint from every benchmark dataset and from the first encoder's. Whatever it knows about
appearance it knows as a by-product of reconstruction and action recognition: no appearance, identity or gait label
is ever read (sample_clip returns them; this script drops them), and nothing is selected on them.

Shape: VideoMAE with tubelet 2 (392 tokens a clip), 6 layers, width 192, 3 heads; 112 px, 16 frames, patch 16, so
extraction reads it as it reads the first (`vfm.load_encoder`). The saved encoder is a bare `VideoMAEModel`
(`save_pretrained`, safetensors): the action head and the reconstruction decoder stay in the resume state only.

Selection: the saved encoder is the evaluation with the best held-out action top-1 (renders of their own keys).
Reproducible: one seed fixes the init, the renders, the batches and the masks (bit for bit on CPU; on a GPU up to
its kernels). `--steps auto` (with `--minutes`) measures the step rate during warm-up and fixes the schedule's
length then; the log records it, and `--steps N` with that N replays the same schedule.
Resumable: `--save-every` steps (and when `--minutes` or `--stop-after` ends a run) the whole training state is
written to DIR/resume/: tensors (model, optimizer, torch generators, which clip each pool slot holds) as
safetensors, the rest (step, schedule, numpy generator, log) as JSON. No pickle is read or written.
Rendering: `--workers N` processes render clips ahead of the steps that will use them (the order they are used in
is fixed, so N changes no number); on a GPU the clip pool lives on the device.
"""
from __future__ import annotations

import argparse
import collections
import importlib
import json
import math
import multiprocessing as mp
import os
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

from splavu_core.extract.encoders.preprocess import Preprocess
from splavu_core.extract.encoders import ACTION_CHECKPOINT  # noqa: F401  (the shipped output of this script)
from splavu_core.extract.encoders.train_demo import (CLASSES, CLIP_LEN, INTERACTION_IDS, SEED_BASE, SIZE, Pool,
                                                     sample_clip, save)

DEFAULT_SEED = 7  # the first encoder used seed 0 (keys SEED_BASE + 0 / + 1): this one's keys never meet those
TRAIN_STREAM, HELD_STREAM = 0, 1
STATE_DIR = "resume"


def encoder_config():
    """A somewhat different shape from the first encoder (tubelet 4, 4 layers): tubelet 2, 6 layers; the same
    112 px, 16 frames and patch 16 that extraction and the synthetic world use. The decoder_* fields only size the
    reconstruction decoder, which is not saved."""
    from transformers import VideoMAEConfig  # transformers: seconds to import

    return VideoMAEConfig(image_size=SIZE, patch_size=16, num_frames=CLIP_LEN, tubelet_size=2, hidden_size=192,
                          num_hidden_layers=6, num_attention_heads=3, intermediate_size=768,
                          decoder_hidden_size=128, decoder_num_hidden_layers=2, decoder_num_attention_heads=4,
                          decoder_intermediate_size=512, norm_pix_loss=True, use_mean_pooling=False,
                          attn_implementation="sdpa")


# ---------------------------------------------------------------------------------------------------------------
# rendering: train_demo's sample_clip, in worker processes, in a fixed order


def clip_key(seed: int, stream: int, n: int) -> tuple[int, int, int]:
    """Generator key of the n-th clip of a stream (train / held-out). Benchmark datasets use keys (seed, code < 100,
    ...) and train_demo (SEED_BASE + seed, n): three-part keys meet neither."""
    return (SEED_BASE + seed, stream, int(n))


def _render(key):
    frames, action, _vocab, _gait = sample_clip(key)  # appearance and gait labels are dropped here, never sent
    return frames, action


def _worker_init():
    os.environ["OMP_NUM_THREADS"] = "1"
    torch.set_num_threads(1)


class Renderer:
    """Renders clips by key, in the main process (workers=0) or in worker processes that render ahead: the results
    come back in the order asked for, so the number of workers changes no result."""

    def __init__(self, workers: int = 0, ahead: int = 256):
        self.workers, self.ahead = workers, ahead
        self.pool = mp.get_context("spawn").Pool(workers, initializer=_worker_init) if workers > 0 else None
        # the worker function by its module's own name, also when this file runs as __main__ (python -m)
        self.fn = importlib.import_module(__name__ if __name__ != "__main__" else
                                          "splavu_core.extract.encoders.train_action_encoder")._render
        self.queue: collections.deque = collections.deque()  # (key, AsyncResult), in order
        self.stream = None  # (seed, stream, next n to submit)
        self.wait_s = 0.0   # time the training loop spent waiting for renders

    def many(self, keys) -> list:
        if self.pool is None:
            return [_render(k) for k in keys]
        return self.pool.map(self.fn, keys, chunksize=max(1, min(16, len(keys) // (4 * self.workers) or 1)))

    def next(self, seed: int, stream: int, n: int):
        """The render of clip n of (seed, stream); keeps the next `ahead` clips of the stream rendering."""
        key = clip_key(seed, stream, n)
        if self.pool is None:
            return _render(key)
        if not self.queue or self.queue[0][0] != key:  # a new stream position: start rendering from it
            self.queue.clear()
            self.stream = (seed, stream, n)
        self._top_up()
        t = time.perf_counter()
        got_key, res = self.queue.popleft()
        out = res.get()
        self.wait_s += time.perf_counter() - t
        self._top_up()
        return out

    def _top_up(self):
        seed, stream, n = self.stream
        while len(self.queue) < self.ahead:
            key = clip_key(seed, stream, n)
            self.queue.append((key, self.pool.apply_async(self.fn, (key,))))
            n += 1
        self.stream = (seed, stream, n)

    def close(self):
        if self.pool is not None:
            self.pool.terminate()
            self.pool.join()


class RenderPool(Pool):
    """train_demo's Pool (its arrays, its refresh: the same slots drawn from the same generator), with the clips
    rendered by a Renderer, the key of each slot remembered (the resume state re-renders them), and the frames
    mirrored on the training device. Only the action label is kept: the appearance and gait arrays stay unfilled."""

    def __init__(self, size: int, seed: int, renderer: Renderer, device: torch.device, stream: int = TRAIN_STREAM,
                 keys: np.ndarray | None = None, next_n: int | None = None):
        self.renderer, self.stream, self.device = renderer, stream, device
        self.keys = np.zeros(size, dtype=np.int64)
        self._pending: list[tuple[int, int]] = []  # (slot, clip n) queued by _fill
        super().__init__(size, seed)  # allocates; our _fill only queues the first `size` clips
        if device.type == "cpu":
            self.dev_frames = torch.from_numpy(self.frames)  # the same memory
        else:
            self.dev_frames = torch.empty(self.frames.shape, dtype=torch.uint8, device=device)
            self._pinned = [torch.empty((0,), dtype=torch.uint8).pin_memory()] * 2
            self._events = [None, None]
            self._flip = 0
        if keys is not None:  # resuming: the slots hold these clips
            self._pending = [(i, int(k)) for i, k in enumerate(keys)]
            self.next = int(next_n)
        rendered = renderer.many([clip_key(seed, stream, n) for _, n in self._pending])
        self._put([i for i, _ in self._pending], [n for _, n in self._pending], rendered)
        self._pending = []

    def _fill(self, i):  # called by Pool.__init__ and Pool.refresh
        self._pending.append((i, self.next))
        self.next += 1

    def refresh(self, n, rng):
        super().refresh(n, rng)  # draws the slots from rng exactly as train_demo does
        slots = [i for i, _ in self._pending]
        nums = [k for _, k in self._pending]
        self._pending = []
        self._put(slots, nums, [self.renderer.next(self.seed, self.stream, k) for k in nums])

    def _put(self, slots, nums, rendered):
        for i, k, (frames, action) in zip(slots, nums, rendered):
            self.keys[i], self.action[i] = k, action
            if self.device.type == "cpu":
                self.frames[i] = frames
        if self.device.type != "cpu":
            for c in range(0, len(slots), 256):  # the first fill in chunks: a bounded pinned buffer
                self._to_device(slots[c:c + 256], [f for f, _ in rendered[c:c + 256]])

    def _to_device(self, slots, frames):
        """Clips into their slots on the GPU: one pinned staging buffer (two in turn, each reused only once the copy
        out of it has finished), one asynchronous copy, a scatter on the stream. A pageable copy would wait for the
        step in flight."""
        b = self._flip
        self._flip ^= 1
        if self._events[b] is not None:
            self._events[b].synchronize()
        need = (len(slots),) + self.frames.shape[1:]
        if self._pinned[b].numel() < math.prod(need):
            self._pinned[b] = torch.empty(math.prod(need), dtype=torch.uint8).pin_memory()
        staged = self._pinned[b][:math.prod(need)].view(need)
        for j, f in enumerate(frames):
            staged[j].copy_(torch.from_numpy(f))
        on_dev = staged.to(self.device, non_blocking=True)
        ev = torch.cuda.Event()
        ev.record()
        self._events[b] = ev
        self.dev_frames.index_copy_(0, torch.as_tensor(slots).to(self.device, non_blocking=True), on_dev)

    def batch(self, idx):
        """(frames (B, T, H, W, 3) uint8 on the device, actions (B,) int64 on the device, actions on the CPU)."""
        idx_t = torch.as_tensor(idx)
        action = torch.from_numpy(self.action[idx])
        # non_blocking: a blocking host-to-device copy would wait for the step in flight
        return (self.dev_frames[idx_t.to(self.device, non_blocking=True)], action.to(self.device, non_blocking=True),
                action)


# ---------------------------------------------------------------------------------------------------------------
# the model


class ActionPretrainer(nn.Module):
    """VideoMAEForPreTraining (encoder + reconstruction decoder) and a linear action head on the stored embedding
    (mean of the encoder's last_hidden_state, exactly what extraction keeps)."""

    def __init__(self):
        super().__init__()
        from transformers import VideoMAEForPreTraining  # transformers: seconds to import

        self.mae = VideoMAEForPreTraining(encoder_config())
        self.action = nn.Linear(self.mae.config.hidden_size, len(CLASSES))

    @property
    def encoder(self):  # what train_demo.save saves: the bare VideoMAEModel
        return self.mae.videomae

    def embed(self, pixels):
        return self.encoder(pixel_values=pixels).last_hidden_state.mean(1)

    def forward(self, pixels, mask=None):
        logits = self.action(self.embed(pixels))
        rec = self.mae(pixel_values=pixels, bool_masked_pos=mask).loss if mask is not None else None
        return logits, rec


def tube_mask(rng: np.random.Generator, batch: int, cfg, ratio: float) -> np.ndarray:
    """VideoMAE's tube masking: the same random `ratio` of the spatial patches hidden in every tubelet of a clip.
    (B, T/tubelet * (S/patch)^2) bool, True = hidden; every clip hides the same number (the model requires it)."""
    n_sp = (cfg.image_size // cfg.patch_size) ** 2
    n_t = cfg.num_frames // cfg.tubelet_size
    hide = int(ratio * n_sp)
    order = np.argsort(rng.random((batch, n_sp)), axis=1)
    m = np.zeros((batch, n_sp), dtype=bool)
    np.put_along_axis(m, order[:, :hide], True, axis=1)
    return np.tile(m, (1, n_t))


def normalise(frames: torch.Tensor, pre: Preprocess) -> torch.Tensor:
    """(B, T, S, S, 3) uint8 on any device → (B, T, 3, S, S) float32, contiguous: Preprocess's float32 ops in its
    order (rescale, minus mean, over std)."""
    x = frames.to(torch.float32).mul_(pre.rescale)
    x = x.sub_(torch.tensor(pre.mean, device=x.device)).div_(torch.tensor(pre.std, device=x.device))
    return x.permute(0, 1, 4, 2, 3).contiguous()


def schedule(total: int, warmup: int):
    """Linear warm-up, then a cosine over the steps after it: the warm-up does not depend on `total`, so
    `--steps auto` can fix `total` during it and `--steps N` replays the run."""
    def f(s):
        if s < warmup:
            return (s + 1) / warmup
        return 0.5 * (1 + math.cos(math.pi * min(1.0, (s - warmup) / max(1, total - warmup))))
    return f


# ---------------------------------------------------------------------------------------------------------------
# resume state: safetensors for tensors, JSON for the rest


def save_state(out: Path, model, opt, sched, state: dict, pool: RenderPool):
    from safetensors.torch import save_file

    d = out / STATE_DIR
    d.mkdir(parents=True, exist_ok=True)
    tensors = {f"model.{k}": v.detach().cpu().contiguous() for k, v in model.state_dict().items()}
    osd = opt.state_dict()
    for pid, st in osd["state"].items():
        for k, v in st.items():
            if torch.is_tensor(v):
                tensors[f"opt.{pid}.{k}"] = v.detach().cpu().contiguous()
    tensors["rng.torch"] = torch.get_rng_state()
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        tensors["rng.cuda"] = torch.cuda.get_rng_state()
    tensors["pool.keys"] = torch.from_numpy(pool.keys.copy())
    meta = {**state, "pool_next": int(pool.next), "param_groups": osd["param_groups"],
            "opt_nontensor": {str(pid): {k: v for k, v in st.items() if not torch.is_tensor(v)}
                              for pid, st in osd["state"].items()},
            "scheduler": sched.state_dict()}
    tmp_t, tmp_j = d / "state.safetensors.part", d / "state.json.part"
    save_file(tensors, str(tmp_t))
    tmp_j.write_text(json.dumps(meta, indent=1) + "\n")
    os.replace(tmp_t, d / "state.safetensors")
    os.replace(tmp_j, d / "state.json")


def load_state(out: Path) -> tuple[dict, dict] | None:
    from safetensors.torch import load_file

    d = out / STATE_DIR
    if not (d / "state.json").is_file():
        return None
    return load_file(str(d / "state.safetensors")), json.loads((d / "state.json").read_text())


def restore(tensors: dict, meta: dict, model, opt, sched, device):
    model.load_state_dict({k[6:]: v for k, v in tensors.items() if k.startswith("model.")})
    state = {}
    for k, v in tensors.items():
        if k.startswith("opt."):
            _, pid, name = k.split(".", 2)
            state.setdefault(int(pid), {})[name] = v
    for pid, extra in meta["opt_nontensor"].items():
        state.setdefault(int(pid), {}).update(extra)
    opt.load_state_dict({"state": state, "param_groups": meta["param_groups"]})
    sched.load_state_dict(meta["scheduler"])
    torch.set_rng_state(tensors["rng.torch"])
    if "rng.cuda" in tensors and device.type == "cuda":
        torch.cuda.set_rng_state(tensors["rng.cuda"])


# ---------------------------------------------------------------------------------------------------------------


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--steps", default="4000", help="total steps of the schedule, or 'auto' (needs --minutes): "
                    "measured during warm-up to fill the time budget")
    ap.add_argument("--batch", type=int, default=24)
    ap.add_argument("--lr", type=float, default=5e-4)
    ap.add_argument("--weight-decay", type=float, default=0.05)
    ap.add_argument("--warmup", type=int, default=200)
    ap.add_argument("--seed", type=int, default=DEFAULT_SEED)
    ap.add_argument("--pool", type=int, default=3000, help="clips kept in memory (on the GPU, on the GPU)")
    ap.add_argument("--refresh", type=int, default=6, help="pool clips replaced by fresh renders after each step")
    ap.add_argument("--held", type=int, default=480, help="held-out renders for model selection")
    ap.add_argument("--eval-every", type=int, default=300)
    ap.add_argument("--save-every", type=int, default=500, help="write the resume state every N steps")
    ap.add_argument("--log-every", type=int, default=50)
    ap.add_argument("--mae-weight", type=float, default=1.0, help="weight of the masked-reconstruction loss "
                    "(0: actions only)")
    ap.add_argument("--mask-ratio", type=float, default=0.9)
    ap.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"))
    ap.add_argument("--bf16", action="store_true", help="bf16 autocast (the GPU run)")
    ap.add_argument("--workers", type=int, default=0, help="render processes (0: render in this process)")
    ap.add_argument("--threads", type=int, default=2, help="torch threads on CPU")
    ap.add_argument("--resume", action="store_true", help="continue from the last state in --out/resume")
    ap.add_argument("--minutes", type=float, default=0.0, help="time budget of this run (0: none): stop, evaluate "
                    "and save when it is reached")
    ap.add_argument("--stop-after", type=int, default=0, help="stop (and save the state) after N steps of this run, "
                    "as an interrupted run would")
    args = ap.parse_args(argv)
    if args.steps != "auto":
        args.steps = int(args.steps)
    elif args.minutes <= 0:
        ap.error("--steps auto needs --minutes")
    return args


def main(argv=None):
    args = parse_args(argv)
    t0 = time.time()
    budget_s = args.minutes * 60 if args.minutes > 0 else math.inf
    dev = torch.device("cuda" if args.device == "auto" and torch.cuda.is_available() else
                       ("cpu" if args.device == "auto" else args.device))
    if dev.type == "cpu":
        torch.set_num_threads(args.threads)
    else:
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
        torch.backends.cudnn.benchmark = True
    from transformers.utils import logging as hf_logging  # transformers: seconds to import

    hf_logging.disable_progress_bar()  # a bar per save_pretrained in the log
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    pre = Preprocess(short_side=SIZE, crop=SIZE)
    resumed = load_state(out) if args.resume else None
    if args.resume and resumed is None:
        print(f"no resume state in {out / STATE_DIR}: starting fresh", flush=True)
    meta = resumed[1] if resumed else None
    if meta:  # the run's own settings win: a resumed run continues the same run
        for k in ("batch", "lr", "weight_decay", "warmup", "seed", "pool", "refresh", "held", "mae_weight",
                  "mask_ratio"):
            if getattr(args, k) != meta["args"][k]:
                print(f"resume: --{k.replace('_', '-')} {meta['args'][k]} (the run's), not {getattr(args, k)}")
                setattr(args, k, meta["args"][k])

    torch.manual_seed(args.seed)
    rng = np.random.default_rng(args.seed)
    renderer = Renderer(args.workers, ahead=max(8 * args.refresh, 64))
    try:
        held = RenderPool(args.held, args.seed, renderer, dev, stream=HELD_STREAM)
        pool = (RenderPool(args.pool, args.seed, renderer, dev, keys=resumed[0]["pool.keys"].numpy(),
                           next_n=meta["pool_next"]) if meta else RenderPool(args.pool, args.seed, renderer, dev))
        print(f"rendered pool ({args.pool}) and held-out ({args.held}) clips in {time.time() - t0:.1f}s "
              f"with {args.workers} workers", flush=True)
        model = ActionPretrainer().to(dev)
        kw = {"fused": True} if dev.type == "cuda" else {}
        opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=args.weight_decay, **kw)
        total = meta["total_steps"] if meta else (args.steps if args.steps != "auto" else None)
        warm = args.warmup
        sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: schedule(total or 10**9, warm)(s))
        step, best, log, train_log = 0, -1.0, [], []
        if meta:
            restore(resumed[0], meta, model, opt, sched, dev)
            rng.bit_generator.state = meta["numpy_rng"]
            step, best, log, train_log = meta["step"], meta["best"], meta["log"], meta["train_log"]
            print(f"resumed at step {step} of {total} (best held-out action top-1 {best})", flush=True)
        train(args, model, opt, sched, pool, held, pre, rng, dev, out, t0, budget_s, step, best, log, train_log,
              total)
    finally:
        renderer.close()


def train(args, model, opt, sched, pool, held, pre, rng, dev, out, t0, budget_s, step, best, log, train_log, total):
    cfg = model.mae.config
    amp = dict(device_type=dev.type, dtype=torch.bfloat16, enabled=args.bf16)
    sums = torch.zeros(3, device=dev)  # action loss, reconstruction loss, labelled clips (since the last log line)
    n_since, t_mark, w_mark = 0, time.perf_counter(), pool.renderer.wait_s
    calib = None
    this_run, reason = 0, "steps"
    if total is None:  # --steps auto: the schedule's length is measured in warm-up (before the cosine starts)
        c0 = step + min(50, args.warmup // 4)
        calib = (c0, max(args.warmup - 10, c0 + 5))
        if calib[1] > args.warmup:
            raise SystemExit("--steps auto measures the step rate in warm-up: too late in this run; give --steps N")

    def budget_left():
        return budget_s - (time.time() - t0)

    while total is None or step < total:
        model.train()
        idx = rng.choice(args.pool, args.batch, replace=False)
        frames, action, action_cpu = pool.batch(idx)
        x = normalise(frames, pre)
        mask = (torch.from_numpy(tube_mask(rng, args.batch, cfg, args.mask_ratio)).to(dev, non_blocking=True)
                if args.mae_weight > 0 else None)
        n_lab = int((action_cpu >= 0).sum())
        with torch.autocast(**amp):
            logits, rec = model(x, mask)
        # static close-ups (-100) train the reconstruction only; a batch of them alone has no action loss
        loss_a = F.cross_entropy(logits.float(), action, ignore_index=-100, reduction="sum") / max(1, n_lab)
        loss = loss_a + (args.mae_weight * rec.float() if rec is not None else 0)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        pool.refresh(args.refresh, rng)
        step += 1
        this_run += 1
        # running sums on the device, read at log lines only: no host-device synchronisation per step
        sums[0] += loss_a.detach() * n_lab
        if rec is not None:
            sums[1] += rec.detach().float() * args.batch
        sums[2] += n_lab
        n_since += args.batch
        if calib and step == calib[0]:
            calib_t = time.perf_counter()
            if dev.type == "cuda":
                torch.cuda.synchronize()
                calib_t = time.perf_counter()
        if calib and step == calib[1]:
            if dev.type == "cuda":
                torch.cuda.synchronize()
            rate = (calib[1] - calib[0]) / (time.perf_counter() - calib_t)  # steps/s
            # evaluations, the final save and stragglers: 8% of what is left plus 20 s
            left = budget_left() * 0.92 - 20
            total = max(step + 1, int(step + rate * left))
            sched.lr_lambdas[0] = schedule(total, args.warmup)
            print(f"steps auto: {rate:.2f} steps/s in warm-up, {left:.0f}s left -> {total} steps in all", flush=True)
            calib = None
        if step % args.log_every == 0:
            s = sums.tolist()
            dt = time.perf_counter() - t_mark
            entry = {"step": step, "loss_action": round(s[0] / max(1, s[2]), 4),
                     "loss_reconstruction": round(s[1] / n_since, 4) if args.mae_weight > 0 else None,
                     "lr": round(sched.get_last_lr()[0], 7), "clips_per_s": round(n_since / dt, 1),
                     "step_ms": round(1000 * dt / args.log_every, 1),
                     "render_wait_s": round(pool.renderer.wait_s - w_mark, 2),
                     "elapsed_s": round(time.time() - t0, 1)}
            if dev.type == "cuda":
                entry["gpu_mem_gib"] = round(torch.cuda.max_memory_allocated() / 2**30, 2)
            train_log.append(entry)
            print(json.dumps(entry), flush=True)
            sums.zero_()
            n_since, t_mark, w_mark = 0, time.perf_counter(), pool.renderer.wait_s
        stop = None
        if total is not None and step >= total:
            stop = "steps"
        elif budget_left() <= 0:
            stop = "minutes"
        elif args.stop_after and this_run >= args.stop_after:
            stop = "stop_after"
        if step % args.eval_every == 0 or stop:
            best = evaluate_and_select(args, model, held, pre, dev, out, step, best, log, train_log, t0, total, stop)
        if stop or step % args.save_every == 0:
            state = {"step": step, "best": best, "total_steps": total, "log": log, "train_log": train_log,
                     "numpy_rng": rng.bit_generator.state, "args": {k: v for k, v in vars(args).items()}}
            save_state(out, model, opt, sched, state, pool)
        if stop:
            reason = stop
            break
    write_log(out, args, log, train_log, total, reason, step)
    print(f"stopped at step {step} ({reason}); best held-out action top-1 {best}; {time.time() - t0:.0f}s",
          flush=True)


def evaluate_and_select(args, model, held, pre, dev, out, step, best, log, train_log, t0, total, stop):
    t = time.perf_counter()
    res = evaluate(model, held, pre, dev, args)
    entry = {"step": step, "minutes": round((time.time() - t0) / 60, 2), **res,
             "eval_s": round(time.perf_counter() - t, 2)}
    log.append(entry)
    print(json.dumps(entry), flush=True)
    if res["heldout_action_top1"] >= best:
        best = res["heldout_action_top1"]
        save(model, out, pre, entry, args)
    write_log(out, args, log, train_log, total, stop or "running", step)
    return best


def write_log(out, args, log, train_log, total, reason, step):
    sel = max(log, key=lambda e: (e["heldout_action_top1"], e["step"])) if log else None
    doc = {"encoder": "second demo encoder: actions + masked-video reconstruction; no appearance, identity or gait "
                      "head", "args": {k: v for k, v in vars(args).items()}, "total_steps": total,
           "stopped": {"step": step, "reason": reason}, "selected": sel, "log": log,
           "train_log": train_log}
    (out / "training_log.json").write_text(json.dumps(doc, indent=1) + "\n")


@torch.no_grad()
def evaluate(model, held, pre, dev, args) -> dict:
    """Held-out action top-1 (what selects the saved encoder), split into the interaction and motion classes, and
    the reconstruction loss on fixed masks. Nothing about appearance."""
    model.eval()
    cfg = model.mae.config
    mrng = np.random.default_rng(12345)  # the same masks at every evaluation; the training generator is untouched
    hits, labels, rec, n = [], [], 0.0, 0
    amp = dict(device_type=dev.type, dtype=torch.bfloat16, enabled=args.bf16)
    for i in range(0, len(held.action), 96):
        idx = np.arange(i, min(i + 96, len(held.action)))
        frames, action, action_cpu = held.batch(idx)
        x = normalise(frames, pre)
        mask = torch.from_numpy(tube_mask(mrng, len(idx), cfg, args.mask_ratio)).to(dev)
        with torch.autocast(**amp):
            logits, r = model(x, mask)
        m = action_cpu >= 0
        hits.append((logits.argmax(1).cpu()[m] == action_cpu[m]).numpy())
        labels.append(action_cpu[m].numpy())
        rec += float(r) * len(idx)
        n += len(idx)
    hits, labels = np.concatenate(hits), np.concatenate(labels)
    inter = np.isin(labels, INTERACTION_IDS)
    return {"heldout_action_top1": round(float(hits.mean()), 4) if len(hits) else 0.0,
            "heldout_interaction_top1": round(float(hits[inter].mean()), 4) if inter.any() else None,
            "heldout_motion_top1": round(float(hits[~inter].mean()), 4) if (~inter).any() else None,
            "heldout_reconstruction_loss": round(rec / max(1, n), 4), "heldout_clips": int(len(hits))}


if __name__ == "__main__":
    main()
