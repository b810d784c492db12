"""The exception classes of mimi_py: the one place they are declared.

Every error mimi_py raises derives from :class:`MimiError` *and* from the builtin it
refines, so ``except ValueError`` keeps working. The Rust core's table of error kinds
(``ErrorKind`` in ``crates/mimi-core/src/error.rs``) names the class each kind raises; a test
checks that the table, these classes, the package's ``__all__`` and the README's table agree.
The package takes every class from here (``from .errors import *``): they are listed nowhere else
in Python but its ``__all__``.
"""


class MimiError(Exception):
    """Base class of every error raised by mimi_py."""


class ConfigError(MimiError, ValueError):
    """An invalid or unsupported configuration value; the message names the field."""


class UnsupportedKvRepeatError(ConfigError):
    """The config asks for kv_repeat != 1, which Mimi's streaming attention does not support."""


class IncompatibleStateError(MimiError, ValueError):
    """copy_state between objects whose streaming states differ (config, batch, dtype, device)."""


class DepthMismatchError(IncompatibleStateError, ValueError):
    """copy_state between transformers with different numbers of layers."""


class ShapeError(MimiError, ValueError):
    """An input array of the wrong shape; the message gives the expected shape."""


class DTypeError(MimiError, TypeError):
    """An input array whose dtype cannot be used (not real floating, or not integer codes)."""


class InvalidInputError(MimiError, ValueError):
    """An input whose values are not accepted (codes out of range, NaN/Inf audio)."""


class ResourceError(MimiError, MemoryError):
    """A call that needs more memory than is available; the message says how much."""


class WeightsError(MimiError, ValueError):
    """A missing, mis-shaped or mistyped tensor, or an unreadable checkpoint."""


class DeviceError(MimiError, RuntimeError):
    """A device that is unknown, not compiled into this build, or failed to initialise."""


class ComputeError(MimiError, RuntimeError):
    """A failure reported by candle while computing."""


class InternalError(MimiError, RuntimeError):
    """A bug in mimi_py (a caught Rust panic, or a stream reset after one); please report it."""


# Shown as `mimi_py.ShapeError` in tracebacks and reprs: users import them from the package.
def _family(root: type[Exception]) -> list[type[Exception]]:
    """`root` and every class derived from it, parents first."""
    out = [root]
    for sub in root.__subclasses__():
        out += _family(sub)
    return out


for _cls in _family(MimiError):
    _cls.__module__ = "mimi_py"
del _cls
