#!/usr/bin/env bash
# The one prepared run on the lent GPU machine (device time is short): the GPU tests, then the
# GPU benchmarks. Results land in $OUT; copy them to benchmarks/results/ afterwards.
# The machine has torch but not omegaconf: carry its wheels in .whl/ (benchmarks/README.md, "On a lent GPU machine").
set -u
export PYTHONUNBUFFERED=1
OUT=${OUT:-benchmarks/results}
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl
  export PYTHONPATH=/tmp/site:$PWD
else
  export PYTHONPATH=$PWD
fi
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > "$OUT/gpu-nvidia-smi.txt" 2>&1
python3 -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'gpus', torch.cuda.device_count())" | tee -a "$OUT/gpu-nvidia-smi.txt"
timeout 200 python3 -m pytest tests/gpu tests/test_loops.py tests/test_hooks.py -q -rs -p no:cacheprovider 2>&1 | tee "$OUT/gpu-tests.txt"
timeout 260 python3 benchmarks/bench_gpu.py --out "$OUT" 2>&1 | tee "$OUT/gpu-bench.txt"
# fw bench on the GPU machine: NCCL collectives (2+ GPUs), single/dp on CUDA, bf16 GPT with MFU
timeout 420 python3 -m framework.cli bench --quick --out "$OUT" 2>&1 | tee "$OUT/gpu-fw-bench.txt"
