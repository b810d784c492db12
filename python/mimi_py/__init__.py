"""mimi_py: Kyutai's Mimi streaming transformer for Python, computed by Hugging Face candle.

The streaming state is exact: every query attends to exactly the last ``context``
positions however the input is chunked, ``copy_state`` copies the whole state,
``reset_state`` returns to a fresh stream, and a stream can run forever with memory
bounded by ``context``. Failures are typed exceptions rooted at :class:`MimiError`.
"""

from ._core import (
    CodecConfig,
    MimiCodec,
    InvalidInputError,
    ResourceError,
    ComputeError,
    ConfigError,
    DepthMismatchError,
    DeviceError,
    DTypeError,
    IncompatibleStateError,
    InternalError,
    MimiError,
    ShapeError,
    StreamingTransformer,
    TransformerConfig,
    UnsupportedKvRepeatError,
    WeightsError,
    __version__,
    candle_version,
    features,
)

__all__ = [
    "CodecConfig",
    "MimiCodec",
    "InvalidInputError",
    "ResourceError",
    "ComputeError",
    "ConfigError",
    "DTypeError",
    "DepthMismatchError",
    "DeviceError",
    "IncompatibleStateError",
    "InternalError",
    "MimiError",
    "ShapeError",
    "StreamingTransformer",
    "TransformerConfig",
    "UnsupportedKvRepeatError",
    "WeightsError",
    "__version__",
    "candle_version",
    "features",
]
