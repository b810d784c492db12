"""Type stubs for the native module ``mimi_py._core``.

The exception classes are not here: they are declared in ``mimi_py/errors.py``.
"""

import os
from collections.abc import Mapping
from typing import Any, Literal, final

import numpy as np
import numpy.typing as npt

__all__ = [
    "CodecConfig",
    "MimiCodec",
    "StreamingTransformer",
    "TransformerConfig",
    "__version__",
    "_cudnn_unavailable",
    "_error_class_names",
    "_graph_counts",
    "_panic_for_tests",
    "_poison_for_tests",
    "_settings_table",
    "_shape_checks_made",
    "candle_version",
    "features",
    "get_float32_matmul_precision",
    "set_float32_matmul_precision",
    "settings",
]
__version__: str
candle_version: str
features: frozenset[str]
"""Optional backends compiled into this build: a subset of {"cuda", "metal", "mkl", "accelerate"}."""

PositionalEmbedding = Literal["rope", "sin", "none"]
Precision = Literal["highest", "high", "medium"]
KernelIsa = Literal["avx512bf16", "avx512", "avx2", "portable"]
NormName = Literal["layer_norm", "rms_norm"]
Gating = Literal["silu", "gelu", "gelu_pytorch_tanh", "relu", "sigmoid", "swish"]

@final
class TransformerConfig:
    """Configuration of a Mimi streaming transformer (candle's ``mimi::transformer::Config``)."""

    def __new__(
        cls,
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
    ) -> TransformerConfig: ...
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
    def __eq__(self, value: object, /) -> bool: ...
    def __getnewargs_ex__(self) -> tuple[tuple[()], dict[str, Any]]: ...

@final
class StreamingTransformer:
    """Kyutai's Mimi streaming transformer with an exact streaming state."""

    def __new__(
        cls,
        config: TransformerConfig | Mapping[str, Any] | None = None,
        weights: str | os.PathLike[str] | Mapping[str, npt.ArrayLike] | None = None,
        *,
        seed: int | None = None,  # None means 0
        device: str = "cpu",
        dtype: Literal["float32", "float16", "bfloat16"] = "float32",
        prefix: str = "",
        qk_layout: Literal["interleaved", "hf"] = "interleaved",
        precision: Precision | None = None,  # None: get_float32_matmul_precision()
        weights_dtype: Literal["float32", "bfloat16"] | None = None,  # "bfloat16": precision "high"
    ) -> StreamingTransformer: ...
    def forward(self, x: npt.ArrayLike) -> npt.NDArray[np.float32]:
        """(batch, time, d_model) -> (batch, time, d_model) float32, continuing the stream."""
    def step(
        self, x: npt.ArrayLike | None, *, active: npt.ArrayLike | None = None
    ) -> npt.NDArray[np.float32] | None:
        """Like forward; step(None) returns None. With active (bool, (batch,)), only those
        rows step; the others keep their state and their output rows are zeros."""
    def reset_state(self, rows: npt.ArrayLike | None = None) -> None:
        """A fresh stream; with rows (indices or a bool mask), only those rows restart."""
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
    def weights_dtype(self) -> Literal["float32", "bfloat16"]:
        """How the weight matrices are stored ("bfloat16" at precision "high" and "medium")."""
    @property
    def precision(self) -> Precision:
        """How the products compute (docs/precision.md)."""
    @property
    def kernel_isa(self) -> KernelIsa | None:
        """The instruction set the products run with; None off the native CPU engine."""
    @property
    def weights_nbytes(self) -> int:
        """Bytes of the weights one step reads, as stored."""
    @property
    def position(self) -> int:
        """Time steps consumed since construction or the last reset_state()."""
    @property
    def positions(self) -> npt.NDArray[np.int64]:
        """Each row's steps since its own start or reset, (batch,) (empty before the first call)."""
    @property
    def batch_size(self) -> int | None: ...
    @property
    def state_nbytes(self) -> int:
        """Bytes held by the streaming state."""

@final
class CodecConfig:
    """Configuration of the Mimi codec (candle's ``mimi::Config``)."""

    def __new__(
        cls,
        *,
        channels: int = 1,
        sample_rate: float = 24000.0,
        frame_rate: float = 12.5,
        renormalize: bool = True,
        resample_method: Literal["conv"] = "conv",
        seanet: Mapping[str, Any] | None = None,
        transformer: TransformerConfig | Mapping[str, Any] | None = None,
        quantizer_n_q: int = 8,
        quantizer_bins: int = 2048,
        quantizer_dim: int = 256,
    ) -> CodecConfig: ...
    @staticmethod
    def mimi(num_codebooks: int | None = None) -> CodecConfig:
        """The real Mimi codec (kyutai/mimi) with num_codebooks of its 32 codebooks."""
    @staticmethod
    def from_hf(config: Mapping[str, Any], num_codebooks: int | None = None) -> CodecConfig:
        """From a Hugging Face MimiConfig dict (config.json)."""
    def to_dict(self) -> dict[str, Any]: ...
    def replace(self, **changes: Any) -> CodecConfig: ...
    @property
    def channels(self) -> int: ...
    @property
    def sample_rate(self) -> float: ...
    @property
    def frame_rate(self) -> float: ...
    @property
    def renormalize(self) -> bool: ...
    @property
    def resample_method(self) -> str: ...
    @property
    def seanet(self) -> dict[str, Any]: ...
    @property
    def transformer(self) -> TransformerConfig: ...
    @property
    def quantizer_n_q(self) -> int: ...
    @property
    def quantizer_bins(self) -> int: ...
    @property
    def quantizer_dim(self) -> int: ...
    @property
    def frame_size(self) -> int:
        """Samples per code frame (1920 for the real model)."""
    def __eq__(self, value: object, /) -> bool: ...
    def __getnewargs_ex__(self) -> tuple[tuple[()], dict[str, Any]]: ...

@final
class MimiCodec:
    """The Mimi audio codec: audio <-> codes, offline and streaming."""

    def __new__(
        cls,
        weights: str | os.PathLike[str] | Mapping[str, npt.ArrayLike] | None = None,
        *,
        config: CodecConfig | Mapping[str, Any] | None = None,
        num_codebooks: int | None = None,
        seed: int | None = None,  # None means 0
        device: str = "cpu",
        dtype: Literal["float32", "float16", "bfloat16"] = "float32",
        precision: Precision | None = None,  # None: get_float32_matmul_precision()
        weights_dtype: Literal["float32", "bfloat16"] | None = None,  # "bfloat16": precision "high"
    ) -> MimiCodec: ...
    @classmethod
    def from_pretrained(
        cls,
        repo_id: str = "kyutai/mimi",
        *,
        revision: str | None = None,
        filename: str | None = None,
        num_codebooks: int | None = None,
        device: str = "cpu",
        dtype: Literal["float32", "float16", "bfloat16"] = "float32",
        cache_dir: str | os.PathLike[str] | None = None,
        precision: Literal["highest", "high", "medium"] | None = None,
        weights_dtype: Literal["float32", "bfloat16"] | None = None,
    ) -> MimiCodec:
        """A codec with weights from the Hugging Face Hub or its cache (``mimi_py.hub.from_pretrained``).

        Without ``filename``: ``config.json`` + ``model.safetensors`` of ``repo_id`` (kyutai/mimi's
        layout); with it, that one checkpoint (e.g. Kyutai's moshi-format tokenizer file). Needs the
        ``hub`` extra; ``HF_HUB_OFFLINE=1`` reads the cache only. Raises WeightsError when the files
        can be neither downloaded nor found in the cache, or huggingface_hub is not installed.
        """
    def encode(self, pcm: npt.ArrayLike, *, lengths: npt.ArrayLike | None = None) -> npt.NDArray[np.uint32]:
        """(batch, channels, samples) or (samples,) -> (batch, num_codebooks, frames) uint32.

        ``lengths``: samples per item; item i gets exactly its codes alone, then zeros."""
    def decode(
        self, codes: npt.ArrayLike, *, lengths: npt.ArrayLike | None = None
    ) -> npt.NDArray[np.float32]:
        """(batch, num_codebooks, frames) integers -> (batch, channels, frames * frame_size) float32.

        ``lengths``: frames per item; item i gets exactly its audio alone, then zeros."""
    def encode_latents(
        self, pcm: npt.ArrayLike, *, lengths: npt.ArrayLike | None = None
    ) -> npt.NDArray[np.float32]: ...
    def decode_latents(
        self, codes: npt.ArrayLike, *, lengths: npt.ArrayLike | None = None
    ) -> npt.NDArray[np.float32]: ...
    def encode_step(
        self, pcm: npt.ArrayLike | None, *, active: npt.ArrayLike | None = None, last: bool = False
    ) -> npt.NDArray[np.uint32] | None:
        """Stream audio in; with active (bool, (batch,)), only those rows step (whole frames).
        last=True ends the stream, padding the last partial frame as encode does."""
    def decode_step(
        self, codes: npt.ArrayLike | None, *, active: npt.ArrayLike | None = None
    ) -> npt.NDArray[np.float32] | None:
        """Stream codes in; with active (bool, (batch,)), only those rows step."""
    def reset_state(self, rows: npt.ArrayLike | None = None) -> None:
        """Fresh encoder and decoder streams; with rows, only those rows restart."""
    def copy_state(self, other: MimiCodec) -> None:
        """Copy both of other's streams into this codec (a copy, not shared)."""
    def clone(self) -> MimiCodec:
        """Same weights (shared), copy of both streams."""
    def __copy__(self) -> MimiCodec: ...
    def __deepcopy__(self, memo: Any) -> MimiCodec: ...
    @property
    def positions(self) -> npt.NDArray[np.int64]:
        """Each row's code frames emitted by the encoder stream since its start or reset."""
    @property
    def decode_positions(self) -> npt.NDArray[np.int64]:
        """Each row's code frames consumed by the decoder stream since its start or reset."""
    @property
    def sample_rate(self) -> int: ...
    @property
    def frame_rate(self) -> float: ...
    @property
    def frame_size(self) -> int: ...
    @property
    def num_codebooks(self) -> int: ...
    @property
    def cardinality(self) -> int: ...
    @property
    def channels(self) -> int: ...
    @property
    def config(self) -> CodecConfig: ...
    @property
    def device(self) -> str: ...
    @property
    def dtype(self) -> str: ...
    @property
    def weights_dtype(self) -> Literal["float32", "bfloat16"]:
        """How the weight matrices are stored ("bfloat16" at precision "high" and "medium")."""
    @property
    def precision(self) -> Precision:
        """How the products compute (docs/precision.md)."""
    @property
    def kernel_isa(self) -> KernelIsa | None:
        """The instruction set the products run with; None off the native CPU engine."""
    @property
    def weights_nbytes(self) -> int:
        """Bytes of the weights one frame (an encode and a decode step) reads, as stored."""
    @property
    def checkpoint_layout(self) -> Literal["hf", "moshi"] | None: ...

def _panic_for_tests() -> None:
    """Test hook: a Rust panic inside the guarded boundary (arrives as InternalError)."""

def _poison_for_tests(obj: StreamingTransformer | MimiCodec) -> None:
    """Test hook: a panic while holding obj's stream lock (the next call resets it)."""

def settings() -> dict[str, str]:
    """The effective value of every environment switch (docs/settings.md's table).

    Each switch is read once, on first use: set it before the process starts.
    """

def set_float32_matmul_precision(precision: Precision) -> None:
    """The precision models built from now on take when given none (PyTorch's name).

    Models already built keep theirs; models off the native CPU engine stay "highest".
    """

def get_float32_matmul_precision() -> Precision:
    """The precision models built from now on take when given none ("highest" until set)."""

def _settings_table() -> list[tuple[str, str, str]]:
    """The settings table: (name, default, what it does) for every switch."""

def _error_class_names() -> list[str]:
    """Test hook: the exception class names the Rust error mapping uses."""

def _shape_checks_made() -> int:
    """Test hook: how many input shapes the models have checked in this process."""

def _graph_counts() -> dict[str, int]:
    """Device-check hook: fixed-shape transformer steps by what the graph plan did with them
    (eager, captured, replayed) and failed captures (failed); zero unless MIMI_PY_CUDA_GRAPHS=1."""

def _cudnn_unavailable() -> str | None:
    """Device-check hook: why cuDNN convolutions were asked for but not used, or None."""
