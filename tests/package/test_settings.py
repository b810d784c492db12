"""The settings table: one table in Rust, docs/settings.md's copy of it, and the effective values."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import mimi_py
from mimi_py import _core
from support.paths import REPO

SETTINGS_DOC = REPO / "docs" / "settings.md"


def documented_rows() -> dict[str, str]:
    """`variable -> default` from docs/settings.md's table."""
    section = SETTINGS_DOC.read_text()
    rows = re.findall(r"^\| `([A-Z0-9_]+)` \| ([^|]+) \|", section, flags=re.M)
    return {name: default.strip().strip("`") for name, default in rows}


def test_the_settings_page_lists_every_switch_with_its_default():
    table = {name: default for name, default, _doc in _core._settings_table()}
    assert documented_rows() == table


def test_settings_returns_one_value_per_switch():
    values = mimi_py.settings()
    assert sorted(values) == sorted(name for name, _, _ in _core._settings_table())
    assert int(values["RAYON_NUM_THREADS"]) >= 1


def test_settings_show_what_the_environment_set():
    env = dict(
        os.environ,
        MIMI_PY_SPIN="0",
        MIMI_PY_HEAP_KEEP_MB="7",
        RAYON_NUM_THREADS="1",
        MIMI_PY_CUDA_TF32="1",
        MIMI_PY_ISA=" Portable ",
        MIMI_PY_CUDA_POOL_KEEP_MB="0",
        MIMI_PY_CUDA_EVENTS="0",
    )
    code = "import json, mimi_py; print(json.dumps(mimi_py.settings()))"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    values = json.loads(out.stdout)
    assert values["MIMI_PY_SPIN"] == "0"
    assert values["MIMI_PY_HEAP_KEEP_MB"] == "7"
    assert values["RAYON_NUM_THREADS"] == "1"
    assert values["MIMI_PY_DIRECT_CONV"] == "1"
    assert values["MIMI_PY_CUDA_TF32"] == "1"
    assert values["MIMI_PY_ISA"] == "portable"
    assert values["MIMI_PY_CUDA_POOL_KEEP_MB"] == "0"
    assert values["MIMI_PY_CUDA_EVENTS"] == "0"
