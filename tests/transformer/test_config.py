"""TransformerConfig: candle's field names, Mimi defaults, round trips, validation; and both
configs (TransformerConfig, CodecConfig) fed generated keyword arguments: either a config that
keeps what it was given and round trips, or a ConfigError naming the field. A codec config that
is accepted builds a codec that encodes and decodes, or is refused at construction."""

from __future__ import annotations

import copy
import pickle

import numpy as np
import pytest
from hypothesis import given, note, settings
from hypothesis import strategies as st

import mimi_py
from support.hostile import PROFILE, assert_allowed, call, count_case
from support.models import CODEC_FILE, TF_CFG, small_codec_config, small_codec_config_dict
from support.ondevice import make_codec, make_transformer
from support.reference import CONFIG_FIELDS, assert_same, case_json, case_names


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


# ---------------------------------------------------------------- generated kwargs

INT_FIELDS = [
    "d_model",
    "num_heads",
    "num_layers",
    "conv_kernel_size",
    "context",
    "max_period",
    "max_seq_len",
    "kv_repeat",
    "dim_feedforward",
]
BOOL_FIELDS = [
    "causal",
    "norm_first",
    "bias_ff",
    "bias_attn",
    "use_conv_block",
    "cross_attention",
    "use_conv_bias",
    "conv_layout",
]
HOSTILE_VALUES = st.one_of(
    st.integers(-3, 600),
    st.sampled_from([2**31, 2**63, 2**64, -(2**63)]),
    st.booleans(),
    st.floats(allow_nan=True, allow_infinity=True),
    st.none(),
    st.text(max_size=6),
    st.sampled_from(["rope", "sin", "none", "layer_norm", "rms_norm", "silu", "gelu", "relu"]),
    st.lists(st.integers(), max_size=2),
    st.just(np.int64(8)),
    st.just(np.float32(0.5)),
)


@PROFILE
@given(
    kw=st.dictionaries(
        st.sampled_from(
            INT_FIELDS
            + BOOL_FIELDS
            + ["layer_scale", "positional_embedding", "gating", "norm", "foo", "D_MODEL"]
        ),
        HOSTILE_VALUES,
        max_size=4,
    )
)
def test_transformer_config_keeps_the_kwargs_it_accepts_and_names_the_field_it_refuses(kw):
    count_case("transformer_config")
    kind, r = call(lambda: mimi_py.TransformerConfig(**kw))
    if kind == "err":
        assert_allowed(r, (mimi_py.ConfigError,), f"TransformerConfig(**{kw!r})")
        field = str(r).split("`")[1] if "`" in str(r) else ""
        assert field in kw or field in mimi_py.TransformerConfig().to_dict(), f"no field named: {r}"
        return
    cfg = r
    for k, v in kw.items():
        got = getattr(cfg, k)
        assert got == v or (isinstance(v, float) and got == pytest.approx(v)), (k, v, got)
    assert mimi_py.TransformerConfig(**cfg.to_dict()) == cfg
    assert cfg.replace() == cfg


SEANET_FIELDS = [
    "dimension",
    "channels",
    "causal",
    "n_filters",
    "n_residual_layers",
    "activation",
    "compress",
    "dilation_base",
    "disable_norm_outer_blocks",
    "final_activation",
    "kernel_size",
    "residual_kernel_size",
    "last_kernel_size",
    "lstm",
    "norm",
    "pad_mode",
    "ratios",
    "true_skip",
]


@PROFILE
@given(
    kw=st.dictionaries(
        st.sampled_from(
            [
                "channels",
                "sample_rate",
                "frame_rate",
                "renormalize",
                "resample_method",
                "quantizer_n_q",
                "quantizer_bins",
                "quantizer_dim",
                "bogus",
            ]
        ),
        HOSTILE_VALUES,
        max_size=3,
    ),
    seanet=st.one_of(
        st.none(), st.dictionaries(st.sampled_from(SEANET_FIELDS + ["nope"]), HOSTILE_VALUES, max_size=2)
    ),
    transformer=st.one_of(
        st.none(), st.dictionaries(st.sampled_from(INT_FIELDS + ["norm"]), HOSTILE_VALUES, max_size=2)
    ),
)
def test_codec_config_round_trips_the_kwargs_it_accepts_and_refuses_others_with_a_config_error(
    kw, seanet, transformer
):
    count_case("codec_config")
    base = small_codec_config_dict()
    d = dict(base)
    d.update(kw)
    if seanet is not None:
        d["seanet"] = {**base["seanet"], **seanet}
    if transformer is not None:
        d["transformer"] = {**base["transformer"], **transformer}
    kind, r = call(lambda: mimi_py.CodecConfig(**d))
    if kind == "err":
        assert_allowed(
            r, (mimi_py.ConfigError,), f"CodecConfig({kw}, seanet={seanet}, transformer={transformer})"
        )
        return
    assert mimi_py.CodecConfig(**r.to_dict()) == r
    assert r.replace() == r


CODEC_VARIATIONS = {
    "seanet.dimension": [16, 32, 63],
    "seanet.n_filters": [1, 2, 4],
    "seanet.n_residual_layers": [0, 2],
    "seanet.kernel_size": [1, 2, 3],
    "seanet.residual_kernel_size": [1, 2],
    "seanet.last_kernel_size": [1, 2],
    "seanet.compress": [1, 3],
    "seanet.dilation_base": [1, 3],
    "seanet.ratios": [[4, 4, 4], [6, 5, 4]],
    "seanet.lstm": [0, 1],
    "seanet.true_skip": [False],
    "seanet.pad_mode": ["replicate"],
    "seanet.norm": ["none", "time_group_norm"],
    "seanet.disable_norm_outer_blocks": [1, 2],
    "seanet.final_activation": ["tanh"],
    "transformer.d_model": [16, 32],
    "transformer.num_heads": [1, 2],
    "transformer.num_layers": [0, 1],
    "transformer.context": [1, 4],
    "transformer.dim_feedforward": [8],
    "transformer.conv_layout": [False],
    "transformer.gating": ["silu"],
    "transformer.layer_scale": [None],
    "quantizer_n_q": [1, 2],
    "quantizer_bins": [1, 2],
    "quantizer_dim": [1, 8],
    "frame_rate": [25.0, 50.0],
    "sample_rate": [16000.0, 12000.0],
    "channels": [2],
}


# Building and running a codec costs more than other cases: half the budget.
@settings(PROFILE, max_examples=max(1, PROFILE.max_examples // 2))
@given(
    changes=st.dictionaries(
        st.sampled_from(sorted(CODEC_VARIATIONS)), st.integers(0, 3), min_size=1, max_size=3
    )
)
def test_a_codec_config_that_builds_a_codec_also_encodes_and_decodes(changes):
    """A config that CodecConfig accepts either builds a codec that encodes and decodes, or is
    refused with a ConfigError at construction; never a ComputeError at the first encode."""
    count_case("codec_construction")
    d = small_codec_config_dict()
    for key, i in changes.items():
        values = CODEC_VARIATIONS[key]
        v = values[i % len(values)]
        if "." in key:
            a, b = key.split(".")
            d[a][b] = v
        else:
            d[key] = v
    note(
        f"config changes: { {k: CODEC_VARIATIONS[k][i % len(CODEC_VARIATIONS[k])] for k, i in changes.items()} }"
    )
    kind, cfg = call(lambda: mimi_py.CodecConfig(**d))
    if kind == "err":
        assert_allowed(cfg, (mimi_py.ConfigError,), "CodecConfig")
        return
    kind, codec = call(lambda: make_codec(config=cfg, seed=1))
    if kind == "err":
        assert_allowed(codec, (mimi_py.ConfigError,), "MimiCodec(config)")
        return
    x = (np.random.default_rng(0).standard_normal((1, cfg.channels, 2 * cfg.frame_size + 5)) * 0.1).astype(
        np.float32
    )
    kind, codes = call(codec.encode, x)
    assert kind == "ok", f"encode failed on a codec that was built: {type(codes).__name__}: {codes}"
    assert codes.shape == (1, cfg.quantizer_n_q, 3) and int(codes.max()) < cfg.quantizer_bins
    kind, audio = call(codec.decode, codes)
    assert kind == "ok", f"decode failed: {audio}"
    assert audio.shape == (1, cfg.channels, 3 * cfg.frame_size)
    first = codec.encode_step(x)
    assert_same(first, codes[..., :2])


def test_residual_blocks_without_hidden_channels_are_refused_up_front():
    """n_filters / compress = 0 hidden channels: a ConfigError naming compress, not a codec
    whose first encode fails (CUDA's matrix product refuses the empty layers)."""
    d = small_codec_config_dict()
    d["seanet"].update(n_filters=1, compress=2)
    with pytest.raises(mimi_py.ConfigError, match=r"compress.*n_filters / compress = 1 / 2 = 0"):
        mimi_py.CodecConfig(**d)
    d["seanet"]["n_residual_layers"] = 0  # no residual blocks: nothing to refuse
    assert mimi_py.CodecConfig(**d).seanet["n_filters"] == 1


def test_unsupported_pad_mode_is_refused_up_front():
    """reflect padding is not implemented by candle's streaming convolutions: refused up front."""
    d = small_codec_config_dict()
    d["seanet"]["pad_mode"] = "reflect"
    with pytest.raises(mimi_py.ConfigError, match="pad_mode"):
        make_codec(config=mimi_py.CodecConfig(**d))


def test_non_causal_seanet_is_refused_up_front():
    """A non-causal SEANet's streaming and offline results would differ: refused when the
    config is made, naming the field, before any codec exists."""
    d = small_codec_config_dict()
    d["seanet"]["causal"] = False
    with pytest.raises(mimi_py.ConfigError, match=r"`seanet.causal`.*cannot stream"):
        mimi_py.CodecConfig(**d)


# ---------------------------------------------------------------- integer arguments

OVERFLOW_CALLS = {
    "StreamingTransformer(seed=-1)": lambda: make_transformer(TF_CFG, seed=-1),
    "StreamingTransformer(seed=2**64)": lambda: make_transformer(TF_CFG, seed=2**64),
    "MimiCodec(seed=-1)": lambda: make_codec(CODEC_FILE, config=small_codec_config(), seed=-1),
    "MimiCodec(num_codebooks=-1)": lambda: make_codec(
        CODEC_FILE, config=small_codec_config(), num_codebooks=-1
    ),
    "CodecConfig.mimi(-1)": lambda: mimi_py.CodecConfig.mimi(-1),
    "CodecConfig.from_hf(num_codebooks=-1)": lambda: mimi_py.CodecConfig.from_hf({}, num_codebooks=-1),
}


@pytest.mark.parametrize("what", sorted(OVERFLOW_CALLS))
def test_negative_or_huge_int_arguments_are_typed_errors(what):
    kind, e = call(OVERFLOW_CALLS[what])
    assert kind == "err"
    assert_allowed(e, (mimi_py.ConfigError, TypeError), what)


def test_numpy_integers_are_accepted_as_config_ints():
    assert mimi_py.TransformerConfig(d_model=np.int64(32), num_heads=np.int32(2)).d_model == 32
