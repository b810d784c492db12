"""Huge inputs and oversized models: zero-stride views of shapes that would not fit in memory
(2**40 samples, 8 GB activations, 2**36 frames of codes) and configs too large to build, each
in a subprocess limited to 4 GiB of address space. Each is a clear error (a MimiError, or
numpy's own MemoryError while converting), never an abort or an OOM kill. Inputs within the
size limit whose call would not fit are refused by the memory estimate (ResourceError)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from support.paths import CODEC_DIR, REPO

HUGE_SCRIPT = textwrap.dedent(
    """
    import json, resource, sys
    resource.setrlimit(resource.RLIMIT_AS, (__LIMIT__, __LIMIT__))
    import numpy as np, mimi_py as M
    case = sys.argv[1]
    codec_dir = sys.argv[2]
    def small_codec():
        cfg = M.CodecConfig(**json.load(open(codec_dir + "/mimi_small_candle_config.json")))
        return M.MimiCodec(codec_dir + "/mimi_small.safetensors", config=cfg)
    TF = M.TransformerConfig(d_model=32, num_heads=2, num_layers=2, dim_feedforward=64, context=8)
    T = 2**40
    try:
        if case == "forward_f32":
            M.StreamingTransformer(TF).forward(np.broadcast_to(np.float32(0.5), (1, T, 32)))
        elif case == "step_f64":
            M.StreamingTransformer(TF).step(np.broadcast_to(np.float64(0.5), (1, T, 32)))
        elif case == "forward_f16":
            M.StreamingTransformer(TF).forward(np.broadcast_to(np.float16(0.5), (1, T, 32)))
        elif case == "forward_batch":
            M.StreamingTransformer(TF).forward(np.broadcast_to(np.float32(0.5), (T, 1, 32)))
        elif case == "forward_8GB":
            M.StreamingTransformer(TF).forward(np.broadcast_to(np.float32(0.5), (1, 2**26, 32)))
        elif case == "encode":
            small_codec().encode(np.broadcast_to(np.float32(0.1), (T,)))
        elif case == "encode_latents":
            small_codec().encode_latents(np.broadcast_to(np.float32(0.1), (1, 1, T)))
        elif case == "encode_step":
            small_codec().encode_step(np.broadcast_to(np.float32(0.1), (T,)))
        elif case == "decode":
            small_codec().decode(np.broadcast_to(np.uint32(1), (1, 4, 2**36)))
        elif case == "decode_step":
            small_codec().decode_step(np.broadcast_to(np.uint32(1), (1, 4, 2**36)))
        elif case == "encode_over_memory":
            small_codec().encode(np.broadcast_to(np.float32(0.1), (1, 1, 2**27)))
        elif case == "encode_latents_over_memory":
            small_codec().encode_latents(np.broadcast_to(np.float32(0.1), (2**27,)))
        elif case == "encode_step_over_memory":
            small_codec().encode_step(np.broadcast_to(np.float32(0.1), (1, 1, 2**27)))
        elif case == "decode_over_memory":
            small_codec().decode(np.broadcast_to(np.uint32(1), (1, 4, 2**16)))
        elif case == "decode_step_over_memory":
            small_codec().decode_step(np.broadcast_to(np.uint32(1), (1, 4, 2**16)))
        elif case == "empty_batch_encode":
            small_codec().encode(np.zeros((2**31, 1, 0), np.float32))
        elif case == "empty_batch_decode":
            small_codec().decode(np.zeros((2**31, 4, 0), np.uint32))
        elif case == "empty_batch_decode_step":
            small_codec().decode_step(np.zeros((2**31, 4, 0), np.uint32))
        elif case == "empty_batch_forward":
            M.StreamingTransformer(TF).forward(np.zeros((2**31, 0, 32), np.float32))
        elif case == "transformer_config":
            M.StreamingTransformer(M.TransformerConfig(d_model=2**16, num_heads=2, num_layers=64,
                                                       dim_feedforward=2**20))
        elif case == "codec_config":
            cfg = M.CodecConfig(**json.load(open(codec_dir + "/mimi_small_candle_config.json")))
            M.MimiCodec(config=cfg.replace(quantizer_bins=2**31))
        print("RESULT ok")
    except BaseException as e:
        print("RESULT", type(e).__name__, isinstance(e, M.MimiError), str(e)[:300].replace(chr(10), " "))
    """
)


@pytest.mark.parametrize(
    "case",
    [
        "forward_f32",
        "step_f64",
        "forward_f16",
        "forward_batch",
        "forward_8GB",
        "encode",
        "encode_latents",
        "encode_step",
        "decode",
        "decode_step",
        "transformer_config",
        "codec_config",
    ],
)
def test_huge_sizes_are_a_clear_error_not_a_crash(case):
    """Zero-stride views of shapes that would not fit in memory (and oversized models), in a
    subprocess limited to 4 GiB of address space: a clear error (MimiError, or numpy's own
    MemoryError while converting), never an abort or an OOM kill."""
    name, is_mimi, line = run_huge(case)
    assert is_mimi or name == "MemoryError", line


@pytest.mark.parametrize(
    "case",
    [
        "encode_over_memory",
        "encode_latents_over_memory",
        "encode_step_over_memory",
        "decode_over_memory",
        "decode_step_over_memory",
    ],
)
def test_calls_that_would_not_fit_are_refused_by_the_memory_estimate(case):
    """Audio of 2**27 samples (or codes decoding to as many) is within the size limit, but the
    call's working memory is not within 4 GiB of address space: offline and streaming calls
    alike raise ResourceError (the core's one memory check), before computing anything."""
    name, _, line = run_huge(case)
    assert name == "ResourceError" and "GiB of memory" in line, line


@pytest.mark.parametrize(
    "case", ["empty_batch_encode", "empty_batch_decode", "empty_batch_decode_step", "empty_batch_forward"]
)
def test_an_empty_array_of_an_enormous_batch_is_a_shape_error(case):
    """An array with no values but 2**31 rows costs nothing to make, and passes the size rule
    (it holds 0 values); the fuzzer found that a call then listed its rows and aborted. The
    batch is bounded on its own: ShapeError, naming the batch, before any work per row."""
    name, _, line = run_huge(case)
    assert name == "ShapeError" and "batch of 2147483648 rows" in line, line


def run_huge(case):
    """Runs one case of HUGE_SCRIPT in a subprocess limited to 4 GiB of address space; returns
    the exception's class name ("ok" if none), whether it is a MimiError, and the line."""
    limit = 4 * 2**30
    env = dict(os.environ, RAYON_NUM_THREADS="1", MALLOC_ARENA_MAX="2", RUST_BACKTRACE="0")
    p = subprocess.run(
        [sys.executable, "-c", HUGE_SCRIPT.replace("__LIMIT__", str(limit)), case, str(CODEC_DIR)],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        cwd=str(REPO),
    )
    out = p.stdout + p.stderr
    assert p.returncode == 0, f"process died (rc={p.returncode}): {out[-600:]}"
    line = [x for x in p.stdout.splitlines() if x.startswith("RESULT")][-1]
    _, name, *rest = line.split(" ", 3)
    assert name != "ok", f"a huge input was accepted?: {line}"
    return name, bool(rest) and rest[0] == "True", line
