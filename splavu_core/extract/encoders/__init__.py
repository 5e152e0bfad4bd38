"""Frozen video encoders: loading (vfm), preprocessing, and the two shipped demo encoders with their training scripts."""
from pathlib import Path

DEMO_CHECKPOINT = Path(__file__).parent / "demo_checkpoint"
ACTION_CHECKPOINT = Path(__file__).parent / "action_checkpoint"
# The shipped demo encoders by name (`splavu demo --encoder NAME`): "demo" was trained with appearance, identity and
# gait heads beside its action head (train_demo.py); "action" on actions + masked-video reconstruction only, as real
# video foundation models are (train_action_encoder.py).
DEMO_ENCODERS = {"demo": DEMO_CHECKPOINT, "action": ACTION_CHECKPOINT}
