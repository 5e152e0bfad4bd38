#!/usr/bin/env bash
# One prepared GPU session (issue 46 item 1): the machine and its versions, an extraction benchmark on the GPU, then
# the second demo encoder's training run (splavu_core/extract/encoders/train_action_encoder.py), all inside one time limit.
#
#   bash benchmarks/gpu_session.sh            # on the GPU machine, from the repo root, $OUT set
#
# It runs the code in $ENC2 (default .enc2/: a copy of splavu_core/ and benchmarks/ of the branch that trains, Python
# wheels in $ENC2/.whl for what the machine lacks (decord, zarr and its needs: extraction only), and a rendered
# dataset folder $ENC2/tad for the extraction benchmark), not the checkout's own splavu_core: the device machine
# runs a copy of another checkout. Every step has its own `timeout`; the whole script ends in about 9 minutes.
# Writes to $OUT: session.log (machine, versions, extraction stderr), extract_gpu.json (the first encoder),
# extract_gpu_action.json (the new one, if time is left), train.log, action_encoder/{config.json,
# model.safetensors, preprocessor_config.json, training_log.json}. The resume state (tens of MB) is moved out
# of $OUT to /tmp/action_encoder_state: it is only needed on this machine.
#
# A dry run on a CPU (seconds): DEVICE=cpu TRAIN_S=20 EXTRACT_S=60 VIDEOS=4 \
#   TRAIN_ARGS="--workers 2 --batch 4 --pool 16 --held 8 --refresh 2 --warmup 40 --eval-every 20" OUT=/tmp/o bash ...
set -u
OUT=${OUT:?set OUT}
ENC2=$(cd "${ENC2:-.enc2}" && pwd)
PY=${PY:-python3}
DEVICE=${DEVICE:-cuda}
EXTRACT_S=${EXTRACT_S:-85}       # cap of the extraction benchmark (the brief: ~90 s)
VIDEOS=${VIDEOS:-80}
TRAIN_S=${TRAIN_S:-390}          # the trainer's own budget (--minutes); the timeout around it adds 90 s
TRAIN_ARGS=${TRAIN_ARGS:---workers 14 --batch 192 --lr 8e-4 --warmup 400 --pool 10000 --refresh 24 --held 960 --eval-every 500 --save-every 1000 --log-every 100}
DEADLINE_S=${DEADLINE_S:-540}    # the second extraction benchmark runs only if this much time is not yet used
T0=$(date +%s)
mkdir -p "$OUT"
LOG="$OUT/session.log"
elapsed() { echo $(( $(date +%s) - T0 )); }

{
  echo "== machine"; nvidia-smi 2>&1 || echo "no nvidia-smi"; nproc; free -g | head -2
  echo "== versions"
  $PY -c "import sys, torch, transformers, numpy; print('python', sys.version.split()[0]); print('torch', torch.__version__, 'cuda', torch.version.cuda, 'available', torch.cuda.is_available(), torch.cuda.get_device_name(0) if torch.cuda.is_available() else ''); print('transformers', transformers.__version__, 'numpy', numpy.__version__)"
} >"$LOG" 2>&1
cat "$LOG"

# extraction needs decord and zarr; the trainer needs neither
if ! $PY -c "import decord, zarr" >/dev/null 2>&1; then
  $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site "$ENC2"/.whl/*.whl >>"$LOG" 2>&1 \
    && export PYTHONPATH=/tmp/site || echo "wheel install failed" | tee -a "$LOG"
fi
export PYTHONPATH="$ENC2${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
(cd "$ENC2" && $PY -c "import splavu_core, decord, zarr; print('splavu_core from', splavu_core.__file__, '| decord', decord.__version__, '| zarr', zarr.__version__)") 2>&1 | tee -a "$LOG"

echo "== extraction benchmark (first encoder, $VIDEOS videos, cap ${EXTRACT_S}s) at $(elapsed)s" | tee -a "$LOG"
timeout -k 5 "$EXTRACT_S" $PY "$ENC2/benchmarks/extract.py" --data "$ENC2/tad" --videos "$VIDEOS" --device "$DEVICE" \
  --batch 64 --decode-threads 8 --rounds 2 >"$OUT/extract_gpu.json" 2>>"$LOG"
echo "extract rc=$? at $(elapsed)s" | tee -a "$LOG"
cat "$OUT/extract_gpu.json"

echo "== training (budget ${TRAIN_S}s) at $(elapsed)s" | tee -a "$LOG"
MIN=$($PY -c "print($TRAIN_S / 60)")
# from inside $ENC2: `python -m` puts the working folder first on sys.path, and it must be this splavu_core
(cd "$ENC2" && timeout -k 10 $((TRAIN_S + 90)) $PY -u -m splavu_core.extract.encoders.train_action_encoder \
  --out "$OUT/action_encoder" --device "$DEVICE" --bf16 --minutes "$MIN" --steps auto --seed 7 $TRAIN_ARGS) \
  >"$OUT/train.log" 2>&1
echo "train rc=$? at $(elapsed)s" | tee -a "$LOG"
tail -n 5 "$OUT/train.log"
rm -rf /tmp/action_encoder_state && mkdir -p /tmp/action_encoder_state
mv "$OUT/action_encoder/resume" "$OUT/action_encoder/selected.json" /tmp/action_encoder_state/ 2>/dev/null

if [ "$(elapsed)" -lt "$DEADLINE_S" ] && [ -f "$OUT/action_encoder/model.safetensors" ]; then
  CAP=$(( DEADLINE_S + 45 - $(elapsed) )); [ "$CAP" -gt 45 ] && CAP=45
  echo "== extraction benchmark (new encoder, cap ${CAP}s) at $(elapsed)s" | tee -a "$LOG"
  timeout -k 5 "$CAP" $PY "$ENC2/benchmarks/extract.py" --data "$ENC2/tad" --videos "$VIDEOS" --device "$DEVICE" \
    --checkpoint "$OUT/action_encoder" --batch 64 --decode-threads 8 --rounds 1 >"$OUT/extract_gpu_action.json" 2>>"$LOG"
  echo "extract (new encoder) rc=$? at $(elapsed)s" | tee -a "$LOG"
fi
echo "== done at $(elapsed)s" | tee -a "$LOG"
ls -la "$OUT" "$OUT/action_encoder"
