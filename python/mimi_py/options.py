"""Command-line options that several subcommands share, each declared once here (``mimi-py
encode``, ``decode``, ``tokenize`` and ``serve``, and ``python -m mimi_py.serve``)."""

from __future__ import annotations

import argparse

__all__ = ["WEIGHTS_DTYPES", "add_weights_dtype"]

# How the weights may be stored (MimiCodec's ``weights_dtype=``).
WEIGHTS_DTYPES = ("float32", "bfloat16")


def add_weights_dtype(p: argparse.ArgumentParser) -> None:
    """``--weights-dtype float32|bfloat16`` (default float32)."""
    p.add_argument(
        "--weights-dtype",
        choices=WEIGHTS_DTYPES,
        default="float32",
        help="how the weights are stored (bfloat16: half the memory and bytes read per step; the "
        "codes may differ from float32's in a few frames; see docs/weights-dtype.md)",
    )
