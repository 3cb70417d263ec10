#!/usr/bin/env bash
# Installs what a fresh machine lacks to build, run and test dtcore. Idempotent.
#   apt:  a C++20 compiler, spdlog and fmt headers (logging), GoogleTest (C++ tests)
#   pip:  torch (CPU build, pinned), safetensors (checkpoint files), NumPy (torch warns "Failed to initialize NumPy" without it, and
#         the tests turn warnings into errors), transformers (the tests build Hugging Face models
#         from configs, no weights), accelerate (the tests run its `accelerate launch` and
#         Accelerator), lightning (the tests run its Trainer with dtcore's strategy against its DDP
#         strategy), the build backend, pytest, the formatters CI checks with (clang-format,
#         ruff), tqdm (the trainer's progress bar), matplotlib (python -m dtcore.plot) and tensorboard
#         (the trainer's TensorBoard scalars, optional for users, checked by the tests)
set -euo pipefail

APT_PACKAGES=(g++ libspdlog-dev libgtest-dev)
PIP_PACKAGES=(torch==2.13.0 numpy==2.4.6 safetensors==0.8.0 transformers==5.23.0 accelerate==1.15.0 scikit-build-core==1.1.2
              cmake==4.4.4 ninja==1.13.2 pytest==9.0.3 clang-format==21.1.8 ruff==0.17.6 matplotlib==3.11.2 tqdm==4.70.1
              tensorboard==2.21.0 lightning==2.6.6)

missing=()
for pkg in "${APT_PACKAGES[@]}"; do
  dpkg -s "$pkg" >/dev/null 2>&1 || missing+=("$pkg")
done
if ((${#missing[@]})); then
  sudo=""
  if [ "$(id -u)" -ne 0 ]; then sudo="sudo"; fi
  echo "setup: installing ${missing[*]}"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

PIP_ROOT_USER_ACTION=ignore python3 -m pip install -q --disable-pip-version-check "${PIP_PACKAGES[@]}"
python3 -c "import torch; assert torch.__version__.startswith('2.13.0'), torch.__version__"
echo "setup: ok (torch $(python3 -c 'import torch; print(torch.__version__)'))"
