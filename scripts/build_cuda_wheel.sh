#!/usr/bin/env bash
# Builds the CUDA wheel of mimi_py on a machine without a GPU or a system CUDA toolkit.
#
#   scripts/build_cuda_wheel.sh [DIST_DIR]        # default DIST_DIR: dist/cuda
#   CUDA_COMPUTE_CAP=80 scripts/build_cuda_wheel.sh
#
# What it does:
#   1. A throwaway venv ($MIMI_CUDA_BUILD_DIR/venv, default target/cuda-build/venv) gets NVIDIA's
#      compiler and headers from PyPI, pinned to CUDA 13.0: nvidia-cuda-nvcc, nvidia-nvvm,
#      nvidia-cuda-crt, nvidia-cuda-runtime, nvidia-cuda-cccl, nvidia-cuda-nvrtc (== 13.0.*; NVRTC
#      for scripts/check_cuda.sh's kernel-compile test), plus maturin.
#      Not 13.5+: nvcc 13.5 writes PTX ISA 9.5, which the target driver (580, CUDA 13.0) refuses.
#      CUDA_ROOT is <site-packages>/nvidia/cu13 and its bin/ (nvcc) goes first on PATH.
#   2. Run-time loading instead of link-time linking. candle-core 0.11.1 asks cudarc 0.19.10 for
#      `dynamic-linking` (NEEDED libcuda, libcublas, libcublasLt, libcurand, libnvrtc: the module
#      would not even import without a driver), and cudarc refuses `dynamic-loading` next to it.
#      So the script copies two crates from the cargo registry into the build folder and changes
#      one line in each:
#        - candle-core-0.11.1/Cargo.toml: the cudarc feature "dynamic-linking" -> "dynamic-loading"
#          (cudarc then dlopens each library by soname on first use);
#        - candle-kernels-0.11.1/build.rs: its static MoE/GGUF kernel library links the CUDA
#          runtime as `dylib=cudart` (NEEDED libcudart.so.13); it links the static runtime
#          (libcudart_static.a from nvidia-cuda-runtime) instead. The static runtime itself
#          dlopens libcuda.so.1 when first used.
#      cargo sees them through [patch.crates-io] in a .cargo/config.toml of a copy of the source
#      tree in the build folder, so the checkout (its Cargo.lock, normal CPU builds) is untouched
#      and no candle/cudarc source is vendored in the repository.
#   3. `maturin build --release --features cuda,cudnn,ext-module,abi3` (ext-module and abi3 are what
#      [tool.maturin] in pyproject.toml sets; named here so the command says it all) writes one
#      abi3 wheel (CPython >= 3.10) into DIST_DIR.
#
# Compute capability: CUDA_COMPUTE_CAP (default 90). candle-kernels compiles its kernels for ONE
# architecture, through cudaforge, which adds the `a` suffix from 90 up: "90" means PTX for
# compute_90a and cubins for sm_90a, which run on Hopper only (H100, H200, GH200). For another GPU
# set e.g. CUDA_COMPUTE_CAP=80 (PTX compute_80: JIT-compiled by the driver on every GPU >= 8.0,
# Ampere, Ada, Hopper, Blackwell; bf16 kernels need >= 80), 89 (Ada), 100 / 120 (Blackwell,
# 100a / 120a). nvcc 13.0 accepts 75 and up (Turing); below 80 candle's bf16 kernels are left out.
#
# At run time the wheel needs the NVIDIA driver (libcuda.so.1) and the CUDA 13 libraries cuBLAS
# (libcublas.so.13, libcublasLt.so.13), cuRAND (libcurand.so.10) and NVRTC (libnvrtc.so.13).
# cudarc dlopens them by soname, so they are found (a) through LD_LIBRARY_PATH / ldconfig (a
# system CUDA toolkit), or (b) from pip's nvidia-* wheels (nvidia-cublas, nvidia-curand,
# nvidia-cuda-nvrtc, as PyTorch installs them): `import mimi_py` preloads every
# site-packages/nvidia/*/lib/*.so.* it finds (python/mimi_py/_cuda.py), so no LD_LIBRARY_PATH is
# needed. Without them, device="cuda" raises mimi_py.DeviceError naming the missing library;
# the CPU path works everywhere.
#
# Environment: PYTHON (for the venv, default python3), MIMI_CUDA_BUILD_DIR (default
# target/cuda-build), CUDA_COMPUTE_CAP. A first build takes about 20 minutes on 2 cores (most of
# it nvcc), a rebuild after a change to mimi_py about 1.5 minutes (run it under nice).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD_DIR="${MIMI_CUDA_BUILD_DIR:-$ROOT/target/cuda-build}"
export CUDA_COMPUTE_CAP="${CUDA_COMPUTE_CAP:-90}"
CANDLE_VERSION=0.11.1
NVIDIA_PINS=(
    "nvidia-cuda-nvcc==13.0.*"
    "nvidia-nvvm==13.0.*"
    "nvidia-cuda-crt==13.0.*"
    "nvidia-cuda-runtime==13.0.*"
    "nvidia-cuda-cccl==13.0.*"
    "nvidia-cuda-nvrtc==13.0.*"
)

# The registry copy of a crate (cargo fetch puts it there).
registry_crate() {
    local dir
    dir="$(ls -d "${CARGO_HOME:-$HOME/.cargo}"/registry/src/*/"$1" 2>/dev/null | head -n 1 || true)"
    if [[ -z "$dir" ]]; then
        echo "error: $1 is not in the cargo registry (run \`cargo fetch\` in $ROOT)" >&2
        return 1
    fi
    echo "$dir"
}

# Copies a crate and applies one sed expression to one file; fails if nothing changed. An
# identical earlier copy is kept (its mtimes too), so cargo does not rebuild the crate (for
# candle-kernels: rerun nvcc) every time.
patch_crate() {
    local crate="$1" file="$2" expr="$3" src dest="$BUILD_DIR/patched/$1" tmp
    src="$(registry_crate "$crate")"
    mkdir -p "$BUILD_DIR/patched"
    tmp="$(mktemp -d "$BUILD_DIR/patched/.tmp.XXXXXX")"
    cp -a "$src" "$tmp/$crate"
    chmod -R u+w "$tmp/$crate"
    sed -i -e "$expr" "$tmp/$crate/$file"
    if cmp -s "$src/$file" "$tmp/$crate/$file"; then
        rm -rf "$tmp"
        echo "error: the patch of $crate/$file changed nothing (expression: $expr)" >&2
        return 1
    fi
    echo "patched $crate/$file:"
    diff "$src/$file" "$tmp/$crate/$file" || true
    if [[ -d "$dest" ]] && diff -rq "$tmp/$crate" "$dest" >/dev/null; then
        rm -rf "$tmp"
    else
        rm -rf "$dest"
        mv "$tmp/$crate" "$dest"
        rmdir "$tmp"
    fi
}

# The toolchain venv, CUDA_ROOT/PATH, the patched crates and a source copy that uses them,
# in $BUILD_DIR/${1:-src}. Afterwards: cwd is that copy, CARGO_TARGET_DIR is $BUILD_DIR/target,
# $VENV_PY is the venv's python.
setup_cuda_build() {
    mkdir -p "$BUILD_DIR"
    if [[ ! -x "$BUILD_DIR/venv/bin/python" ]]; then
        "${PYTHON:-python3}" -m venv "$BUILD_DIR/venv"
    fi
    VENV_PY="$BUILD_DIR/venv/bin/python"
    "$VENV_PY" -m pip install --quiet --disable-pip-version-check "${NVIDIA_PINS[@]}" "maturin>=1.9,<2"

    local site
    site="$("$VENV_PY" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
    export CUDA_ROOT="$site/nvidia/cu13"
    export PATH="$CUDA_ROOT/bin:$BUILD_DIR/venv/bin:$PATH"
    echo "CUDA_ROOT=$CUDA_ROOT CUDA_COMPUTE_CAP=$CUDA_COMPUTE_CAP"
    nvcc --version | tail -n 2

    (cd "$ROOT" && cargo fetch --quiet)
    # 1. cudarc: dlopen at run time instead of NEEDED entries.
    patch_crate "candle-core-$CANDLE_VERSION" Cargo.toml 's/"dynamic-linking"/"dynamic-loading"/'
    # 2. candle-kernels: the static CUDA runtime instead of libcudart.so.
    patch_crate "candle-kernels-$CANDLE_VERSION" build.rs \
        's|println!("cargo:rustc-link-lib=dylib=cudart");|println!("cargo:rustc-link-search=native={}/lib", env::var("CUDA_ROOT").expect("CUDA_ROOT")); println!("cargo:rustc-link-lib=static=cudart_static");|'

    # A copy of the sources (tracked and untracked, not ignored) with the patch in its own
    # .cargo/config.toml. Only files whose content changed are rewritten (with a new mtime), so
    # cargo rebuilds what changed and nothing else.
    local src="$BUILD_DIR/${1:-src}" stage="$BUILD_DIR/${1:-src}.stage" f
    rm -rf "$stage"
    mkdir -p "$stage" "$src/.cargo"
    (cd "$ROOT" && git ls-files -co --exclude-standard -- Cargo.toml Cargo.lock pyproject.toml \
        README.md crates src python | tar -cf - -T -) | tar -xf - -C "$stage"
    while IFS= read -r f; do
        if ! cmp -s "$stage/$f" "$src/$f"; then
            mkdir -p "$(dirname "$src/$f")"
            cp "$stage/$f" "$src/$f"
        fi
    done < <(cd "$stage" && find . -type f)
    while IFS= read -r f; do
        [[ -e "$stage/$f" ]] || rm -f "$src/$f"
    done < <(cd "$src" && find . -type f -not -path './.cargo/*' -not -name Cargo.lock)
    rm -rf "$stage"
    cat >"$src/.cargo/config.toml" <<EOF
# Written by scripts/build_cuda_wheel.sh: run-time loading of the CUDA libraries.
[patch.crates-io]
candle-core = { path = "$BUILD_DIR/patched/candle-core-$CANDLE_VERSION" }
candle-kernels = { path = "$BUILD_DIR/patched/candle-kernels-$CANDLE_VERSION" }
EOF
    export CARGO_TARGET_DIR="$BUILD_DIR/target"
    cd "$src"
}

main() {
    local dist="${1:-$ROOT/dist/cuda}"
    mkdir -p "$dist"
    dist="$(cd "$dist" && pwd)"
    setup_cuda_build
    local start=$SECONDS
    maturin build --release --features cuda,cudnn,ext-module,abi3 --out "$dist"
    echo "maturin build: $((SECONDS - start)) s"
    local so
    so="$(find "$CARGO_TARGET_DIR/release" -maxdepth 1 -name 'libmimi_py.so' | head -n 1)"
    if [[ -n "$so" ]]; then
        echo "NEEDED of $so ($(du -h "$so" | cut -f1)):"
        readelf -d "$so" | grep NEEDED || true
        if readelf -d "$so" | grep NEEDED | grep -E 'lib(cuda|cublas|cublasLt|curand|cudart|nvrtc)\.'; then
            echo "error: the module links a CUDA library at load time" >&2
            exit 1
        fi
    fi
    ls -l "$dist"/*.whl
}

if [[ "${BASH_SOURCE[0]}" == "$0" ]]; then
    main "$@"
fi
