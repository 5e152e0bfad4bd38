"""Where extraction's time goes: seconds each stage was busy, summed over the processes and threads that ran it."""
from __future__ import annotations

import threading
from dataclasses import dataclass, field, fields

STAGES = ("decode", "copy", "prepare", "forward", "write")


@dataclass
class StageTimes:
    """decode: the decoder processes (or threads) decoding and handing frames over; copy: frames to the encoder's
    device (nothing on CPU, where the batch reads the shared memory in place); prepare: crop or resize, float and
    normalise on the device; forward: the encoder and pooling; write: the shard's commit (timed by its caller).
    With decode threads (SPLAVU_DECODE_WORKERS=0) decode includes staging each video (its crop, or its resize and
    normalisation) and prepare is the batch's conversion. On CUDA, prepare and forward are timed with CUDA events,
    the others on the host."""
    decode: float = 0.0
    copy: float = 0.0
    prepare: float = 0.0
    forward: float = 0.0
    write: float = 0.0
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def add(self, **seconds: float) -> None:
        with self._lock:
            for k, v in seconds.items():
                setattr(self, k, getattr(self, k) + v)

    def as_dict(self) -> dict:
        return {f.name: round(getattr(self, f.name), 4) for f in fields(self) if f.name in STAGES}
