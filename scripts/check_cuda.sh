#!/usr/bin/env bash
# Type-checks the CUDA build without a GPU: the same setup as scripts/build_cuda_wheel.sh
# (CUDA 13.0 nvcc from PyPI, candle patched for run-time loading, a source copy), then
#
#   cargo check --features cuda --all-targets      (or the command given as arguments)
#
# in its own target folder. It still runs candle-kernels' build script, i.e. nvcc compiles every
# PTX kernel and the MoE/GGUF static library for CUDA_COMPUTE_CAP (default 90): that is most of
# the time. CLEAN=1 starts from an empty target folder.
#
#   scripts/check_cuda.sh
#   scripts/check_cuda.sh cargo clippy --profile fast --all-targets --features cuda -- -D warnings
set -euo pipefail

# shellcheck source=build_cuda_wheel.sh
source "$(dirname "${BASH_SOURCE[0]}")/build_cuda_wheel.sh"

setup_cuda_build check-src
export CARGO_TARGET_DIR="$BUILD_DIR/check-target"
if [[ "${CLEAN:-0}" != 0 ]]; then
    rm -rf "$CARGO_TARGET_DIR"
fi
if [[ $# -eq 0 ]]; then
    set -- cargo check --features cuda --all-targets
fi
start=$SECONDS
"$@"
echo "$*: $((SECONDS - start)) s"
