# The one check command: `make check` runs everything CI runs, against the mimi_py that the
# current Python imports (build it first: `make dev` for a fast build, or install a wheel).
PYTHON ?= python

.PHONY: check dev core-free lint stubtest test-rust test-python

check: core-free lint stubtest test-rust test-python

# A fast build into the current virtualenv (release speed, no fat LTO): for iteration.
dev:
	maturin develop --profile fast

# src/core is the computation: it must not use the Python binding crates.
core-free:
	@if grep -rnE '(^|[^A-Za-z0-9_])(pyo3|numpy)::|extern crate (pyo3|numpy)' src/core; then \
		echo "src/core must not use pyo3 or numpy (they belong in src/py)"; exit 1; \
	else echo "src/core is free of pyo3/numpy"; fi

lint:
	cargo fmt --check
	cargo clippy --all-targets -- -D warnings
	$(PYTHON) -m ruff check .
	$(PYTHON) -m ruff format --check .

stubtest:
	$(PYTHON) -m mypy.stubtest mimi_py --mypy-config-file pyproject.toml --allowlist .stubtest-allowlist

test-rust:
	cargo test

test-python:
	$(PYTHON) -m pytest -q
