"""The device the device-independent suites run on, and their tolerances per device and dtype.

``MIMI_TEST_DEVICE`` (default ``cpu``) picks the device: ``cuda``, ``cuda:1``, ``metal``...
The fixture numerics (transformer/test_fixtures), the state invariants (transformer/test_state),
the codec's codes and audio (codec/test_codec, codec/test_half) and the hostile inputs
(inputs/test_input_arrays, transformer/test_transformer_inputs, codec/test_codec_inputs, and the
generated cases of transformer/test_config and weights/test_weights) build their models through
:func:`make_codec` and :func:`make_transformer`, which add ``device=DEVICE`` unless a test names
a device itself. Per-row streaming (``active=``, ``reset_state(rows=)``, ``last=True``)
runs on every device and dtype; test_half checks it on the candle engine.

Tolerances, float32:

* **cpu**: the fixtures' own tolerances (``meta["tolerance"]``), and codes equal exactly.
* **any GPU**: ten times the fixtures' atol and rtol, since reductions run in another order
  (cuBLAS, tree reductions). Codes are compared as agreement against the CPU float32 codes:
  a code flips where two centroids are nearly tied, so at least :data:`CODE_AGREEMENT` of them
  must be equal, and the test prints the agreement it measured.

Half precision has its own, looser bounds in test_half and test_fixtures (stated there).
"""

from __future__ import annotations

import os

import numpy as np

import mimi_py
from support.reference import assert_close, assert_same

DEVICE = os.environ.get("MIMI_TEST_DEVICE", "cpu").strip().lower()
ON_CPU = DEVICE == "cpu"

# Fraction of codes that must equal the CPU float32 reference off the CPU (float32 compute).
CODE_AGREEMENT = 1.0 if ON_CPU else 0.99
# Scale of the fixtures' float32 tolerances on this device.
TOLERANCE_SCALE = 1.0 if ON_CPU else 10.0


def make_codec(*args, **kw) -> mimi_py.MimiCodec:
    """``mimi_py.MimiCodec`` on the test device (unless ``device=`` is given)."""
    kw.setdefault("device", DEVICE)
    return mimi_py.MimiCodec(*args, **kw)


def make_transformer(*args, **kw) -> mimi_py.StreamingTransformer:
    """``mimi_py.StreamingTransformer`` on the test device (unless ``device=`` is given)."""
    kw.setdefault("device", DEVICE)
    return mimi_py.StreamingTransformer(*args, **kw)


def tolerance(tol: dict) -> tuple[float, float]:
    """(atol, rtol) for a fixture tolerance ``{"atol": .., "rtol": ..}`` on this device."""
    return tol["atol"] * TOLERANCE_SCALE, tol["rtol"] * TOLERANCE_SCALE


def assert_row(actual, expected, what: str = "row") -> None:
    """A batched row against the same row stepped alone. On the CPU the same bits (every stage
    keeps a row's bits, masked or not); on another device, codes by :func:`assert_codes`' and
    floats within ten times the fixtures' float32 bound (atol = rtol = 1e-3 there), since
    cuBLAS and cuDNN may pick other kernels for another batch size. NaN fails either way."""
    if ON_CPU:
        return assert_same(actual, expected, what)
    if np.issubdtype(np.asarray(expected).dtype, np.integer):
        assert_codes(actual, expected, what)
        return
    assert_close(actual, expected, atol=1e-4 * TOLERANCE_SCALE, rtol=1e-4 * TOLERANCE_SCALE, what=what)


def assert_codes(actual, expected, what: str = "codes") -> float:
    """Codes equal to the reference: exactly on the CPU, in at least CODE_AGREEMENT of places
    elsewhere. Returns the agreement."""
    actual, expected = np.asarray(actual), np.asarray(expected)
    assert actual.shape == expected.shape, f"{what}: shape {actual.shape} != {expected.shape}"
    agreement = float((actual == expected).mean()) if actual.size else 1.0
    if not ON_CPU:
        print(f"{what} on {DEVICE}: {agreement:.2%} of codes equal the CPU float32 reference")
    assert agreement >= CODE_AGREEMENT, (
        f"{what}: {agreement:.2%} of codes equal the reference, need {CODE_AGREEMENT:.0%} on {DEVICE}"
    )
    return agreement
