#!/usr/bin/env bash
# Fills .gpu/ (git-ignored) with what scripts/gpu_check.sh needs on the GPU machine, which has
# Python 3.12 with PyTorch and NVIDIA's CUDA wheels, but no Rust and no network:
#   .gpu/mimi_py-*.whl   the CUDA wheel (scripts/build_cuda_wheel.sh into dist/cuda; built if missing)
#   .gpu/wheels/         pytest, hypothesis and moshi 0.2.13 (--no-deps) with the few packages
#                        moshi's Mimi needs, as wheels for CPython 3.12 on x86-64 Linux
# Usage: bash scripts/prepare_gpu_check.sh [CUDA_WHEEL]
# Then, with the device tool: run(command="bash scripts/gpu_check.sh", carry=[".gpu"], timeout_s=540).
# Everything that travels must stay under the device tool's 64 MiB.
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python3}"
mkdir -p .gpu/wheels
wheel="${1:-}"
if [ -z "$wheel" ]; then
    wheel="$(ls dist/cuda/mimi_py-*.whl 2>/dev/null | head -1 || true)"
fi
if [ -z "$wheel" ]; then
    bash scripts/build_cuda_wheel.sh
    wheel="$(ls dist/cuda/mimi_py-*.whl | head -1)"
fi
rm -f .gpu/mimi_py-*.whl
cp "$wheel" .gpu/
# The commit the results name (the device's copy has no .git): the checkout's, marked when the
# work tree differs from it (build the wheel from a clean tree for results that get committed).
echo "$(git rev-parse HEAD)$(git diff --quiet HEAD -- crates src python Cargo.toml Cargo.lock || echo -dirty)" \
    >.gpu/commit
pip_download() {
    "$PY" -m pip download --quiet --dest .gpu/wheels --only-binary=:all: \
        --python-version 3.12 --implementation cp --platform manylinux2014_x86_64 \
        --platform manylinux_2_17_x86_64 --platform manylinux_2_28_x86_64 "$@"
}
pip_download pytest hypothesis einops sentencepiece safetensors
pip_download --no-deps "moshi==0.2.13"
du -sh .gpu
git ls-files -z | xargs -0 du -cb | tail -1 | awk '{printf "tracked files: %.1f MiB\n", $1 / 1048576}'
