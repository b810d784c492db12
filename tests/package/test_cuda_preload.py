"""mimi_py._cuda: pip's CUDA libraries are loaded on a CUDA build only, and quietly skipped
when they are absent or unloadable. Runs without a GPU and on any build."""

from pathlib import Path

import pytest

import mimi_py
from mimi_py import _cuda


def test_cpu_build_preloads_nothing():
    if "cuda" in mimi_py.features:
        pytest.skip("a CUDA build")
    assert _cuda.preload() == []
    assert _cuda.loaded == []


def test_lib_dirs_are_found_cu13_first(tmp_path: Path):
    for name in ("cublas", "cu13", "curand"):
        (tmp_path / "nvidia" / name / "lib").mkdir(parents=True)
    (tmp_path / "nvidia" / "not_a_lib_dir").mkdir()
    dirs = _cuda.nvidia_lib_dirs([str(tmp_path), "", str(tmp_path / "missing")])
    assert [d.parent.name for d in dirs] == ["cu13", "cublas", "curand"]


def test_unloadable_or_absent_libraries_are_skipped(tmp_path: Path):
    lib = tmp_path / "nvidia" / "cu13" / "lib"
    lib.mkdir(parents=True)
    (lib / "libcublas.so.13").write_bytes(b"not an ELF file")
    assert _cuda.preload_from([lib, tmp_path / "nowhere"]) == []


def test_cuda_device_is_a_device_error_here():
    """Without the feature: "compiled without"; with it but no driver: the missing library."""
    cfg = mimi_py.TransformerConfig(d_model=16, num_heads=2, num_layers=1, dim_feedforward=32)
    if "cuda" in mimi_py.features and Path("/proc/driver/nvidia").exists():
        pytest.skip("an NVIDIA driver is present")
    match = "could not open cuda:0" if "cuda" in mimi_py.features else "--features cuda"
    with pytest.raises(mimi_py.DeviceError, match=match):
        mimi_py.StreamingTransformer(cfg, device="cuda")
