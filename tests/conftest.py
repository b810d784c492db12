"""The suite's pytest hooks and shared fixtures. The helpers are in tests/support (see its
__init__); folders keep their own fixtures in their own conftest.py.

* the ``extra`` marker (support/extras.py): a test whose extra is missing fails when
  ``MIMI_TEST_REQUIRE_EXTRAS`` is set (``make test``), and is skipped otherwise, the terminal
  summary saying which suites were skipped for which extra;
* the hostile-input statistics (support/hostile.py), printed at the end of the session.
"""

from __future__ import annotations

from collections import Counter

import pytest

from support import extras, hostile
from support.models import new_codec
from support.paths import TRANSFORMER_DIR

if not TRANSFORMER_DIR.is_dir():  # pragma: no cover - a broken checkout, not a skip
    raise RuntimeError(f"reference data not found at {TRANSFORMER_DIR}")

# (the test file, what is missing) -> how many of its tests were skipped for it.
_SKIPPED_FOR_EXTRAS: Counter = Counter()
_SUMMARY: list[str] = []


def pytest_collection_modifyitems(items):
    """A misspelt extra is an error at collection, not a skip."""
    for item in items:
        for mark in item.iter_markers("extra"):
            try:
                extras.modules_of(mark.args, mark.kwargs.get("modules"))
            except ValueError as e:
                raise pytest.UsageError(f"{item.nodeid}: {e}") from None


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    hostile.start_test()
    missing = extras.unmet(item.iter_markers("extra"))
    if missing is None:
        return
    if extras.required():
        pytest.fail(f"{missing} ({extras.REQUIRE} is set)", pytrace=False)
    _SKIPPED_FOR_EXTRAS[item.path.relative_to(item.config.rootpath).as_posix(), missing] += 1
    pytest.skip(missing)


@pytest.fixture(scope="session", autouse=True)
def _hostile_stats(tmp_path_factory):
    """At the end of the session, if any hostile call was made: the statistics, as json."""
    yield
    line = hostile.summary(tmp_path_factory.getbasetemp())
    if line:
        _SUMMARY.append(line)


def pytest_terminal_summary(terminalreporter):
    for line in _SUMMARY:
        terminalreporter.write_line(line)
    if _SKIPPED_FOR_EXTRAS:
        terminalreporter.section(f"suites skipped for a missing extra ({extras.REQUIRE}=1 fails them)")
    for (path, missing), n in sorted(_SKIPPED_FOR_EXTRAS.items()):
        terminalreporter.write_line(f"{path}: {n} test{'s' * (n != 1)} skipped: {missing}")


@pytest.fixture(scope="module")
def codec_pair():
    """A small codec under test and a control with the same weights."""
    return new_codec(), new_codec()
