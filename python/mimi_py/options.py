"""Command-line options that several subcommands share, each declared once here (``mimi-py
encode``, ``decode``, ``tokenize`` and ``serve``, and ``python -m mimi_py.serve``)."""

from __future__ import annotations

import argparse

__all__ = ["PRECISIONS", "WEIGHTS_DTYPES", "add_precision"]

# How the products compute (MimiCodec's ``precision=``), and the older way to ask for "high".
PRECISIONS = ("highest", "high", "medium")
WEIGHTS_DTYPES = ("float32", "bfloat16")


def add_precision(p: argparse.ArgumentParser) -> None:
    """``--precision highest|high|medium`` and the older ``--weights-dtype float32|bfloat16``
    (both default: not given, which is mimi_py.get_float32_matmul_precision(), "highest")."""
    p.add_argument(
        "--precision",
        choices=PRECISIONS,
        default=None,
        help="how the native CPU engine computes: highest (float32, the default), high (bfloat16 "
        "weights, float32 products) or medium (bfloat16 products, float32 sums); codes agree with "
        "highest's in 95-100%% of frames, see docs/precision.md",
    )
    p.add_argument(
        "--weights-dtype",
        choices=WEIGHTS_DTYPES,
        default=None,
        help="older spelling: bfloat16 is --precision high",
    )
