"""The suite's pytest hooks and shared fixtures. The helpers are in tests/support (see its
__init__); folders keep their own fixtures in their own conftest.py.

* the ``extra`` marker (support/extras.py): a test whose extra is missing fails when
  ``MIMI_TEST_REQUIRE_EXTRAS`` is set (``make test``), and is skipped otherwise, the terminal
  summary saying which suites were skipped for which extra;
* the hostile-input statistics (support/hostile.py), printed at the end of the session;
* the hypothesis profiles: ``ci`` (the default, CI or not) draws the same examples on every run,
  50 per test unless a test sets its own budget; ``dev`` (``HYPOTHESIS_PROFILE=dev``, or
  ``--hypothesis-profile=dev``) draws new ones each run, 1000 per test, for local hunting.
"""

from __future__ import annotations

import os
from collections import Counter

import pytest
from hypothesis import HealthCheck, settings

from support import extras
from support.models import new_codec
from support.paths import TRANSFORMER_DIR

if not TRANSFORMER_DIR.is_dir():  # pragma: no cover - a broken checkout, not a skip
    raise RuntimeError(f"reference data not found at {TRANSFORMER_DIR}")

# (the test file, what is missing) -> how many of its tests were skipped for it.
_SKIPPED_FOR_EXTRAS: Counter = Counter()
_SUMMARY: list[str] = []

# Registered at import, before any test module builds its settings (they inherit what they do
# not set from the profile loaded then); --hypothesis-profile loads one later, at configure,
# before the test modules are collected. "ci" replaces hypothesis' own profile of that name,
# which it loads by itself where CI is set, so both ways run the same budget.
_HYPOTHESIS = dict(deadline=None, print_blob=True, suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("ci", max_examples=50, derandomize=True, database=None, **_HYPOTHESIS)
settings.register_profile("dev", max_examples=1000, **_HYPOTHESIS)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


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
    # Imported here, not at the top: its PROFILE must build on the profile --hypothesis-profile loads.
    from support import hostile

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
    from support import hostile

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
