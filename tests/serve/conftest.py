"""Fixtures of the server suites."""

from __future__ import annotations

import pytest

import mimi_py


@pytest.fixture(scope="module")
def serve_checkpoint(tmp_path_factory):
    """The small codec as a checkpoint directory, for the server suites (``--weights``)."""
    from support.servers import small_checkpoint

    return small_checkpoint(tmp_path_factory.mktemp("small_codec"))


@pytest.fixture(scope="module")
def serve_offline(serve_checkpoint):
    """The same codec in-process: the reference the served codes and audio must equal."""
    return mimi_py.MimiCodec(serve_checkpoint)
