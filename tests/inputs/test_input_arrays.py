"""Arrays in every float and integer dtype and every memory layout, and non-finite values.

Inputs in Fortran order, with negative strides, as strided slices, transposes, zero-stride
broadcasts, read-only or unaligned are read in logical order: the result is exactly that of
the same values passed C-contiguous. NaN and Inf are refused, whatever the chunking, and the
refused call leaves the stream unchanged. Deterministic, on inputs whose axes are all longer
than 1 (so that C- and Fortran-contiguity differ), in addition to the generated cases of
transformer/test_transformer_inputs and codec/test_codec_inputs. The shared checks are in
tests/support/hostile.py.
"""

from __future__ import annotations

import numpy as np
import pytest

import mimi_py as M
from safetensors_file import read_safetensors
from support.hostile import FLOAT_DTYPES, LAYOUTS, call, lay_out, same
from support.models import BINS, CODEC_FILE, FRAME, TF_CFG, D, K, small_codec_config, tf_pair, tf_weights
from support.ondevice import make_codec, make_transformer

TF_LAYOUT_SHAPES, TF_LAYOUT_AXES = [(2, 3, D), (1, 3, D)], (0, 1, 2)
PCM_LAYOUT_SHAPE, PCM_LAYOUT_AXES = (2, 1, FRAME + 100), (0, 2)
FLOAT_LAYOUTS = [pytest.param(dt, lay, id=f"{dt}-{lay}") for dt in FLOAT_DTYPES for lay in LAYOUTS]


def test_fortran_ordered_inputs_are_read_in_logical_order():
    """Regression: Fortran-ordered float32 inputs were once read in memory order."""
    x = (np.arange(2 * 3 * D, dtype=np.float32).reshape(2, 3, D) / 50.0) - 1.0
    t, c = tf_pair()
    same(t.forward(np.asfortranarray(x)), c.forward(x), "Fortran-ordered input")


def check_transformer_layout(shape, dtype, layout, axis):
    x = np.random.default_rng(7).standard_normal(shape).astype(dtype)
    a = lay_out(x, layout, axis)
    t, c = tf_pair()
    kind, r = call(t.forward, a)
    assert kind == "ok", r
    same(r, c.forward(np.array(a, dtype=np.float32, order="C")), f"{shape} {dtype} {layout} axis={axis}")


@pytest.mark.parametrize("dtype,layout", FLOAT_LAYOUTS)
def test_the_transformer_reads_every_float_dtype_in_every_layout_in_logical_order(dtype, layout):
    for shape in TF_LAYOUT_SHAPES:
        for axis in TF_LAYOUT_AXES:
            check_transformer_layout(shape, dtype, layout, axis)


@pytest.mark.parametrize("dtype,layout", FLOAT_LAYOUTS)
def test_encode_and_encode_step_read_every_float_dtype_in_every_layout_in_logical_order(
    codec_pair, dtype, layout
):
    codec, control = codec_pair
    x = (np.random.default_rng(8).standard_normal(PCM_LAYOUT_SHAPE) * 0.1).astype(dtype)
    for axis in PCM_LAYOUT_AXES:
        a = lay_out(x, layout, axis)
        ref = np.array(a, dtype=np.float32, order="C")
        kind, r = call(codec.encode, a)
        assert kind == "ok", r
        same(r, control.encode(ref), f"encode {dtype} {layout} axis={axis}")
        codec.reset_state()
        control.reset_state()
        kind, r = call(codec.encode_step, a)
        assert kind == "ok", r
        same(r, control.encode_step(ref), f"encode_step {dtype} {layout} axis={axis}")


@pytest.mark.parametrize("dtype", ["int8", "uint16", "int64", "uint64", ">i4"])
@pytest.mark.parametrize("layout", LAYOUTS)
def test_decode_reads_every_integer_dtype_in_every_layout_in_logical_order(codec_pair, dtype, layout):
    codec, control = codec_pair
    x = np.random.default_rng(9).integers(0, BINS, (2, K, 2)).astype(dtype)
    for axis in (0, 2):
        a = lay_out(x, layout, axis)
        kind, r = call(codec.decode, a)
        assert kind == "ok", r
        same(r, control.decode(np.array(a, dtype=np.uint32, order="C")), f"decode {dtype} {layout}")


def test_a_transformer_weights_mapping_in_fortran_order_loads_the_same_model():
    """{name: array} with Fortran-ordered (e.g. transposed-back) float32 arrays: same model."""
    x = np.random.default_rng(10).standard_normal((1, 3, D)).astype(np.float32)
    ref = make_transformer(TF_CFG, tf_weights()).forward(x)
    w = {k: np.asfortranarray(v) for k, v in tf_weights().items()}
    same(make_transformer(TF_CFG, w).forward(x), ref, "Fortran-ordered weights")


def test_a_codec_weights_mapping_in_fortran_order_loads_the_same_model(codec_pair):
    codec, _ = codec_pair
    w = {k: np.asfortranarray(v) for k, v in read_safetensors(CODEC_FILE).items()}
    pcm = (np.random.default_rng(11).standard_normal(4000) * 0.1).astype(np.float32)
    same(make_codec(w, config=small_codec_config()).encode(pcm), codec.encode(pcm), "codes")


# ---------------------------------------------------------------- NaN / Inf in the transformer
# Non-finite inputs are refused (InvalidInputError) by forward and step alike, whatever the
# chunking, and the refused call leaves the stream unchanged. (Letting them propagate made
# the result depend on chunking: a NaN key contaminates masked-out positions.)


@pytest.mark.parametrize("special", [np.nan, np.inf, -np.inf])
@pytest.mark.parametrize("chunk", [1, 5, 30])
def test_nan_and_inf_are_refused_and_change_nothing(special, chunk):
    x = np.random.default_rng(0).standard_normal((2, 30, D)).astype(np.float32)
    t, c = tf_pair()
    same(t.forward(x[:, :4]), c.forward(x[:, :4]), "prime")
    bad = x[:, 4 : 4 + chunk].copy()
    bad[1, -1, 3] = special
    for f in (t.forward, t.step):
        with pytest.raises(M.InvalidInputError, match="NaN or Inf"):
            f(bad)
    assert t.position == c.position == 4
    same(t.forward(x[:, 4:]), c.forward(x[:, 4:]), "after the refused call")


def test_each_call_checks_its_input_shape_once():
    """The binding checks shape, size and memory before copying an array, and the core's call
    trusts that check (it is not repeated); an array passed straight to the core is checked
    there. Counted by the core (`_shape_checks_made`), for every call that takes an array."""
    codec = make_codec(config=small_codec_config(), seed=3)
    model = make_transformer(TF_CFG)
    pcm = (np.random.default_rng(2).standard_normal((2, 1, 2 * FRAME)) * 0.1).astype(np.float32)
    codes = codec.encode(pcm)
    calls = {
        "encode": lambda: codec.encode(pcm),
        "encode lengths=": lambda: codec.encode(pcm, lengths=[FRAME, 2 * FRAME]),
        "encode_latents": lambda: codec.encode_latents(pcm),
        "decode": lambda: codec.decode(codes),
        "decode_latents": lambda: codec.decode_latents(codes),
        "encode_step": lambda: codec.encode_step(pcm),
        "encode_step active=": lambda: codec.encode_step(pcm, active=np.array([True, False])),
        "decode_step": lambda: codec.decode_step(codes),
        "forward": lambda: model.forward(np.zeros((1, 3, D), np.float32)),
        "step": lambda: model.step(np.zeros((1, 1, D), np.float32)),
    }
    for name, run in calls.items():
        before = M._core._shape_checks_made()
        run()
        assert M._core._shape_checks_made() - before == 1, name
    before = M._core._shape_checks_made()
    with pytest.raises(M.ShapeError):
        codec.encode(pcm[:, :, :, None])
    assert M._core._shape_checks_made() - before == 1, "a refused call checks once too"
