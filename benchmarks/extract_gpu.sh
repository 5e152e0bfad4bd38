#!/usr/bin/env bash
# Issue 61 on a GPU, in one go: where extraction's time goes with CPU decoders and with NVDEC, bf16.
#
#   bash benchmarks/extract_gpu.sh prepare     # here, on the CPU machine, first: fills .gpu/ (git-ignored, ~50 MB)
#   OUT=/some/dir bash benchmarks/extract_gpu.sh   # on the GPU machine, from the repo root, with .gpu/ carried along
#
# `prepare` downloads the wheels a bare GPU machine lacks for extraction (decord, zarr and its needs, NVIDIA's
# pynvvideocodec; versions from requirements.lock) into .gpu/whl and renders the demo's TAD set (seed 0) into
# .gpu/tad, keeping its first $VIDEOS videos (default 80, the issue's 951 clips). The run installs the wheels whose
# import fails (into /tmp/site, --no-index) and writes to $OUT:
# - session.log: the card, driver, core count, versions, and every step's exit status and time;
# - frames.json: NVDEC's frames against decord's (splavu_core/ingest/nvdec.py compare_with_decord) on the real-video
#   fixture and the first 8 demo videos: counts, sizes, per-frame absolute pixel differences (the issue's tolerance);
# - extract_gpu.json: benchmarks/extract.py --device cuda (bf16 autocast), batch 64, decoder processes 1, 2, 4, 8 and
#   all cores, plus the NVDEC paths (--decoder auto): per stage (decode, copy, prepare, forward, write) busy seconds
#   for each decoder count, the decode and forward ceilings, ratio_end_to_end_vs_min_ceiling (target >= 0.8 with
#   CPU decoding), end_to_end_nvdec (target >= 2,000 clips/s), decode_workers_speedup, identical Zarr bytes;
# - extract_gpu_2workers.json: the same at all cores with two encoder threads (does a second thread keep the GPU
#   busier?), if time is left;
# - gpu_decode_tests.log: tests/test_gpu_decode.py, if pytest is there.
# Every step has its own timeout; the whole run ends in about 8 minutes (give the run tool timeout_s=540).
# A dry run on a CPU (a minute): DEVICE=cpu VIDEOS=4 DECODERS=1,2 PY=.venv/bin/python OUT=/tmp/o bash ...
set -u
HERE=$(cd "$(dirname "$0")/.." && pwd)
GPU_DIR=${GPU_DIR:-$HERE/.gpu}
PY=${PY:-python3}
VIDEOS=${VIDEOS:-80}
DEVICE=${DEVICE:-cuda}

if [ "${1:-}" = "prepare" ]; then
  PY=${PY_PREP:-$HERE/.venv/bin/python}
  mkdir -p "$GPU_DIR/whl"
  pins=$(grep -E '^(decord|zarr|numcodecs|donfig|crc32c|typing-extensions|packaging|pynvvideocodec)==' \
    "$HERE/requirements.lock" | sed 's/ .*//')
  $PY -m pip download -q --no-deps -d "$GPU_DIR/whl" $pins || exit 1
  $PY -c "
import shutil, sys
from pathlib import Path
from splavu_core.ingest.synth.datasets import generate
out = Path(sys.argv[1]); tmp = out / 'render'
generate(tmp, 'demo', seed=0, datasets=('tad',))
lines = (tmp / 'tad' / 'manifest.csv').read_text().splitlines()[: int(sys.argv[2]) + 1]
(out / 'tad' / 'videos').mkdir(parents=True, exist_ok=True)
for line in lines[1:]:
    path = line.split(',')[1]
    shutil.copy(tmp / 'tad' / path, out / 'tad' / path)
(out / 'tad' / 'manifest.csv').write_text('\n'.join(lines) + '\n')
shutil.rmtree(tmp)
" "$GPU_DIR" "$VIDEOS" || exit 1
  du -sh "$GPU_DIR"/*
  exit 0
fi

OUT=${OUT:?set OUT}
T0=$(date +%s)
mkdir -p "$OUT"
LOG="$OUT/session.log"
elapsed() { echo $(( $(date +%s) - T0 )); }
{
  echo "== machine"; nvidia-smi 2>&1 || echo "no nvidia-smi"; echo "cores: $(nproc)"; free -g | head -2
  $PY -c "import sys, torch; print('python', sys.version.split()[0], '| torch', torch.__version__, 'cuda', torch.version.cuda, torch.cuda.is_available() and torch.cuda.get_device_name(0))"
} >"$LOG" 2>&1
cat "$LOG"

missing=$(cd "$HERE" && $PY -c "
import importlib
for mod, wheel in (('decord', 'decord'), ('zarr', 'zarr'), ('numcodecs', 'numcodecs'), ('donfig', 'donfig'),
                   ('PyNvVideoCodec', 'pynvvideocodec')):
    try:
        importlib.import_module(mod)
    except ImportError:
        print(wheel)
" 2>/dev/null)
if [ -n "$missing" ]; then
  echo "installing from $GPU_DIR/whl: $missing" | tee -a "$LOG"
  wheels=$(for w in $missing; do ls "$GPU_DIR"/whl/"$w"-*.whl "$GPU_DIR"/whl/"${w//-/_}"-*.whl 2>/dev/null; done | sort -u)
  $PY -m pip install -q --no-index --no-deps --target /tmp/site $wheels >>"$LOG" 2>&1 || echo "wheel install failed" | tee -a "$LOG"
fi
export PYTHONPATH="$HERE:/tmp/site${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
cd "$HERE" || exit 1
$PY -c "from splavu_core.ingest import nvdec; print('nvdec:', nvdec.unavailable() or 'available')" 2>&1 | tee -a "$LOG"

echo "== frames: NVDEC against decord at $(elapsed)s" | tee -a "$LOG"
timeout -k 5 60 $PY -c "
import json, sys
from pathlib import Path
from splavu_core.ingest.nvdec import compare_with_decord
paths = [Path('tests/data/vtest_people.mp4')] + sorted(Path(sys.argv[1]).glob('videos/*.mp4'))[:8]
out = []
for p in paths:
    try:
        out.append(compare_with_decord(p))
    except Exception as e:
        out.append({'video': str(p), 'error': f'{type(e).__name__}: {e}'})
print(json.dumps(out, indent=1))
" "$GPU_DIR/tad" >"$OUT/frames.json" 2>>"$LOG"
echo "frames rc=$? at $(elapsed)s" | tee -a "$LOG"
cat "$OUT/frames.json"

CORES=$(nproc)
DECODERS=${DECODERS:-1,2,4,8,$CORES}
echo "== extraction benchmark ($VIDEOS videos, decoders $DECODERS, NVDEC too) at $(elapsed)s" | tee -a "$LOG"
timeout -k 5 300 $PY benchmarks/extract.py --data "$GPU_DIR/tad" --videos "$VIDEOS" --device "$DEVICE" --batch 64 \
  --decode-threads 4 --decoders "$DECODERS" --decoder auto --rounds 2 >"$OUT/extract_gpu.json" 2>>"$LOG"
echo "extract rc=$? at $(elapsed)s" | tee -a "$LOG"
cat "$OUT/extract_gpu.json"

if [ "$(elapsed)" -lt 330 ]; then
  echo "== two encoder threads at $(elapsed)s" | tee -a "$LOG"
  timeout -k 5 $(( 420 - $(elapsed) )) $PY benchmarks/extract.py --data "$GPU_DIR/tad" --videos "$VIDEOS" \
    --device "$DEVICE" --batch 64 --decoders "${DECODERS##*,}" --encoder-workers 2 --rounds 1 \
    >"$OUT/extract_gpu_2workers.json" 2>>"$LOG"
  echo "extract (2 encoder threads) rc=$? at $(elapsed)s" | tee -a "$LOG"
fi

if $PY -c "import pytest" 2>/dev/null && [ "$(elapsed)" -lt 440 ]; then
  timeout -k 5 60 $PY -m pytest tests/test_gpu_decode.py -q -s -p no:cacheprovider -k "tolerance" \
    >"$OUT/gpu_decode_tests.log" 2>&1
  echo "gpu decode tests rc=$? at $(elapsed)s" | tee -a "$LOG"
fi
echo "== done at $(elapsed)s" | tee -a "$LOG"
