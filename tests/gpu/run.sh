#!/usr/bin/env bash
# The GPU check, prepared to run whole in one call of the device tool on a lent GPU machine (its 15
# minutes include the machine's start):
#
#   run(command="tests/gpu/run.sh", timeout_s=600)
#
# Its steps' time limits add up to 420 s at most (checked before anything runs), so one call leaves room
# for the machine's start and a second try. In this order:
# 1. the device, the driver, the versions and the cores this process may use;
# 2. a Pets-sized set (7,390 JPEGs of 500x375, 37 classes), written on every core;
# 3. the 5-epoch run with the trainer's defaults on it, on 4 cores ("4 CPU cores per GPU"): its summary
#    holds the time split (start-up, train, its input wait, eval);
# 4. the `gpu` tests (tests/gpu/test_gpu_paths.py): nvJPEG and the GPU crops against the CPU path's, the
#    store kept in GPU memory;
# 5. `make bench`'s loops on 4 cores (the CPU path, the device path, the store path, the ceiling), in fp16
#    and in bf16;
# 6. each evaluation pass of step 3 beside forward-only passes over as many images (target: 1.5x at most).
# Every step's log, and for each its real, user and system seconds (the children's CPU time: 4 cores
# busy show as user + sys near 4x real), come back under $OUT (output/gpu-check without it).
#
# The machine's python3 holds torch, torchvision, timm and accelerate and nothing can be installed there,
# so our code runs from the tree (PYTHONPATH=src). On a CPU, a try of the script itself (CI's bench-smoke
# runs it): GPU_DRY_RUN=1 PETS_PYTHON=.venv/bin/python tests/gpu/run.sh
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
OUT=${OUT:-output/gpu-check}
mkdir -p "$OUT"
export PYTHONPATH=$PWD/src PETS_CACHE=${PETS_CACHE:-/tmp/pets-cache}
PY=${PETS_PYTHON:-python3}
CPUS=${GPU_CPUS:-4}  # the input cores a GPU node gives each GPU
FILES=7390
BENCH_ARGS=(--steps 10 --warmup 3 --repeats 1)
TRAIN_ARGS=()
if [[ ${GPU_DRY_RUN:-0} == 1 ]]; then  # small enough for a 2-core CPU; the same steps and files back
  FILES=74 CPUS=1
  BENCH_ARGS=(--model resnet10t --image-size 64 --batch-size 8 --jpeg-size 80 --steps 1 --warmup 1 --repeats 1)
  TRAIN_ARGS=(--model resnet10t --image-size 64 --batch-size 8 --epochs 1)
  export PETS_GPU_TESTS_DEVICE=cpu
fi
# name and seconds of each step, in order: together at most 420
LIMITS=(pets-set 40 pets-5-epochs 150 gpu-tests 30 bench-fp16 90 bench-bf16 90 eval-vs-forward 20)
total=0
for ((i = 1; i < ${#LIMITS[@]}; i += 2)); do total=$((total + LIMITS[i])); done
((total <= 420)) || { echo "tests/gpu/run.sh: its steps' limits add up to $total s, over 420" >&2; exit 2; }
limit() { local i; for ((i = 0; i < ${#LIMITS[@]}; i += 2)); do [[ ${LIMITS[i]} == "$1" ]] && echo "${LIMITS[i + 1]}"; done; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
first_cpus=$(python3 -c "import os; print(','.join(map(str, sorted(os.sched_getaffinity(0))[:$CPUS])))")

log() { printf '[gpu-check %s] %s\n' "$(date +%T)" "$*" | tee -a "$OUT/run.log" >&2; }
step() {  # step NAME COMMAND...: its output to $OUT/NAME.log; its exit code and times to run.log
  local name=$1 seconds rc=0 times
  seconds=$(limit "$name")
  shift
  log "$name: start (limit $seconds s)"
  times=$( { TIMEFORMAT='real %R s, user %U s, sys %S s'; time timeout "$seconds" "$@" >"$OUT/$name.log" 2>&1 || rc=$?; } 2>&1 )
  log "$name: exit $rc; $times"
}

{
  nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm,power.limit --format=csv || true
  echo "cpus: $(nproc); this process's $(grep Cpus_allowed_list /proc/self/status); steps 3 and 5 on $first_cpus"
  "$PY" -c 'import sys, torch, torchvision, timm, accelerate
print("python", sys.version.split()[0], "torch", torch.__version__, "cuda", torch.version.cuda,
      "cudnn", torch.backends.cudnn.version(), "torchvision", torchvision.__version__,
      "timm", timm.__version__, "accelerate", accelerate.__version__)'
} 2>&1 | tee -a "$OUT/run.log" >&2

# The Pets-sized set, written on every core: the images bench_upload.py writes, the same names.
step pets-set "$PY" - "$work/pets" "$FILES" <<'EOF'
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

# The trainer's defaults (resnet50d, batch 64, its default precision, 5 epochs, its own input path and
# workers), random init: the machine has no hub. On the node's share of cores for one GPU.
step pets-5-epochs taskset -c "$first_cpus" "$PY" -m accelerate.commands.launch --num_processes 1 \
  --num_machines 1 --dynamo_backend no -m pets_training --data "$work/pets" --no-pretrained \
  --output-dir "$work/train" "${TRAIN_ARGS[@]}"
cp "$work/train/summary.json" "$OUT/pets-5-epochs-summary.json" 2>/dev/null
cp "$work/train/config.yaml" "$OUT/pets-5-epochs-config.yaml" 2>/dev/null

if "$PY" -c "import pytest" 2>/dev/null; then
  step gpu-tests "$PY" -m pytest -p no:cacheprovider -m gpu -q tests/gpu
else  # no pytest on the machine: each test called in turn
  step gpu-tests "$PY" tests/gpu/test_gpu_paths.py
fi

for precision in fp16 bf16; do
  step "bench-$precision" "$PY" -m pets_training.bench "${BENCH_ARGS[@]}" --cpus "$CPUS" \
    --mixed-precision "$precision" --output "$work/bench-$precision"
  cp "$work/bench-$precision/bench.json" "$OUT/bench-$precision.json" 2>/dev/null
  cp "$work/bench-$precision/bench.png" "$OUT/bench-$precision.png" 2>/dev/null
  tar -czf "$OUT/bench-$precision-logs.tar.gz" -C "$work/bench-$precision" --exclude store . 2>/dev/null
done

# Each evaluation pass of the 5-epoch run beside forward-only passes of the same model, batch and
# precision over as many images (no loading, no gather, no metric): what evaluation adds to the model.
step eval-vs-forward "$PY" - "$OUT/pets-5-epochs-summary.json" "$OUT/pets-5-epochs-config.yaml" \
  "$OUT/eval-vs-forward.json" <<'EOF'
import json
import sys
import time

import timm
import torch
import yaml

from pets_training.model import resolve_precision

summary, cfg = json.load(open(sys.argv[1])), yaml.safe_load(open(sys.argv[2]))
on_gpu = torch.cuda.is_available()
device = torch.device("cuda" if on_gpu else "cpu")
images, batch, size = summary["dataset"]["eval_images"], cfg["batch_size"], cfg["image_size"]
capability = torch.cuda.get_device_capability() if on_gpu else None
mixed = resolve_precision(cfg["mixed_precision"] or "auto", on_gpu, False, capability).mixed_precision
dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(mixed)
torch.backends.cudnn.benchmark = on_gpu
model = timm.create_model(summary["model"], num_classes=summary["num_classes"]).to(device).eval()
model = model.to(memory_format=torch.channels_last)
x = torch.randn(batch, 3, size, size, device=device).to(memory_format=torch.channels_last)
with torch.no_grad(), torch.autocast(device.type, dtype=dtype or torch.float32, enabled=dtype is not None):
    for _ in range(3):  # warm-up: cudnn's autotune for this shape
        model(x)
    if on_gpu:
        torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(-(-images // batch)):
        model(x)
    if on_gpu:
        torch.cuda.synchronize()
forward = time.perf_counter() - start
per_pass = summary["time_seconds"]["eval"] / summary["epochs"]
result = {"eval_images": images, "batch": batch, "image_size": size, "mixed_precision": mixed,
          "eval_seconds_per_pass": round(per_pass, 3),
          "forward_only_seconds": round(forward, 3), "ratio": round(per_pass / forward, 2), "target": 1.5}
json.dump(result, open(sys.argv[3], "w"), indent=1)
print(result)
EOF
log "done: $(ls "$OUT" | tr '\n' ' ')"
