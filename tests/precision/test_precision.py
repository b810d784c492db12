"""Precision modes of the native CPU engine against ``"highest"`` (docs/precision.md).

``"high"`` (what ``weights_dtype="bfloat16"`` has always meant) stores the transformers' linear
layers and the large frame-rate convolutions in bfloat16 and computes in float32. ``"medium"``
computes those products and the SEANet convolutions with bfloat16 inputs and float32 sums, in
``vdpbf16ps``'s order, the same bits on every CPU. The quantizer keeps float32.

Bounds (docs/precision.md's agreement table, where the measured values are): codebook 0 at
least ``MIN_CODEBOOK0`` equal to ``"highest"``'s codes, all codebooks ``MIN_ALL``, and the
codec's decoding of ``"highest"``'s codes at least ``MIN_SNR_DB`` against ``"highest"``'s. A
code can flip where two centroids are nearly tied, and a flip in one codebook changes the
residual the next ones see, hence agreement, not equality.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys

import numpy as np
import pytest

import mimi_py
from support.paths import CODEC_DIR, REPO, TESTS
from support.reference import assert_close, assert_same

CFG = mimi_py.CodecConfig(**json.loads((CODEC_DIR / "mimi_small_candle_config.json").read_text()))
IO = dict(np.load(CODEC_DIR / "mimi_small_io.npz"))
# minimum fraction of codebook 0's codes, of all codes, and decoded SNR in dB, per precision.
# Measured (docs/precision.md): high at worst 99.6% / 98.4% / 52 dB; medium (its default
# layers) 99.2% / 98.0% / 43.7 dB, the bounds issue 49 set; medium over every layer
# (MIMI_PY_MEDIUM_LAYERS=all, "medium-all") 98.4% / 95.9% / 43.7 dB. "medium" gives these
# bits on every CPU, so the margins allow for a kernel change, not for machines.
BOUNDS = {"high": (0.99, 0.95, 30.0), "medium": (0.99, 0.97, 35.0), "medium-all": (0.97, 0.93, 38.0)}


def snr_db(ref: np.ndarray, x: np.ndarray) -> float:
    ref = ref.astype(np.float64)
    err = float(((ref - x) ** 2).sum())
    return float("inf") if err == 0 else 10 * np.log10(float((ref**2).sum()) / err)


def agreement(
    f32: mimi_py.MimiCodec, bf16: mimi_py.MimiCodec, pcm: np.ndarray, what: str, bounds: str | None = None
) -> None:
    MIN_CODEBOOK0, MIN_ALL, MIN_SNR_DB = BOUNDS[bounds or bf16.precision]
    codes, codes16 = f32.encode(pcm), bf16.encode(pcm)
    assert np.isfinite(decoded := bf16.decode(codes)).all(), f"{what}: non-finite audio"
    equal = codes == codes16
    snr = snr_db(f32.decode(codes), decoded)
    cb0, every = float(equal[:, 0].mean()), float(equal.mean())
    print(f"{what}: codebook 0 {cb0:.1%}, all {every:.1%} equal to highest's; decoded SNR {snr:.1f} dB")
    assert cb0 >= MIN_CODEBOOK0, f"{what}: codebook 0 {cb0:.1%} equal, need {MIN_CODEBOOK0:.0%}"
    assert every >= MIN_ALL, f"{what}: {every:.1%} of codes equal, need {MIN_ALL:.0%}"
    assert snr >= MIN_SNR_DB, f"{what}: decoded SNR {snr:.1f} dB, need {MIN_SNR_DB} dB"


def bench_inputs(seconds: float = 20.0) -> dict[str, np.ndarray]:
    """The agreement table's inputs (the precision suite's ``inputs``, ``benches/suites/precision.py``, loaded by path:
    declared once), (1, 1, samples) each: ``speech-like`` and ``noise``. 20 s is 250
    frames, so one flipped code is 0.4% of a codebook."""
    spec = importlib.util.spec_from_file_location(
        "_bench_precision", REPO / "benches" / "suites" / "precision.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.inputs(seconds)


def speech_like() -> np.ndarray:
    return bench_inputs()["speech-like"]


@pytest.mark.parametrize("precision", ["high", "medium"])
def test_fixture_codec_agrees_with_highest(precision):
    f = CODEC_DIR / "mimi_small.safetensors"
    f32 = mimi_py.MimiCodec(f, config=CFG)
    bf16 = mimi_py.MimiCodec(f, config=CFG, precision=precision)
    assert (f32.weights_dtype, bf16.weights_dtype) == ("float32", "bfloat16")
    assert (f32.precision, bf16.precision, bf16.dtype) == ("highest", precision, "float32")
    agreement(f32, bf16, IO["waveform"], f"fixture codec, {precision}")
    # the bf16 checkpoint, read as stored
    stored = mimi_py.MimiCodec(
        CODEC_DIR / "mimi_small_moshi_bf16.safetensors", config=CFG, precision=precision
    )
    agreement(f32, stored, IO["waveform"], f"fixture codec, bf16 checkpoint, {precision}")


@pytest.mark.parametrize("precision", ["high", "medium"])
def test_real_size_seeded_codec_agrees_with_highest(precision):
    f32 = mimi_py.MimiCodec(seed=0, num_codebooks=32)
    bf16 = mimi_py.MimiCodec(seed=0, num_codebooks=32, precision=precision)
    for what, pcm in bench_inputs().items():
        agreement(f32, bf16, pcm, f"real-size seeded codec, 32 codebooks, 20 s {what}, {precision}")


@pytest.mark.parametrize("precision", ["high", "medium"])
def test_rows_are_independent_streams(precision):
    """12 rows (24 transformer rows a step: three register groups) against each row alone."""
    f = CODEC_DIR / "mimi_small.safetensors"
    batch, frames = 12, 2
    batched = mimi_py.MimiCodec(f, config=CFG, precision=precision)
    alone = mimi_py.MimiCodec(f, config=CFG, precision=precision)
    rng = np.random.default_rng(3)
    pcm = (rng.standard_normal((batch, 1, frames * batched.frame_size)) * 0.1).astype(np.float32)
    active = np.ones(batch, dtype=bool)
    active[[2, 7]] = False
    codes = batched.encode_step(pcm, active=active)
    audio = batched.decode_step(codes, active=active)
    for r in range(batch):
        if not active[r]:
            assert not codes[r].any() and not audio[r].any()
            continue
        alone.reset_state()
        ref = alone.encode_step(pcm[r : r + 1])
        assert_same(codes[r : r + 1], ref)
        # Decoded rows match to rounding, as with float32 weights (tests/streaming/test_batched.py).
        assert_close(audio[r : r + 1], alone.decode_step(ref), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("precision", ["high", "medium"])
def test_transformer_is_close_to_highest_and_steps_as_it_forwards(precision):
    cfg = mimi_py.TransformerConfig(d_model=64, num_heads=4, num_layers=2, dim_feedforward=128, context=16)
    f32 = mimi_py.StreamingTransformer(cfg, seed=5)
    bf16 = mimi_py.StreamingTransformer(cfg, seed=5, precision=precision)
    assert (bf16.weights_dtype, bf16.precision, f32.weights_dtype) == ("bfloat16", precision, "float32")
    x = np.random.default_rng(4).standard_normal((3, 20, 64)).astype(np.float32)
    y, y16 = f32.forward(x), bf16.forward(x)
    # bf16 keeps 8 significant bits of each weight (and, at medium, of each input): a
    # relative error of a few 1e-3
    assert snr_db(y, y16) >= 40.0
    assert bf16.state_dict()["layers.0.self_attn.q_proj.weight"].dtype == np.float32
    # one step at a time gives the offline output (to rounding: the block and the step
    # attend with different kernels, as at "highest")
    bf16.reset_state()
    steps = np.concatenate([bf16.step(x[:, i : i + 1]) for i in range(x.shape[1])], axis=1)
    assert_close(steps, y16, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("cls", [mimi_py.MimiCodec, mimi_py.StreamingTransformer])
def test_bad_precisions_and_weights_dtypes_are_config_errors(cls):
    cfg = mimi_py.TransformerConfig(d_model=64, num_heads=4, num_layers=1, dim_feedforward=128, context=16)
    make = (
        (lambda **kw: cls(seed=0, **kw))
        if cls is mimi_py.MimiCodec
        else (lambda **kw: cls(cfg, seed=0, **kw))
    )
    with pytest.raises(mimi_py.ConfigError, match='"float32" or "bfloat16".*int8'):
        make(weights_dtype="int8")
    # bf16 storage is the native engine's; candle's half-precision engine is dtype=
    with pytest.raises(mimi_py.ConfigError, match='dtype="bfloat16" instead'):
        make(weights_dtype="bfloat16", dtype="bfloat16")
    with pytest.raises(mimi_py.ConfigError, match='"highest", "high" or "medium".*lowest'):
        make(precision="lowest")
    with pytest.raises(mimi_py.ConfigError, match='precision="medium" needs the native CPU engine'):
        make(precision="medium", dtype="float16")
    # both given must agree on how the weights are stored
    with pytest.raises(mimi_py.ConfigError, match='weights_dtype="float32" contradicts precision="medium"'):
        make(precision="medium", weights_dtype="float32")
    assert make(precision="high", weights_dtype="bfloat16").precision == "high"
    assert make(weights_dtype="bfloat16").precision == "high"


def test_weights_nbytes_counts_the_weights_as_stored():
    cfg = mimi_py.TransformerConfig(d_model=64, num_heads=4, num_layers=2, dim_feedforward=128, context=16)
    f32 = mimi_py.StreamingTransformer(cfg, seed=5)
    bf16 = mimi_py.StreamingTransformer(cfg, seed=5, weights_dtype="bfloat16")
    tensors = f32.state_dict()
    assert f32.weights_nbytes == sum(a.nbytes for a in tensors.values())
    # bf16 halves the matrices only (norms, biases and layer scales stay float32)
    matrices = sum(a.nbytes for a in tensors.values() if a.ndim == 2)
    assert bf16.weights_nbytes == f32.weights_nbytes - matrices // 2

    f = CODEC_DIR / "mimi_small.safetensors"
    codec = mimi_py.MimiCodec(f, config=CFG)
    # at least the transformers and every codebook of the checkpoint's four, all float32
    books = CFG.quantizer_n_q * CFG.quantizer_bins * CFG.quantizer_dim * 4
    assert codec.weights_nbytes > 2 * f32.weights_nbytes // 2 + books
    real = mimi_py.MimiCodec(seed=0)
    real16 = mimi_py.MimiCodec(seed=0, weights_dtype="bfloat16")
    # the real codec: 2 transformers of 8 layers (d 512, ff 2048), 26 M convolution weights
    # (the strided ones padded to whole phases), its codebooks of 2048 x 256 (and their norms)
    transformer_params = 2 * 8 * (4 * 512 * 512 + 2 * 512 * 2048)
    books = real.num_codebooks * 2048 * 257
    least = 4 * (transformer_params + 26_000_000 + books)
    assert least < real.weights_nbytes < 1.1 * least
    assert 0.5 * real.weights_nbytes < real16.weights_nbytes < 0.6 * real.weights_nbytes


def test_the_process_default_applies_to_models_built_after_it():
    cfg = mimi_py.TransformerConfig(d_model=64, num_heads=4, num_layers=1, dim_feedforward=128, context=16)
    assert mimi_py.get_float32_matmul_precision() == "highest"
    try:
        mimi_py.set_float32_matmul_precision("medium")
        assert mimi_py.get_float32_matmul_precision() == "medium"
        assert mimi_py.StreamingTransformer(cfg, seed=0).precision == "medium"
        assert mimi_py.MimiCodec(CODEC_DIR / "mimi_small.safetensors", config=CFG).precision == "medium"
        # an explicit argument wins; candle's engine (half precision) is never made to fail
        assert mimi_py.StreamingTransformer(cfg, seed=0, precision="highest").precision == "highest"
        assert mimi_py.StreamingTransformer(cfg, seed=0, weights_dtype="bfloat16").precision == "high"
        half = mimi_py.StreamingTransformer(cfg, seed=0, dtype="bfloat16")
        assert (half.precision, half.kernel_isa) == ("highest", None)
        with pytest.raises(mimi_py.ConfigError, match="lowest"):
            mimi_py.set_float32_matmul_precision("lowest")
        assert mimi_py.get_float32_matmul_precision() == "medium"
    finally:
        mimi_py.set_float32_matmul_precision("highest")


def test_kernel_isa_names_what_the_products_run_on():
    cfg = mimi_py.TransformerConfig(d_model=64, num_heads=4, num_layers=1, dim_feedforward=128, context=16)
    isas = {
        p: mimi_py.StreamingTransformer(cfg, seed=0, precision=p).kernel_isa for p in ("highest", "medium")
    }
    assert set(isas.values()) <= {"avx512bf16", "avx512", "avx2", "portable"}
    # float32 products use AVX-512 at most; medium runs vdpbf16ps where the CPU has it
    assert isas["highest"] != "avx512bf16"


def test_medium_streams_bit_exactly():
    """At "medium", a stream of one frame per call gives the offline codes, and decoding them
    frame by frame the offline audio (the SEANet's own layers bit for bit; the decoder's
    last, float32 layers as at "highest")."""
    c = mimi_py.MimiCodec(CODEC_DIR / "mimi_small.safetensors", config=CFG, precision="medium")
    x, fs = IO["waveform"], c.frame_size
    offline = c.encode(x)
    steps = [c.encode_step(x[..., i : i + fs]) for i in range(0, x.shape[-1] - fs + 1, fs)]
    streamed = np.concatenate(steps, -1)
    assert_same(streamed, offline[..., : streamed.shape[-1]], what="streamed codes at medium")
    audio = c.decode(offline)
    frames = [c.decode_step(offline[..., i : i + 1]) for i in range(offline.shape[-1])]
    assert_close(np.concatenate(frames, -1), audio, atol=1e-5, rtol=1e-5, what="streamed audio at medium")


# Run in a fresh process (MIMI_PY_ISA is read once): the fixture codec at "medium", its codes
# and its decoding of the fixture's codes, with the kernels capped at `isa`.
MEDIUM_RUN = """
import json, sys
import numpy as np
import mimi_py
from support.models import small_codec_config
from support.paths import CODEC_DIR, REPO, TESTS
io = dict(np.load(CODEC_DIR / "mimi_small_io.npz"))
c = mimi_py.MimiCodec(CODEC_DIR / "mimi_small.safetensors", config=small_codec_config(), precision="medium")
x = io["waveform"][..., : 24000]
np.savez(sys.argv[1], codes=c.encode(x), audio=c.decode(io["codes"][..., :12]))
assert mimi_py.settings()["MIMI_PY_MEDIUM_LAYERS"] == "all"
print(json.dumps({"kernel_isa": c.kernel_isa}))
"""


def _medium_run(tmp_path, isa: str) -> tuple[str, dict]:
    out = tmp_path / f"{isa}.npz"
    env = dict(os.environ, MIMI_PY_ISA=isa, MIMI_PY_MEDIUM_LAYERS="all")  # every group in bf16
    run = subprocess.run(
        [sys.executable, "-c", MEDIUM_RUN, str(out)], env=env, capture_output=True, text=True, cwd=TESTS
    )
    assert run.returncode == 0, run.stderr
    return json.loads(run.stdout)["kernel_isa"], dict(np.load(out))


def test_medium_gives_the_same_bits_on_every_instruction_set(tmp_path):
    """The emulations (AVX-512 and AVX2 FMAs, plain Rust) give the bits of vdpbf16ps, so
    "medium" computes the same codes and audio on every CPU: each level this CPU runs, capped
    by MIMI_PY_ISA, against the best. The convolutions' float32 layers (the first and the
    last) run gemm, which picks its own instructions: the audio is compared to rounding."""
    best_isa, best = _medium_run(tmp_path, "auto")
    levels = ["avx512bf16", "avx512", "avx2", "portable"]
    ran = set()
    for isa in levels[levels.index(best_isa) + 1 :]:
        got_isa, got = _medium_run(tmp_path, isa)
        assert got_isa == isa
        ran.add(isa)
        assert_same(got["codes"], best["codes"], what=f"codes at medium on {isa} vs {best_isa}")
        assert_close(got["audio"], best["audio"], atol=1e-5, rtol=1e-5, what=f"audio on {isa}")
    assert {"avx2", "portable"} <= ran | {best_isa}


# Run in a fresh process (MIMI_PY_MEDIUM_LAYERS is read once): "medium" over every layer,
# the encoder's convolutions included, against "highest".
MEDIUM_ALL_RUN = """
import mimi_py
from test_precision import CFG, CODEC_DIR, IO, agreement, speech_like
assert mimi_py.settings()["MIMI_PY_MEDIUM_LAYERS"] == "all"
f = CODEC_DIR / "mimi_small.safetensors"
f32, med = (mimi_py.MimiCodec(f, config=CFG, precision=p) for p in ("highest", "medium"))
agreement(f32, med, IO["waveform"], "fixture codec, medium over every layer", "medium-all")
f32, med = (mimi_py.MimiCodec(seed=0, num_codebooks=32, precision=p) for p in ("highest", "medium"))
agreement(f32, med, speech_like(), "real-size, 20 s, medium over every layer", "medium-all")
"""


def test_medium_over_every_layer_agrees_within_its_own_bounds():
    env = dict(os.environ, MIMI_PY_MEDIUM_LAYERS="all")
    env["PYTHONPATH"] = os.pathsep.join([str(TESTS), str(TESTS / "precision"), env.get("PYTHONPATH", "")])
    run = subprocess.run(
        [sys.executable, "-c", MEDIUM_ALL_RUN], env=env, capture_output=True, text=True, cwd=TESTS
    )
    assert run.returncode == 0, run.stderr + run.stdout
