#!/usr/bin/env bash
# Installs what hybrid_engine needs and builds its C++ extension in place.
# A torch that is already installed (e.g. a CUDA build on a GPU machine) is kept; otherwise the CPU build
# of torch 2.13.0 is installed. The extension is always built against the installed torch.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if ! "$PY" -c "import torch" 2>/dev/null; then
  "$PY" -m pip install -q torch==2.13.0
fi
"$PY" -m pip install -q "scikit-build-core>=0.10" ninja numpy pytest matplotlib
"$PY" -m pip install -q --no-build-isolation -e .
"$PY" -c "import hybrid_engine, torch; print('hybrid_engine built against torch', torch.__version__)"
