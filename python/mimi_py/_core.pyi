"""Type stubs for the native module ``mimi_py._core``."""

import os
from collections.abc import Mapping
from typing import Any, Literal

import numpy as np
import numpy.typing as npt

__version__: str
candle_version: str
features: frozenset[str]
"""Optional backends compiled into this build: a subset of {"cuda", "metal", "mkl", "accelerate"}."""

class MimiError(Exception):
    """Base class of every error raised by mimi_py."""

class ConfigError(MimiError, ValueError):
    """An invalid or unsupported configuration value; the message names the field."""

class UnsupportedKvRepeatError(ConfigError):
    """The config asks for kv_repeat != 1."""

class IncompatibleStateError(MimiError, ValueError):
    """copy_state between transformers whose streaming states have different shapes."""

class DepthMismatchError(IncompatibleStateError, ValueError):
    """copy_state between transformers with different numbers of layers."""

class ShapeError(MimiError, ValueError):
    """An input array of the wrong shape."""

class DTypeError(MimiError, TypeError):
    """An input array whose dtype is not a real floating type."""

class WeightsError(MimiError, ValueError):
    """A missing, mis-shaped or mistyped tensor, or an unreadable checkpoint."""

class DeviceError(MimiError, RuntimeError):
    """A device that is unknown, not compiled into this build, or failed to initialise."""

class ComputeError(MimiError, RuntimeError):
    """A failure reported by candle while computing."""

class InternalError(MimiError, RuntimeError):
    """A bug in mimi_py (a Rust panic caught at the boundary)."""

PositionalEmbedding = Literal["rope", "sin", "none"]
NormName = Literal["layer_norm", "rms_norm"]
Gating = Literal["silu", "gelu", "gelu_pytorch_tanh", "relu", "sigmoid", "swish"]

class TransformerConfig:
    """Configuration of a Mimi streaming transformer (candle's ``mimi::transformer::Config``)."""

    def __init__(
        self,
        *,
        d_model: int = 512,
        num_heads: int = 8,
        num_layers: int = 8,
        causal: bool = True,
        norm_first: bool = True,
        bias_ff: bool = False,
        bias_attn: bool = False,
        layer_scale: float | None = 0.01,
        positional_embedding: PositionalEmbedding = "rope",
        use_conv_block: bool = False,
        cross_attention: bool = False,
        conv_kernel_size: int = 5,
        use_conv_bias: bool = True,
        gating: Gating | None = None,
        norm: NormName = "layer_norm",
        context: int = 250,
        max_period: int = 10000,
        max_seq_len: int = 8192,
        kv_repeat: int = 1,
        dim_feedforward: int = 2048,
        conv_layout: bool = False,
    ) -> None: ...
    @staticmethod
    def mimi() -> TransformerConfig:
        """The real Mimi encoder/decoder transformer."""
    def to_dict(self) -> dict[str, Any]: ...
    def replace(self, **changes: Any) -> TransformerConfig: ...
    @property
    def head_dim(self) -> int: ...
    @property
    def d_model(self) -> int: ...
    @property
    def num_heads(self) -> int: ...
    @property
    def num_layers(self) -> int: ...
    @property
    def causal(self) -> bool: ...
    @property
    def norm_first(self) -> bool: ...
    @property
    def bias_ff(self) -> bool: ...
    @property
    def bias_attn(self) -> bool: ...
    @property
    def layer_scale(self) -> float | None: ...
    @property
    def positional_embedding(self) -> str: ...
    @property
    def use_conv_block(self) -> bool: ...
    @property
    def cross_attention(self) -> bool: ...
    @property
    def conv_kernel_size(self) -> int: ...
    @property
    def use_conv_bias(self) -> bool: ...
    @property
    def gating(self) -> str | None: ...
    @property
    def norm(self) -> str: ...
    @property
    def context(self) -> int: ...
    @property
    def max_period(self) -> int: ...
    @property
    def max_seq_len(self) -> int: ...
    @property
    def kv_repeat(self) -> int: ...
    @property
    def dim_feedforward(self) -> int: ...
    @property
    def conv_layout(self) -> bool: ...
    def __eq__(self, other: object) -> bool: ...

class StreamingTransformer:
    """Kyutai's Mimi streaming transformer with an exact streaming state."""

    def __init__(
        self,
        config: TransformerConfig | Mapping[str, Any] | None = None,
        weights: str | os.PathLike[str] | Mapping[str, npt.ArrayLike] | None = None,
        *,
        seed: int = 0,
        device: str = "cpu",
        dtype: Literal["float32", "float16", "bfloat16"] = "float32",
        prefix: str = "",
        qk_layout: Literal["interleaved", "hf"] = "interleaved",
    ) -> None: ...
    def forward(self, x: npt.ArrayLike) -> npt.NDArray[np.float32]:
        """(batch, time, d_model) -> (batch, time, d_model) float32, continuing the stream."""
    def step(self, x: npt.ArrayLike | None) -> npt.NDArray[np.float32] | None:
        """Like forward; step(None) returns None."""
    def reset_state(self) -> None: ...
    def copy_state(self, other: StreamingTransformer) -> None:
        """Copy other's whole streaming state into this transformer (a copy, not shared)."""
    def clone(self) -> StreamingTransformer:
        """Same weights (shared), copy of the state."""
    def __copy__(self) -> StreamingTransformer: ...
    def __deepcopy__(self, memo: Any) -> StreamingTransformer: ...
    def state_dict(self) -> dict[str, npt.NDArray[np.float32]]:
        """Weights under candle's names, q/k interleaved, float32."""
    @property
    def config(self) -> TransformerConfig: ...
    @property
    def num_layers(self) -> int: ...
    @property
    def d_model(self) -> int: ...
    @property
    def context(self) -> int: ...
    @property
    def device(self) -> str: ...
    @property
    def dtype(self) -> str: ...
    @property
    def position(self) -> int:
        """Time steps consumed since construction or the last reset_state()."""
    @property
    def batch_size(self) -> int | None: ...
    @property
    def state_nbytes(self) -> int:
        """Bytes held by the streaming state."""

def _panic_for_tests() -> None: ...
