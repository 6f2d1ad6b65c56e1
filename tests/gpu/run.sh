#!/usr/bin/env bash
# Issue 42's device check, prepared to run whole in one call of the device tool on a lent GPU machine
# (its 15 minutes include the machine's start):
#
#   run(command="tests/gpu/run.sh", timeout_s=600)
#
# 1. the device, the driver and the versions;
# 2. `make bench`'s loops on 4 cores ("4 CPU cores per GPU"), then on every core;
# 3. a 5-epoch run with the trainer's defaults on a Pets-sized set: 7,390 JPEGs of 500x375, 37 classes.
# Each step has its own time limit, so one that hangs leaves the others' results. Eight files go to
# $OUT (the tool brings back 8 at most; output/gpu-check without it), for docs/gpu.md.
#
# The machine's python3 holds torch, torchvision, timm and accelerate and nothing can be installed
# there, so our code runs from the tree (PYTHONPATH=src). On a CPU, for a try of the script itself:
#   GPU_BENCH_ARGS="--model resnet10t --image-size 64 --batch-size 8 --steps 1 --warmup 1" \
#   GPU_TRAIN_ARGS="--model resnet10t --image-size 64 --epochs 1" GPU_FILES=74 GPU_CPUS=1 \
#   PETS_PYTHON=.venv/bin/python tests/gpu/run.sh
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
OUT=${OUT:-output/gpu-check}
mkdir -p "$OUT"
export PYTHONPATH=$PWD/src PETS_CACHE=${PETS_CACHE:-/tmp/pets-cache}
PY=${PETS_PYTHON:-python3}
FILES=${GPU_FILES:-7390}
BENCH_ARGS=${GPU_BENCH_ARGS:---steps 20 --warmup 3 --repeats 1}
TRAIN_ARGS=${GPU_TRAIN_ARGS:-}
CPUS=${GPU_CPUS:-4}  # the input cores a GPU node gives each GPU
work=$(mktemp -d)

log() { printf '[gpu-check %s] %s\n' "$(date +%T)" "$*" | tee -a "$OUT/run.log" >&2; }
step() {  # step NAME SECONDS COMMAND...: its output to $OUT/NAME.log, its time and exit code to run.log
  local name=$1 seconds=$2 t0=$SECONDS rc=0
  shift 2
  log "$name: start"
  timeout "$seconds" "$@" >"$OUT/$name.log" 2>&1 || rc=$?
  log "$name: exit $rc after $((SECONDS - t0)) s"
}

{
  nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm,power.limit --format=csv || true
  echo "cpus: $(nproc)"
  "$PY" -c 'import sys, torch, torchvision, timm, accelerate
print("python", sys.version.split()[0], "torch", torch.__version__, "cuda", torch.version.cuda,
      "cudnn", torch.backends.cudnn.version(), "torchvision", torchvision.__version__,
      "timm", timm.__version__, "accelerate", accelerate.__version__)'
} 2>&1 | tee -a "$OUT/run.log" >&2

# shellcheck disable=SC2086 # the args are words
step "bench-${CPUS}cpus" 240 "$PY" -m pets_training.bench $BENCH_ARGS --cpus "$CPUS" --output "$work/bench-cpus"
cp "$work/bench-cpus/bench.json" "$OUT/bench-${CPUS}cpus.json" 2>/dev/null
cp "$work/bench-cpus/bench.png" "$OUT/bench-${CPUS}cpus.png" 2>/dev/null  # for docs/gpu.md
# shellcheck disable=SC2086
step bench-allcpus 180 "$PY" -m pets_training.bench $BENCH_ARGS --output "$work/bench-allcpus"
cp "$work/bench-allcpus/bench.json" "$OUT/bench-allcpus.json" 2>/dev/null

# The Pets-sized set, written on every core: the images bench_upload.py writes, the same names.
step pets-set 120 "$PY" - "$work/pets" "$FILES" <<'EOF'
import sys
from multiprocessing import Pool
from pathlib import Path

import numpy as np
from PIL import Image

from pets_training.synthetic import synthetic_image, synthetic_samples

folder, files, classes = Path(sys.argv[1]), int(sys.argv[2]), 37
folder.mkdir(parents=True, exist_ok=True)
samples = synthetic_samples(classes, -(-files // classes))[:files]


def write(item: tuple[int, tuple[str, int]]) -> None:
    index, (name, label) = item
    pixels: np.ndarray = synthetic_image(42, index, label, classes, 500)[:375]
    Image.fromarray(pixels).save(folder / name, quality=90)


with Pool() as pool:
    pool.map(write, list(enumerate(samples)), chunksize=64)
print(f"{len(samples)} JPEGs of 500x375 in {folder}")
EOF
cat "$OUT/pets-set.log" >>"$OUT/run.log" && rm "$OUT/pets-set.log"

# The trainer's defaults (resnet50d, batch 64, fp16, 5 epochs, its own input path and workers), random
# init: the machine has no hub. Its summary holds the time split (start-up, train, eval).
# shellcheck disable=SC2086
step pets-5-epochs 300 "$PY" -m accelerate.commands.launch --num_processes 1 --num_machines 1 \
  --mixed_precision fp16 --dynamo_backend no -m pets_training --data "$work/pets" --no-pretrained \
  --output-dir "$work/train" $TRAIN_ARGS
cp "$work/train/summary.json" "$OUT/pets-5-epochs-summary.json" 2>/dev/null
rm -rf "$work"
log "done: $(ls "$OUT" | tr '\n' ' ')"
