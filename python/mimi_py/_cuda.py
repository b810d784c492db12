"""CUDA libraries from pip's ``nvidia-*`` wheels, for a CUDA build of mimi_py.

A CUDA build (``scripts/build_cuda_wheel.sh``) links no CUDA library: cudarc opens the driver
(``libcuda.so.1``), cuBLAS, cuRAND and NVRTC by soname when a CUDA device is first opened. The
dynamic loader finds them through ``LD_LIBRARY_PATH`` and ldconfig, but not in site-packages,
where pip's ``nvidia-cublas``, ``nvidia-curand``, ``nvidia-cuda-nvrtc`` and
``nvidia-cuda-runtime`` wheels (those PyTorch installs, for one) put them
(``nvidia/cu13/lib`` for CUDA 13, ``nvidia/<name>/lib`` for CUDA 12). So at import, a CUDA build
loads the ones it finds with ``RTLD_GLOBAL``; cudarc's ``dlopen("libcublas.so.13")`` then finds
the already loaded library by its soname. Whatever is missing is skipped quietly: opening a CUDA
device then raises ``DeviceError`` naming the library. A CPU build does nothing.

``MIMI_PY_NO_CUDA_PRELOAD=1`` turns this off (to use only ``LD_LIBRARY_PATH``).
"""

from __future__ import annotations

import ctypes
import os
import sys
from collections.abc import Iterable
from pathlib import Path

from ._core import features

# The wheel is built against CUDA 13.0. Dependencies first: cuBLAS needs cuBLASLt. cuRAND keeps
# its own major version (10).
_SONAMES = (
    "libcudart.so.13",
    "libnvrtc.so.13",
    "libcublasLt.so.13",
    "libcublas.so.13",
    "libcurand.so.10",
)

loaded: list[str] = []
"""The paths loaded at import (empty on a CPU build or without pip's CUDA libraries)."""


def nvidia_lib_dirs(roots: Iterable[str] | None = None) -> list[Path]:
    """The ``nvidia/*/lib`` folders under ``roots`` (default: ``sys.path``), CUDA 13's first."""
    found: list[Path] = []
    for root in sys.path if roots is None else roots:
        if not root:
            continue
        for lib in sorted(Path(root).glob("nvidia/*/lib"), key=lambda p: p.parent.name != "cu13"):
            if lib.is_dir() and lib not in found:
                found.append(lib)
    return found


def preload_from(dirs: Iterable[Path]) -> list[str]:
    """Loads each of the CUDA sonames from the first folder that has it; returns the paths."""
    done: list[str] = []
    dirs = list(dirs)
    for soname in _SONAMES:
        for d in dirs:
            path = d / soname
            if not path.is_file():
                continue
            try:
                ctypes.CDLL(str(path), mode=ctypes.RTLD_GLOBAL)
            except OSError:
                continue  # not loadable here (wrong architecture, a missing dependency): next
            done.append(str(path))
            break
    return done


def preload() -> list[str]:
    """What ``import mimi_py`` runs: loads pip's CUDA libraries on a Linux CUDA build."""
    if "cuda" not in features or not sys.platform.startswith("linux"):
        return []
    if os.environ.get("MIMI_PY_NO_CUDA_PRELOAD", "") not in ("", "0"):
        return []
    return preload_from(nvidia_lib_dirs())


loaded.extend(preload())
