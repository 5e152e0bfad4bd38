"""Frozen video encoders: loading (vfm), preprocessing, and the two shipped demo encoders with their training scripts."""
from pathlib import Path

DEMO_CHECKPOINT = Path(__file__).parent / "demo_checkpoint"
ACTION_CHECKPOINT = Path(__file__).parent / "action_checkpoint"
# The shipped demo encoders by name (`splavu demo --encoder NAME`): "demo" was trained with appearance, identity and
# gait heads beside its action head (train_demo.py); "action" on actions + masked-video reconstruction only, as real
# video foundation models are (train_action_encoder.py).
DEMO_ENCODERS = {"demo": DEMO_CHECKPOINT, "action": ACTION_CHECKPOINT}
# Opt-in CPU speed-ups of extraction, with what they were measured to cost (benchmarks/extract_int8.py): "int8"
# quantises the linear layers (dynamic activation scales): 1.4-1.5x faster encoding on 2 AVX2 cores, cosine to fp32
# >= 0.998. Another encoder fingerprint: never mixed with fp32 latents in one store.
QUANTIZE = ("int8",)
