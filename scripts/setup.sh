#!/usr/bin/env bash
# Installs what hybrid_engine needs and builds its C++ extension in place.
# A torch that is already installed (e.g. a CUDA build on a GPU machine) is kept; otherwise the CPU build
# of torch 2.13.0 is installed (below: from where). The extension is always built against the installed torch, and
# the build says what it compiles as it goes (ninja's [n/N] lines); ccache is used when it is installed.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
# The CPU build: PyPI's Linux torch==2.13.0 is the CUDA build (with ~3 GB of nvidia-* packages), so on Linux the
# version carries the CPU build's local label, 2.13.0+cpu, which PyPI does not hold. It is asked of pip's own
# configured sources first (a local wheel folder or mirror, as on a machine that reaches PyPI only), then of the
# PyTorch CPU index. PyPI's macOS and Windows builds are CPU builds.
TORCH_VERSION=2.13.0
if ! "$PY" -c "import torch" 2>/dev/null; then
  echo "setup: installing torch $TORCH_VERSION (CPU)"
  if [ "$(uname -s)" = Linux ]; then
    "$PY" -m pip install -q "torch==$TORCH_VERSION+cpu" 2>/dev/null \
      || "$PY" -m pip install -q "torch==$TORCH_VERSION+cpu" --index-url https://download.pytorch.org/whl/cpu
  else
    "$PY" -m pip install -q "torch==$TORCH_VERSION"
  fi
fi
echo "setup: installing the build and test tools"
"$PY" -m pip install -q "scikit-build-core>=1.1" ninja numpy pytest pytest-xdist matplotlib tokenizers tensorboard \
    transformers safetensors
if command -v ccache > /dev/null; then
  export CMAKE_CXX_COMPILER_LAUNCHER=ccache CMAKE_CUDA_COMPILER_LAUNCHER=ccache
fi
echo "setup: building the C++ extension (about 1.5 minutes on 2 cores for a first build; a rebuild compiles what changed)"
start=$(date +%s)
log=$(mktemp)
# pip -v shows the build's output; only ninja's progress lines ("[3/24] Building CXX object ...") reach the
# terminal as they come, the rest goes to the log, shown if the build fails.
if ! "$PY" -m pip install -v --no-build-isolation -e . < /dev/null 2>&1 | tee "$log" \
    | { grep --line-buffered -E '^\s*\[[0-9]+/[0-9]+\] ' | cut -c1-110 || true; }; then
  tail -40 "$log"
  echo "setup: the build failed (the whole log: $log)"
  exit 1
fi
rm -f "$log"
echo "setup: built in $(( $(date +%s) - start )) s"
"$PY" -c "import hybrid_engine, torch; print('hybrid_engine built against torch', torch.__version__)"
