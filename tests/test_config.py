"""TransformerConfig: candle's field names, Mimi defaults, round trips, validation."""

from __future__ import annotations

import copy
import pickle

import pytest

import mimi_py
from fixtures import CONFIG_FIELDS, case_json, case_names


def test_defaults_are_the_real_mimi_transformer():
    c = mimi_py.TransformerConfig()
    assert c == mimi_py.TransformerConfig.mimi()
    assert (c.d_model, c.num_heads, c.num_layers, c.dim_feedforward) == (512, 8, 8, 2048)
    assert (c.positional_embedding, c.max_period, c.context, c.layer_scale) == ("rope", 10000, 250, 0.01)
    assert (c.norm, c.gating, c.bias_ff, c.bias_attn, c.kv_repeat) == ("layer_norm", None, False, False, 1)
    assert (c.causal, c.norm_first, c.max_seq_len) == (True, True, 8192)
    assert c.head_dim == 64
    assert list(c.to_dict()) == list(CONFIG_FIELDS)  # candle's fields, in its order


@pytest.mark.parametrize("name", case_names())
def test_accepts_every_fixture_config_and_round_trips(name):
    d = case_json(name)["config"]
    c = mimi_py.TransformerConfig(**d)
    assert c.to_dict() == d
    assert mimi_py.TransformerConfig(**c.to_dict()) == c


def test_equality_repr_pickle_copy_replace():
    c = mimi_py.TransformerConfig(d_model=64, num_heads=4, gating="silu", layer_scale=None)
    assert c != mimi_py.TransformerConfig()
    assert "d_model=64" in repr(c) and "gating='silu'" in repr(c)
    assert pickle.loads(pickle.dumps(c)) == c
    assert copy.deepcopy(c) == c
    r = c.replace(context=7)
    assert r.context == 7 and c.context == 250 and r.d_model == 64
    with pytest.raises(mimi_py.ConfigError, match="context"):
        c.replace(context=0)


@pytest.mark.parametrize(
    "kw,field",
    [
        ({"d_model": 30, "num_heads": 8}, "d_model"),
        ({"d_model": 0}, "d_model"),
        ({"num_heads": 0}, "num_heads"),
        ({"num_layers": 0}, "num_layers"),
        ({"context": 0}, "context"),
        ({"dim_feedforward": 0}, "dim_feedforward"),
        ({"kv_repeat": 0}, "kv_repeat"),
        ({"kv_repeat": 3}, "kv_repeat"),
        ({"d_model": 24, "num_heads": 8}, "d_model"),  # odd head_dim with rope
        ({"positional_embedding": "alibi"}, "positional_embedding"),
        ({"norm": "batch_norm"}, "norm"),
        ({"gating": "swiglu2"}, "gating"),
        ({"gating": 3}, "gating"),
        ({"d_model": -1}, "d_model"),
        ({"d_model": 1.5}, "d_model"),
        ({"d_model": True}, "d_model"),
        ({"causal": 1}, "causal"),
        ({"layer_scale": "0.1"}, "layer_scale"),
        ({"layer_scale": float("nan")}, "layer_scale"),
        ({"dmodel": 512}, "dmodel"),
    ],
)
def test_invalid_values_name_the_field(kw, field):
    with pytest.raises(mimi_py.ConfigError, match=f"`{field}`") as ei:
        mimi_py.TransformerConfig(**kw)
    assert isinstance(ei.value, ValueError)


def test_kv_repeat_is_a_valid_config_but_not_a_runnable_one():
    c = mimi_py.TransformerConfig(d_model=64, num_heads=4, kv_repeat=2)
    assert c.kv_repeat == 2


def test_config_is_immutable():
    c = mimi_py.TransformerConfig()
    with pytest.raises(AttributeError):
        c.d_model = 3  # type: ignore[misc]
