"""Where things are: the repository, ``tests/`` and the reference data (tests/data/README.md)."""

from __future__ import annotations

from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]
REPO = TESTS.parent
DATA = TESTS / "data"
TRANSFORMER_DIR = DATA / "transformer"
CODEC_DIR = DATA / "codec"
