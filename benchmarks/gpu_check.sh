#!/usr/bin/env bash
# Issue 45's device checks in one call, for a session lent an NVIDIA GPU (the device tool: its image
# has python3 with torch+CUDA, tensorboard, rich, jinja2, matplotlib, psutil, pandas; not crc32c).
# Here, first, in the repository's root (once):
#   echo /.whl/ >> .git/info/exclude
#   python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
#     --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 -d .whl crc32c
# then: run(command="bash benchmarks/gpu_check.sh", carry=[".whl"], timeout_s=590). Everything it
# measures comes back in $OUT/gpu_check.tgz (logs, the runs' results.json and report.md, the truth
# files, the benchmark's JSON); a step that fails writes its log and the next one runs.
#
# Tried on a CPU first: `GPU_CHECK_DEVICE=cpu OUT=/tmp/out bash benchmarks/gpu_check.sh` runs every
# step on small sizes against the CPU (the CUDA tests skip, the GPU clock's benchmark is left out),
# so a typo costs no device time. Steps, each with its own time limit (585 s at most; give the call 590):
#   1. the CUDA tests: the anatomy within ±5 points of the script's own CUDA-event truth (item,
#      pageable, no sync), syncs with their line, pageable copies, MFU, memory sites, and the doctor
#      on a pageable loop (pinned non-blocking copies, GPU bf16 autocast)
#   2. the GPU clock's own cost a step (benchmarks/gpu_clock.py)
#   3. `dlscope lab` on the GPU, whole: its report's CPU-against-GPU sweep rows, time to 99%
#   4. time to 99% with the fast recipe, and with a larger batch
#   5. `dlscope doctor` on the pageable loop, its report kept
# Not here: the lab's step under CUDA graphs or torch.compile(mode="reduce-overhead") (not built).
set -u
DEVICE=${GPU_CHECK_DEVICE:-cuda}
OUT=${OUT:?the device tool sets OUT}
if [ "$DEVICE" = cuda ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl
  export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1 COLUMNS=80
  if ! python3 -m pip install -q --no-deps --no-build-isolation --no-index -e . >/tmp/pip.log 2>&1; then
    export PYTHONPATH=/tmp/site:$PWD/src  # no editable install: the sources, a `dlscope` on PATH
    mkdir -p /tmp/bin && printf '#!/bin/sh\nexec python3 -m dlscope.cli "$@"\n' >/tmp/bin/dlscope && chmod +x /tmp/bin/dlscope
    export PATH=/tmp/bin:$PATH
  fi
  PY=python3 SMALL=() STEPS=400
else  # the dry run: this checkout's venv, small sizes
  export PATH=$PWD/.venv/bin:$PATH PYTHONUNBUFFERED=1 COLUMNS=80
  PY=$PWD/.venv/bin/python SMALL=(--train-subset 2000 --test-subset 500 --epochs 1) STEPS=40
fi
o=$(mktemp -d /tmp/gpu_check.XXXX) && mkdir -p "$o/runs"
step() { echo "== $1: rc=$2 (at $(($(date +%s) - began)) s)" | tee -a "$o/steps.txt"; }
began=$(date +%s)
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1 || echo "no nvidia-smi"
  $PY -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, torch.cuda.is_available())"
  nproc; } | tee "$o/device.txt"

# 1. the CUDA paths' tests
timeout 240 $PY -m pytest -q -p no:cacheprovider tests/test_gpu_run.py tests/test_gpuclock.py tests/test_gputrace.py \
  tests/test_flops.py -k "gpu or cuda or flops or gputrace or gpuclock or doctor" >"$o/pytest.log" 2>&1
step pytest $?; tail -25 "$o/pytest.log"

# 2. the GPU clock's cost a step (CUDA only)
if [ "$DEVICE" = cuda ]; then
  timeout 60 $PY benchmarks/gpu_clock.py --mode item --steps 300 --rounds 3 >"$o/gpu_clock.json" 2>&1
  step gpu_clock $?; cat "$o/gpu_clock.json"
fi

# 3. the whole lab on the device: the report's sweep rows (CPU against GPU) and time to 99%
timeout 120 dlscope lab --device "$DEVICE" --out "$o/runs/lab" --no-progress "${SMALL[@]}" >"$o/lab.log" 2>&1
step lab $?; grep -n "Reached\|ok in\|99" "$o/lab.log" | head -5
grep -n "^| *\(cpu\|cuda\)" "$o/runs/lab/report.md" | head -20

# 4. time to 99% on the device
for v in "--recipe fast" "--batch-size 512 --epochs 4"; do
  name=train$(echo "$v" | tr -d ' -')
  # shellcheck disable=SC2086
  timeout 45 dlscope train --device "$DEVICE" --no-progress --no-tensorboard --target-acc 99 --out "$o/runs/$name" \
    $v "${SMALL[@]}" >>"$o/train.log" 2>&1
  step "train [$v]" $?
done
grep -n "Reached\|target" "$o/train.log" | head -6

# 5. the doctor on the pageable loop (the script needs CUDA: on the CPU, the doctor on its own target)
if [ "$DEVICE" = cuda ]; then
  target=(tests/scripts/cuda_truth.py "$o/doctor-truth.json" --mode pageable --steps $STEPS)
else
  target=(tests/scripts/doctor_target.py)
fi
timeout 75 dlscope doctor --budget 60 --out "$o/runs/doctor" -- $PY "${target[@]}" >"$o/doctor.log" 2>&1
step doctor $?; head -30 "$o/doctor.log"

cd "$o" && find runs \( -name "*.pt" -o -name "*.pickle" -o -name "*.safetensors" \) -size +5M -delete
tar czf "$OUT/gpu_check.tgz" . && ls -la "$OUT" && cat "$o/steps.txt"
