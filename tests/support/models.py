"""The small models the suites build: a small transformer config (``TF_CFG``) and the fixtures'
small codec (tests/data/codec), on the test device (``support.ondevice``)."""

from __future__ import annotations

import functools
import json

import numpy as np

import mimi_py
from support.ondevice import make_codec, make_transformer
from support.paths import CODEC_DIR

# ---------------------------------------------------------------- a small transformer

D = 32
TF_CFG = mimi_py.TransformerConfig(d_model=D, num_heads=2, num_layers=2, dim_feedforward=64, context=8)


def tf_pair(seed=1):
    """A transformer on the test device and its control (same weights)."""
    return make_transformer(TF_CFG, seed=seed), make_transformer(TF_CFG, seed=seed)


@functools.cache
def tf_weights() -> dict[str, np.ndarray]:
    """The state dict of a seeded TF_CFG transformer (on the CPU)."""
    return mimi_py.StreamingTransformer(TF_CFG, seed=3).state_dict()


# ---------------------------------------------------------------- the small codec

CODEC_FILE = CODEC_DIR / "mimi_small.safetensors"
FRAME = 1920  # samples per frame
K = 4  # codebooks
BINS = 64  # codes per codebook


def small_codec_config_dict() -> dict:
    """The candle config json of the fixtures' small codec (tests/data/codec), a fresh dict."""
    return json.loads((CODEC_DIR / "mimi_small_candle_config.json").read_text())


def small_codec_config() -> mimi_py.CodecConfig:
    """The config of the fixtures' small codec."""
    return mimi_py.CodecConfig(**small_codec_config_dict())


def new_codec() -> mimi_py.MimiCodec:
    """The fixtures' small codec on the test device."""
    return make_codec(CODEC_FILE, config=small_codec_config())
