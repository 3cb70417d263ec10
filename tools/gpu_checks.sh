#!/usr/bin/env bash
# The checks that need a GPU, in one run (CI machines have none):
#   - dtcore built with NCCL (built here first unless the dtcore Python imports has NCCL),
#   - tests/py/gpu (init, collectives, reducer, ZeRO-1/2/3 and activation offload on NCCL; ranks sharing a GPU),
#   - python -m dtcore.check,
#   - benchmarks/bench_gpu.py on GPT-2 124M (step time and memory) and 350M (step time),
#   - benchmarks/bench_gpu.py --compiled on GPT-2 124M (vocabulary 50304, block 1024, batch 32): the plain
#     compiled loop, torch DDP and dtcore compiled, then python -m dtcore.train --preset aggressive for 40
#     steps (its run directory: OUTDIR/trainer_aggressive), and
#     benchmarks/bench_activation.py (offload too).
#
#     bash tools/gpu_checks.sh [OUTDIR]        (default: gpu-results; one file per step)
#
# The build needs spdlog's and fmt's headers where CMake looks (or CMAKE_INCLUDE_PATH pointing at them).
# Exit status: 0 when every step passed.
set -uo pipefail
cd "$(dirname "$0")/.."
out=${1:-gpu-results}
py=${PYTHON:-python3}
mkdir -p "$out"
export PYTHONUNBUFFERED=1

nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv 2>&1 | tee "$out/gpu.txt"
if ! (cd / && "$py" -c "import dtcore._build_info as b; import dtcore; assert b.with_nccl") >/dev/null 2>&1; then
  echo "building dtcore with NCCL" | tee -a "$out/gpu.txt"
  CMAKE_BUILD_PARALLEL_LEVEL=$(nproc) "$py" -m pip install -q --no-build-isolation --no-deps \
    -Cbuild-dir=build/gpu -Ccmake.define.DTCORE_WITH_NCCL=ON . 2>&1 | tail -30 | tee -a "$out/gpu.txt"
fi
if ! (cd / && "$py" -X faulthandler -c "import torch, dtcore
print('torch', torch.__version__, '| NCCL', dtcore._C.nccl_version(), '| dtcore', dtcore.__version__, dtcore.__file__)") \
  2>&1 | tee -a "$out/gpu.txt"; then
  # The build does not run: the facts the next look needs, then stop (every later step would fail alike).
  # Seen once (H200, torch 2.11.0+cu130): a segfault in ostream << int inside _C at the first formatted number.
  so=$(cd / && "$py" -c "import importlib.util as u; print(u.find_spec('dtcore').submodule_search_locations[0])")/_C*.so
  { g++ --version | head -1; cmake --version | head -1
    grep -E "CMAKE_CXX_COMPILER:|CMAKE_CXX_FLAGS:|NCCL_LIBRARY:|CMAKE_(SHARED|MODULE)_LINKER_FLAGS:" build/gpu/CMakeCache.txt
    echo "libstdc++ code defined in _C: $(nm -C --defined-only $so | grep -c -E ' std::(locale|basic_ostream|codecvt)')"
    readelf -d $so | grep NEEDED
    cuda-gdb -q -batch -ex run -ex bt --args "$py" -c "import torch, dtcore; dtcore._C.nccl_version()" 2>&1 |
      grep -v -E "^\[(New )?Thread" | tail -25
  } 2>&1 | tee -a "$out/gpu.txt"
  exit 1
fi

rc=0
"$py" -m dtcore.check 2>&1 | tee "$out/check.txt"
timeout 300 "$py" -m pytest -q -p no:cacheprovider tests/py/gpu 2>&1 | tee "$out/pytest.txt" || rc=1
timeout 240 "$py" benchmarks/bench_gpu.py --preset gpt2 --batch 16 2>&1 | tee "$out/bench_gpu_gpt2.md" || rc=1
# Each compiled variant compiles once, in its warm-up (inductor's caches make the later ones, and the
# trainer's process, mostly cache hits); 2 rounds of 10 steps each, then the trainer's 40 steps.
timeout 360 "$py" benchmarks/bench_gpu.py --compiled --preset gpt2 --batch 32 --rounds 2 --trainer-steps 40 \
  --out "$out" 2>&1 | tee "$out/bench_gpu_compiled.md" || rc=1
timeout 240 "$py" benchmarks/bench_gpu.py --memory --preset gpt2 --batch 16 2>&1 | tee "$out/bench_gpu_memory.md" || rc=1
# Budgets of 75 and 90 % of the peak without checkpointing: at batch 8, 4.6 of GPT-2's 6.9 GiB peak
# is outside its blocks (the logits), so no budget under about 71 % can be met by checkpointing.
timeout 240 "$py" benchmarks/bench_activation.py --preset gpt2 --batch 8 --budgets 0.75 0.9 2>&1 |
  tee "$out/bench_activation.md" || rc=1
timeout 240 "$py" benchmarks/bench_gpu.py --preset gpt2-medium --batch 8 2>&1 | tee "$out/bench_gpu_gpt2-medium.md" || rc=1
exit $rc
