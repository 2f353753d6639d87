#!/usr/bin/env bash
# Issue 27's device checks in one call, for a session lent an NVIDIA GPU (the device tool: its image
# has python3 with torch+CUDA, tensorboard, rich, jinja2, matplotlib, psutil, pandas; not crc32c).
# Here, first, in the repository's root (once):
#   echo /.whl/ >> .git/info/exclude
#   python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
#     --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 -d .whl crc32c
# then: run(command="bash benchmarks/gpu_check.sh", carry=[".whl"], timeout_s=540). Everything it
# measures comes back in $OUT/gpu_check.tgz (runs, logs, the truth files, the benchmark's JSON).
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1 COLUMNS=80
if ! python3 -m pip install -q --no-deps --no-build-isolation --no-index -e . >/tmp/pip.log 2>&1; then
  export PYTHONPATH=/tmp/site:$PWD/src  # no editable install: the sources, a `dlscope` on PATH
  mkdir -p /tmp/bin && printf '#!/bin/sh\nexec python3 -m dlscope.cli "$@"\n' >/tmp/bin/dlscope && chmod +x /tmp/bin/dlscope
  export PATH=/tmp/bin:$PATH
fi
o=/tmp/gpu_check && mkdir -p $o/runs
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $o/device.txt
python3 -c "import torch; print('torch', torch.__version__)" | tee -a $o/device.txt
# the CUDA paths' tests: known-truth anatomy within ±5 points, syncs with their line, copies, MFU, memory
timeout 180 python3 -m pytest -q -p no:cacheprovider tests/test_gpu_run.py tests/test_gpuclock.py \
  tests/test_gputrace.py tests/test_flops.py tests/test_memory.py tests/test_sweep.py tests/test_pipeline.py \
  tests/test_conv.py -k "gpu or cuda or flops or gputrace or gpuclock" >$o/pytest.log 2>&1
echo "pytest rc=$?"; tail -15 $o/pytest.log
for m in item pageable compute; do  # the terminal report at 80 columns, for the docs
  timeout 60 dlscope run --out $o/runs/truth-$m -- python3 tests/scripts/cuda_truth.py $o/truth-$m.json --mode $m \
    >$o/run-$m.log 2>&1
  echo "run $m rc=$?"
done
timeout 90 python3 benchmarks/gpu_clock.py --mode item --steps 300 --rounds 3 >$o/bench-item.json 2>&1
echo "gpu_clock rc=$?"; cat $o/bench-item.json
timeout 120 dlscope lab --device cuda --out $o/runs/lab --no-progress >$o/lab.log 2>&1
echo "lab rc=$?"; grep -n "Reached\|ok in" $o/lab.log
for v in "--recipe fast" "--batch-size 512 --epochs 4"; do  # time to 99% on the GPU
  timeout 60 dlscope train --device cuda --no-progress --no-tensorboard --out "$o/runs/train$(echo $v | tr -d ' -')" $v \
    >>$o/train.log 2>&1
  echo "train [$v] rc=$?"
done
grep -n "Reached" $o/train.log
timeout 100 dlscope doctor --budget 60 --out $o/runs/doctor -- python3 tests/scripts/cuda_truth.py $o/doctor-truth.json \
  --mode pageable --steps 400 >$o/doctor.log 2>&1
echo "doctor rc=$?"
cd $o && find runs \( -name "*.pt" -o -name "*.pickle" \) -size +5M -delete && tar czf "$OUT/gpu_check.tgz" . && ls -la "$OUT"
