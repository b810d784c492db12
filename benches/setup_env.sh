#!/usr/bin/env bash
# The bench's own environment, with every peer: mimi_py (built from this checkout, release),
# rustymimi, transformers' MimiModel and moshi's Mimi on torch (CPU), and matplotlib for the
# report's charts (the bench's only; the package never needs it).
#
#   bash benches/setup_env.sh [VENV]        # default: .venv-bench at the checkout's root; then:
#   VENV/bin/python -m benches          # every CPU suite against every installed peer
#
# moshi 0.2.13 pins torch < 2.10 and pulls in its server's dependencies (sounddevice,
# bitsandbytes, aiohttp, sphn), which its Mimi does not need: it is installed with --no-deps,
# and its Mimi's own needs are listed here (transformers 4.x keeps huggingface_hub < 1.0, as
# moshi needs). On Linux x86-64, PyPI's torch wheel also carries CUDA's libraries (~3 GB); set
# TORCH_INDEX=https://download.pytorch.org/whl/cpu for the CPU-only one where that index is
# reachable. Both run the same CPU kernels.
set -euo pipefail
VENV=$(realpath -m "${1:-$(dirname "$0")/../.venv-bench}")
PY=${PYTHON:-python3}
cd "$(dirname "$0")/.."
"$PY" -m venv "$VENV"
PIP="$VENV/bin/pip"
"$PIP" install --quiet --upgrade pip
"$PIP" install --quiet ${TORCH_INDEX:+--index-url "$TORCH_INDEX"} "torch>=2.2,<2.10"
"$PIP" install --quiet "numpy>=1.26,<2.3" "safetensors>=0.4,<0.8" "sentencepiece>=0.2,<0.3" \
    "einops>=0.7,<0.9" "huggingface_hub>=0.24,<1.0" "transformers>=4.45,<5" rustymimi \
    matplotlib
"$PIP" install --quiet --no-deps moshi==0.2.13
"$PIP" install --quiet ".[serve,data]" # the server and corpus suites
"$VENV/bin/python" -c "import torch, moshi.models.loaders, rustymimi, transformers, mimi_py; \
print('bench environment ready: torch', torch.__version__, 'mimi_py', mimi_py.__version__)"
