"""Weights from a safetensors file, a mapping and a seed; prefixes; the HF q/k layout; corrupt
checkpoints (truncated, bad headers, wrong dtypes or shapes, missing or extra tensors) are
WeightsErrors that name the path and the problem."""

from __future__ import annotations

import json
import os
import shutil
import struct
from pathlib import Path

import numpy as np
import pytest

import mimi_py
from safetensors_file import read_safetensors, write_safetensors
from support.hostile import assert_allowed, call
from support.models import CODEC_FILE, TF_CFG, small_codec_config, tf_weights
from support.ondevice import assert_row, make_codec, make_transformer, tolerance
from support.reference import assert_close, assert_same, load_case, to_hf_layout


@pytest.fixture(scope="module")
def small():
    meta, cfg, weights, arrays = load_case("small_rope")
    return meta, cfg, weights, arrays


def test_file_dict_and_seed_agree(tmp_path, small):
    meta, cfg, weights, arrays = small
    config = mimi_py.TransformerConfig(**cfg)
    seeded = make_transformer(config, seed=11)
    sd = seeded.state_dict()
    assert set(sd) == set(weights)
    for k, v in sd.items():
        assert v.shape == weights[k].shape and v.dtype == np.float32
    path = tmp_path / "w.safetensors"
    write_safetensors(path, sd)
    from_file = make_transformer(config, str(path))
    from_pathlike = make_transformer(config, Path(path))
    from_dict = make_transformer(config, sd)
    x = arrays["x"]
    y = seeded.forward(x)
    for other in (from_file, from_pathlike, from_dict):
        assert_same(other.forward(x), y)
    # the same seed gives the same weights; another seed does not
    again = make_transformer(config, seed=11).state_dict()
    other = make_transformer(config, seed=12).state_dict()
    k = "layers.0.self_attn.q_proj.weight"
    assert_same(again[k], sd[k])
    assert not np.array_equal(other[k], sd[k])


def test_fixture_weights_from_file_match_reference(tmp_path, small):
    meta, cfg, weights, arrays = small
    path = tmp_path / "fixture.safetensors"
    write_safetensors(path, weights)
    t = make_transformer(mimi_py.TransformerConfig(**cfg), path)
    assert_close(t.forward(arrays["x"]), arrays["y_full"], *tolerance(meta["tolerance"]), "from file")


def test_float16_and_float64_weights_are_accepted(tmp_path, small):
    meta, cfg, weights, arrays = small
    w64 = {k: v.astype(np.float64) for k, v in weights.items()}
    t = make_transformer(mimi_py.TransformerConfig(**cfg), w64)
    assert_close(t.forward(arrays["x"]), arrays["y_full"], *tolerance(meta["tolerance"]), "float64 dict")
    # float16 weights are widened exactly and computed in float32: the result is that of the
    # same rounded values given as float32, bit for bit, and within float16's rounding of the
    # reference (2^-11 relative per weight: measured 1.8e-4 of the peak; bound 1e-3 of it).
    half = {k: v.astype(np.float16) for k, v in weights.items()}
    path = tmp_path / "half.safetensors"
    write_safetensors(path, half)
    y = make_transformer(mimi_py.TransformerConfig(**cfg), path).forward(arrays["x"])
    widened = make_transformer(
        mimi_py.TransformerConfig(**cfg), {k: v.astype(np.float32) for k, v in half.items()}
    )
    assert_row(y, widened.forward(arrays["x"]), "float16 file against its values in float32")
    peak = float(np.abs(arrays["y_full"]).max())
    assert_close(y, arrays["y_full"], atol=1e-3 * peak, rtol=0, what="float16 weights")


def test_prefix_selects_a_subtree(tmp_path, small):
    meta, cfg, weights, arrays = small
    big = {f"encoder_transformer.{k}": v for k, v in weights.items()}
    big.update({f"decoder_transformer.{k}": v * 0 for k, v in weights.items()})
    big["quantizer.something"] = np.zeros(3, np.float32)
    config = mimi_py.TransformerConfig(**cfg)
    path = tmp_path / "codec.safetensors"
    write_safetensors(path, big)
    for src in (big, path):
        t = make_transformer(config, src, prefix="encoder_transformer.")
        what = f"prefix from {type(src).__name__}"
        assert_close(t.forward(arrays["x"]), arrays["y_full"], *tolerance(meta["tolerance"]), what)
    with pytest.raises(mimi_py.WeightsError, match="missing tensor"):
        make_transformer(config, big)  # no prefix: nothing found


def test_hf_layout_is_converted_at_load(tmp_path, small):
    meta, cfg, weights, arrays = small
    hf = to_hf_layout(weights, cfg)
    assert not np.array_equal(
        hf["layers.0.self_attn.q_proj.weight"], weights["layers.0.self_attn.q_proj.weight"]
    )
    config = mimi_py.TransformerConfig(**cfg)
    path = tmp_path / "hf.safetensors"
    write_safetensors(path, hf)
    for src in (hf, path):
        t = make_transformer(config, src, qk_layout="hf")
        assert_close(t.forward(arrays["x"]), arrays["y_full"], *tolerance(meta["tolerance"]), "hf converted")
        # state_dict gives back the interleaved layout
        sd = t.state_dict()
        assert_same(sd["layers.1.self_attn.k_proj.weight"], weights["layers.1.self_attn.k_proj.weight"])
    # Loading HF weights as if interleaved is the bug candle users hit: wrong outputs.
    wrong = make_transformer(config, hf).forward(arrays["x"])
    assert np.abs(wrong - arrays["y_full"]).max() > 1e-2


def test_hf_layout_with_attention_biases(small):
    """q/k weights and biases converted back at load: the state dict is the fixture's, bit for
    bit, and so is the forward (sin positions: the layout only moves rows within a head, so
    a missed conversion of the biases alone would show in the outputs)."""
    meta, cfg, weights, arrays = load_case("small_sin_rms_gated")
    hf = to_hf_layout(weights, cfg)
    assert not np.array_equal(hf["layers.0.self_attn.q_proj.bias"], weights["layers.0.self_attn.q_proj.bias"])
    t = make_transformer(mimi_py.TransformerConfig(**cfg), hf, qk_layout="hf")
    sd = t.state_dict()
    for name in weights:
        assert_same(sd[name], weights[name], what=name)
    assert_close(t.forward(arrays["x"]), arrays["y_full"], *tolerance(meta["tolerance"]), "hf layout, biases")


def test_missing_and_misshaped_tensors_are_named(small, tmp_path):
    meta, cfg, weights, arrays = small
    config = mimi_py.TransformerConfig(**cfg)
    w = dict(weights)
    del w["layers.1.mlp.fc2.weight"]
    w["layers.0.self_attn.o_proj.weight"] = np.zeros((64, 32), np.float32)
    w["layers.2.mlp.fc1.weight"] = np.zeros((256, 64), np.float32)
    for src in (w, tmp_path / "bad.safetensors"):
        if not isinstance(src, dict):
            write_safetensors(src, w)
        with pytest.raises(mimi_py.WeightsError) as ei:
            make_transformer(config, src)
        msg = str(ei.value)
        assert "layers.1.mlp.fc2.weight" in msg and "missing" in msg
        assert "layers.0.self_attn.o_proj.weight" in msg and "[64, 32]" in msg and "[64, 64]" in msg
        assert "layers.2.mlp.fc1.weight" in msg and "unexpected" in msg


def test_non_float_tensors_are_refused(small, tmp_path):
    meta, cfg, weights, arrays = small
    w = dict(weights)
    w["layers.0.mlp.fc1.weight"] = w["layers.0.mlp.fc1.weight"].astype(np.int32)
    config = mimi_py.TransformerConfig(**cfg)
    with pytest.raises(mimi_py.WeightsError, match="layers.0.mlp.fc1.weight"):
        make_transformer(config, w)
    path = tmp_path / "int.safetensors"
    write_safetensors(path, w)
    with pytest.raises(mimi_py.WeightsError, match="dtype"):
        make_transformer(config, path)


def test_unreadable_files(small, tmp_path):
    meta, cfg, weights, arrays = small
    config = mimi_py.TransformerConfig(**cfg)
    with pytest.raises(mimi_py.WeightsError) as ei:
        make_transformer(config, tmp_path / "nope.safetensors")
    assert isinstance(ei.value.__cause__, OSError)
    with pytest.raises(mimi_py.WeightsError, match="directory"):
        make_transformer(config, tmp_path)
    junk = tmp_path / "junk.safetensors"
    junk.write_bytes(b"this is not a safetensors file at all")
    with pytest.raises(mimi_py.WeightsError, match="not a valid safetensors"):
        make_transformer(config, junk)
    good = tmp_path / "good.safetensors"
    write_safetensors(good, weights)
    truncated = tmp_path / "truncated.safetensors"
    truncated.write_bytes(good.read_bytes()[: os.path.getsize(good) // 2])
    with pytest.raises(mimi_py.WeightsError, match="truncated.safetensors"):
        make_transformer(config, truncated)


def test_bad_weights_argument_type(small):
    meta, cfg, weights, arrays = small
    with pytest.raises(TypeError, match="safetensors"):
        make_transformer(mimi_py.TransformerConfig(**cfg), 42)


# ---------------------------------------------------------------- corrupt checkpoints


def corrupt(kind: str, tensors: dict, path: Path, first: str) -> tuple[Path, list[str]]:
    """Writes a corrupt checkpoint; returns (path to pass, words the message must contain)."""
    good = path.with_name("good_" + path.name)
    write_safetensors(good, tensors)
    raw = good.read_bytes()
    n = struct.unpack("<Q", raw[:8])[0]
    if kind == "truncated":
        path.write_bytes(raw[: len(raw) // 2])
        return path, []
    if kind == "truncated_header":
        path.write_bytes(raw[: 8 + n // 2])
        return path, ["header"]
    if kind == "empty":
        path.write_bytes(b"")
        return path, []
    if kind == "bad_json":
        path.write_bytes(raw[:8] + b"x" * n + raw[8 + n :])
        return path, ["JSON"]
    if kind == "header_len_gt_file":
        path.write_bytes(struct.pack("<Q", len(raw) + 1000) + raw[8:])
        return path, ["header"]
    if kind == "header_len_huge":
        path.write_bytes(struct.pack("<Q", 2**62) + raw[8:])
        return path, ["header"]
    if kind == "not_safetensors":
        path.write_bytes(b"PK\x03\x04 this is a zip/pickle, not safetensors" * 3)
        return path, []
    if kind == "pickle":
        import pickle

        path.write_bytes(pickle.dumps({first: tensors[first]}))
        return path, []
    if kind == "offsets_out_of_range":
        h = json.loads(raw[8 : 8 + n])
        h[first]["data_offsets"] = [0, 10**12]
        j = json.dumps(h).encode()
        j += b" " * (-len(j) % 8)
        path.write_bytes(struct.pack("<Q", len(j)) + j + raw[8 + n :])
        return path, []
    if kind == "directory":
        path.mkdir()
        return path, ["directory"]
    if kind == "nonexistent":
        return path, []
    w = dict(tensors)
    if kind == "int32":
        w[first] = w[first].astype(np.int32)
        words = [first, "dtype"]
    elif kind == "missing":
        del w[first]
        words = [first, "missing"]
    elif kind == "wrong_shape":
        w[first] = np.zeros((3, 3), np.float32)
        words = [first, "[3, 3]"]
    elif kind == "float64":
        w[first] = w[first].astype(np.float64)
        words = None  # accepted
    else:
        raise AssertionError(kind)
    write_safetensors(path, w)
    return path, words


CORRUPTIONS = [
    "truncated",
    "truncated_header",
    "empty",
    "bad_json",
    "header_len_gt_file",
    "header_len_huge",
    "not_safetensors",
    "pickle",
    "offsets_out_of_range",
    "directory",
    "nonexistent",
    "int32",
    "missing",
    "wrong_shape",
    "float64",
]


@pytest.mark.parametrize("kind", CORRUPTIONS + ["extra"])
@pytest.mark.parametrize("model", ["transformer", "codec"])
def test_corrupt_checkpoints_are_weights_errors_naming_path_and_problem(tmp_path, model, kind):
    if model == "transformer":
        tensors, first = tf_weights(), "layers.0.mlp.fc1.weight"
        extra = "layers.0.mlp.fc1.bias"
        load = lambda p: make_transformer(TF_CFG, p)  # noqa: E731
    else:
        tensors = read_safetensors(CODEC_FILE)
        first, extra = "encoder.layers.0.conv.weight", "encoder_transformer.layers.0.mlp.fc1.bias"
        load = lambda p: make_codec(p, config=small_codec_config())  # noqa: E731
    path = tmp_path / "model.safetensors"
    if kind == "extra":
        w = dict(tensors)
        w[extra] = np.zeros(3, np.float32)
        write_safetensors(path, w)
        words = [extra, "unexpected"]
    else:
        path, words = corrupt(kind, tensors, path, first)
    kind_, r = call(load, path)
    if words is None:
        assert kind_ == "ok", f"{kind}: a valid checkpoint was refused: {r}"
        return
    assert kind_ == "err", f"{kind}: a corrupt checkpoint was accepted"
    assert_allowed(r, (mimi_py.WeightsError,), kind)
    msg = str(r)
    assert str(path) in msg, f"{kind}: the message does not name the path: {msg}"
    for w in words:
        assert w in msg, f"{kind}: the message does not say {w!r}: {msg}"
    if kind == "nonexistent":
        assert isinstance(r.__cause__, OSError)


def test_a_codec_directory_with_a_corrupt_config_json_is_a_weights_error(tmp_path):
    shutil.copy(CODEC_FILE, tmp_path / "model.safetensors")
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(mimi_py.WeightsError, match="config.json"):
        make_codec(tmp_path)


def test_a_codec_directory_whose_config_json_is_not_an_object_is_a_weights_error(tmp_path):
    shutil.copy(CODEC_FILE, tmp_path / "model.safetensors")
    (tmp_path / "config.json").write_text("[1, 2]")
    with pytest.raises(mimi_py.WeightsError, match="config.json"):
        make_codec(tmp_path)


def test_an_extra_seanet_tensor_in_a_codec_checkpoint_is_refused(tmp_path):
    w = read_safetensors(CODEC_FILE)
    w["encoder.layers.99.conv.weight"] = np.zeros((3, 3, 3), np.float32)
    p = tmp_path / "model.safetensors"
    write_safetensors(p, w)
    with pytest.raises(mimi_py.WeightsError, match="encoder.layers.99"):
        make_codec(p, config=small_codec_config())
