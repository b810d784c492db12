"""The optional extras the suites need (``[project.optional-dependencies]`` in pyproject.toml),
and the checks behind the ``extra`` marker.

A test that needs an extra says so: ``pytestmark = pytest.mark.extra("serve")`` for a whole
module, ``@pytest.mark.extra("hub")`` for one test (several names: it needs them all;
``modules=[...]`` narrows an extra to the modules the test needs). A module imports the
extra's modules at its top inside ``with optional("serve"):``, so that it still imports when
they are missing. Before each test, tests/conftest.py checks its markers: when a module is
missing, the test fails if ``MIMI_TEST_REQUIRE_EXTRAS`` is set (``make test`` sets it: it
installs every extra), and is skipped otherwise, the terminal summary saying which suites were
skipped for which extra.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import os

# Each extra -> the modules the tests import from it.
EXTRAS = {
    "audio": ("soundfile", "soxr", "tqdm"),
    "hub": ("huggingface_hub",),
    "serve": ("websockets", "prometheus_client"),
    "data": ("ray", "pyarrow", "soundfile", "soxr"),
    # Tools of the test extra itself (beyond pytest and hypothesis) that only some tests need.
    "test": ("pandas", "polars", "duckdb", "datasets"),
}
REQUIRE = "MIMI_TEST_REQUIRE_EXTRAS"


def required() -> bool:
    """Whether a missing extra is a failure (``MIMI_TEST_REQUIRE_EXTRAS`` set) or a skip."""
    return bool(os.environ.get(REQUIRE))


@functools.cache
def installed(module: str) -> bool:
    """Whether a top-level module can be found (without importing it)."""
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # ValueError: a module blocked with sys.modules[name] = None
        return False


def modules_of(names: tuple[str, ...], modules=None) -> list[str]:
    """The modules the extras ``names`` stand for (or ``modules``, each of one of them)."""
    mark = f"pytest.mark.extra({', '.join(map(repr, names))})"
    if not names or not set(names) <= set(EXTRAS):
        raise ValueError(f"{mark}: name one or more of {sorted(EXTRAS)}")
    all_of = list(dict.fromkeys(m for n in names for m in EXTRAS[n]))
    if modules is None:
        return all_of
    if not set(modules) <= set(all_of):
        raise ValueError(f"{mark}: modules {modules} are not all of {all_of}")
    return list(modules)


def unmet(markers) -> str | None:
    """For a test's ``extra`` markers: what is missing and how to install it, or None."""
    out = []
    for mark in markers:
        missing = [m for m in modules_of(mark.args, mark.kwargs.get("modules")) if not installed(m)]
        if missing:
            names = ",".join(mark.args)
            out.append(
                f"the {names} extra is not installed (missing: {', '.join(missing)}): "
                f"pip install 'mimi_py[{names}]'"
            )
    return "; ".join(out) or None


@contextlib.contextmanager
def optional(*names: str):
    """Module-level imports from the extras ``names``: when one of their modules is missing, the
    names it would bind stay unbound, and the module's ``extra`` marker skips (or fails) its
    tests before they run. Any other import error propagates."""
    try:
        yield
    except ModuleNotFoundError as e:
        if (e.name or "").split(".")[0] not in modules_of(names):
            raise
