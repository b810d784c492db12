#!/usr/bin/env bash
# Checks the CUDA build without a GPU: the same setup as scripts/build_cuda_wheel.sh (CUDA 13.0
# nvcc and NVRTC from PyPI, candle patched for run-time loading, a source copy), then, in its own
# target folder,
#
#   cargo clippy -p mimi-core --all-targets --features cuda,cudnn -- -D warnings
#   cargo test -p mimi-core --features cuda,cudnn --lib gpu::
#
# (or the command given as arguments). Both select only mimi-core, so they resolve the same
# features and share candle-kernels' build (the binding has no CUDA code). The tests are the GPU
# modules' CPU-side ones, with the cuda and cudnn code compiled in: the graph plan and its
# capture-free replays, the cuDNN shapes and plan cache, and NVRTC compiling every fused kernel's source (libnvrtc from the
# nvidia-cuda-nvrtc wheel; no GPU needed). It still runs candle-kernels' build script, i.e. nvcc
# compiles every PTX kernel and the MoE/GGUF static library for CUDA_COMPUTE_CAP (default 90):
# that is most of a first run's 20 minutes on 2 cores. CLEAN=1 starts from an empty target folder.
# .ci/run runs it.
#
#   scripts/check_cuda.sh
#   scripts/check_cuda.sh cargo check --features cuda --all-targets
set -euo pipefail

# shellcheck source=build_cuda_wheel.sh
source "$(dirname "${BASH_SOURCE[0]}")/build_cuda_wheel.sh"

setup_cuda_build check-src
export CARGO_TARGET_DIR="$BUILD_DIR/check-target"
if [[ "${CLEAN:-0}" != 0 ]]; then
    rm -rf "$CARGO_TARGET_DIR"
fi
export LD_LIBRARY_PATH="$CUDA_ROOT/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
run() {
    local start=$SECONDS
    "$@"
    echo "$*: $((SECONDS - start)) s"
}
if [[ $# -gt 0 ]]; then
    run "$@"
else
    run cargo clippy -p mimi-core --all-targets --features cuda,cudnn -- -D warnings
    run cargo test -p mimi-core --features cuda,cudnn --lib gpu::
fi
