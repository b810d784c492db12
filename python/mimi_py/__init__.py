"""mimi_py: Kyutai's Mimi streaming transformer for Python, computed by Hugging Face candle.

The streaming state is exact: every query attends to exactly the last ``context``
positions however the input is chunked, ``copy_state`` copies the whole state,
``reset_state`` returns to a fresh stream, and a stream can run forever with memory
bounded by ``context``. Failures are typed exceptions rooted at :class:`MimiError`.
"""

from . import _cuda  # noqa: F401  (a CUDA build: load pip's CUDA libraries)
from ._core import (
    CodecConfig,
    MimiCodec,
    StreamingTransformer,
    TransformerConfig,
    __version__,
    candle_version,
    features,
    get_float32_matmul_precision,
    set_float32_matmul_precision,
    settings,
)
from .errors import *  # noqa: F403  (the exception classes, declared in errors.py)

__all__ = [
    "CodecConfig",
    "ComputeError",
    "ConfigError",
    "DTypeError",
    "DepthMismatchError",
    "DeviceError",
    "IncompatibleStateError",
    "InternalError",
    "InvalidInputError",
    "MimiCodec",
    "MimiError",
    "ResourceError",
    "ShapeError",
    "StreamingTransformer",
    "TransformerConfig",
    "UnsupportedKvRepeatError",
    "WeightsError",
    "__version__",
    "candle_version",
    "features",
    "get_float32_matmul_precision",
    "set_float32_matmul_precision",
    "settings",
]
