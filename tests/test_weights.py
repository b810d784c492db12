"""Weights from a safetensors file, a mapping and a seed; prefixes; the HF q/k layout."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

import mimi_py
from conftest import assert_close, write_safetensors
from fixtures import load_case, to_hf_layout


@pytest.fixture(scope="module")
def small():
    meta, cfg, weights, arrays = load_case("small_rope")
    return meta, cfg, weights, arrays


def test_file_dict_and_seed_agree(tmp_path, small):
    meta, cfg, weights, arrays = small
    config = mimi_py.TransformerConfig(**cfg)
    seeded = mimi_py.StreamingTransformer(config, seed=11)
    sd = seeded.state_dict()
    assert set(sd) == set(weights)
    for k, v in sd.items():
        assert v.shape == weights[k].shape and v.dtype == np.float32
    path = tmp_path / "w.safetensors"
    write_safetensors(path, sd)
    from_file = mimi_py.StreamingTransformer(config, str(path))
    from_pathlike = mimi_py.StreamingTransformer(config, Path(path))
    from_dict = mimi_py.StreamingTransformer(config, sd)
    x = arrays["x"]
    y = seeded.forward(x)
    for other in (from_file, from_pathlike, from_dict):
        np.testing.assert_array_equal(other.forward(x), y)
    # the same seed gives the same weights; another seed does not
    again = mimi_py.StreamingTransformer(config, seed=11).state_dict()
    other = mimi_py.StreamingTransformer(config, seed=12).state_dict()
    k = "layers.0.self_attn.q_proj.weight"
    np.testing.assert_array_equal(again[k], sd[k])
    assert not np.array_equal(other[k], sd[k])


def test_fixture_weights_from_file_match_reference(tmp_path, small):
    meta, cfg, weights, arrays = small
    path = tmp_path / "fixture.safetensors"
    write_safetensors(path, weights)
    t = mimi_py.StreamingTransformer(mimi_py.TransformerConfig(**cfg), path)
    assert_close(t.forward(arrays["x"]), arrays["y_full"], what="from file")


def test_float16_and_float64_weights_are_accepted(tmp_path, small):
    meta, cfg, weights, arrays = small
    w64 = {k: v.astype(np.float64) for k, v in weights.items()}
    t = mimi_py.StreamingTransformer(mimi_py.TransformerConfig(**cfg), w64)
    assert_close(t.forward(arrays["x"]), arrays["y_full"], what="float64 dict")
    path = tmp_path / "half.safetensors"
    write_safetensors(path, {k: v.astype(np.float16) for k, v in weights.items()})
    t = mimi_py.StreamingTransformer(mimi_py.TransformerConfig(**cfg), path)
    assert np.abs(t.forward(arrays["x"]) - arrays["y_full"]).max() < 0.05


def test_prefix_selects_a_subtree(tmp_path, small):
    meta, cfg, weights, arrays = small
    big = {f"encoder_transformer.{k}": v for k, v in weights.items()}
    big.update({f"decoder_transformer.{k}": v * 0 for k, v in weights.items()})
    big["quantizer.something"] = np.zeros(3, np.float32)
    config = mimi_py.TransformerConfig(**cfg)
    path = tmp_path / "codec.safetensors"
    write_safetensors(path, big)
    for src in (big, path):
        t = mimi_py.StreamingTransformer(config, src, prefix="encoder_transformer.")
        assert_close(t.forward(arrays["x"]), arrays["y_full"], what=f"prefix from {type(src).__name__}")
    with pytest.raises(mimi_py.WeightsError, match="missing tensor"):
        mimi_py.StreamingTransformer(config, big)  # no prefix: nothing found


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
        t = mimi_py.StreamingTransformer(config, src, qk_layout="hf")
        assert_close(t.forward(arrays["x"]), arrays["y_full"], what="hf layout converted")
        # state_dict gives back the interleaved layout
        sd = t.state_dict()
        np.testing.assert_array_equal(
            sd["layers.1.self_attn.k_proj.weight"], weights["layers.1.self_attn.k_proj.weight"]
        )
    # Loading HF weights as if interleaved is the bug candle users hit: wrong outputs.
    wrong = mimi_py.StreamingTransformer(config, hf).forward(arrays["x"])
    assert np.abs(wrong - arrays["y_full"]).max() > 1e-2


def test_hf_layout_with_attention_biases(small):
    meta, cfg, weights, arrays = load_case("small_sin_rms_gated")
    # sin positions: no rope, so the layout conversion must not change the result
    hf = to_hf_layout(weights, cfg)
    t = mimi_py.StreamingTransformer(mimi_py.TransformerConfig(**cfg), hf, qk_layout="hf")
    sd = t.state_dict()
    np.testing.assert_array_equal(
        sd["layers.0.self_attn.q_proj.bias"], weights["layers.0.self_attn.q_proj.bias"]
    )


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
            mimi_py.StreamingTransformer(config, src)
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
        mimi_py.StreamingTransformer(config, w)
    path = tmp_path / "int.safetensors"
    write_safetensors(path, w)
    with pytest.raises(mimi_py.WeightsError, match="dtype"):
        mimi_py.StreamingTransformer(config, path)


def test_unreadable_files(small, tmp_path):
    meta, cfg, weights, arrays = small
    config = mimi_py.TransformerConfig(**cfg)
    with pytest.raises(mimi_py.WeightsError) as ei:
        mimi_py.StreamingTransformer(config, tmp_path / "nope.safetensors")
    assert isinstance(ei.value.__cause__, OSError)
    with pytest.raises(mimi_py.WeightsError, match="directory"):
        mimi_py.StreamingTransformer(config, tmp_path)
    junk = tmp_path / "junk.safetensors"
    junk.write_bytes(b"this is not a safetensors file at all")
    with pytest.raises(mimi_py.WeightsError, match="not a valid safetensors"):
        mimi_py.StreamingTransformer(config, junk)
    good = tmp_path / "good.safetensors"
    write_safetensors(good, weights)
    truncated = tmp_path / "truncated.safetensors"
    truncated.write_bytes(good.read_bytes()[: os.path.getsize(good) // 2])
    with pytest.raises(mimi_py.WeightsError, match="truncated.safetensors"):
        mimi_py.StreamingTransformer(config, truncated)


def test_bad_weights_argument_type(small):
    meta, cfg, weights, arrays = small
    with pytest.raises(TypeError, match="safetensors"):
        mimi_py.StreamingTransformer(mimi_py.TransformerConfig(**cfg), 42)
