# `make test` installs the package and runs `make check`: everything CI runs (fmt, clippy, ruff,
# stubtest, cargo test, pytest), against the mimi_py the current Python imports. For iteration:
# `make dev` (a fast build into the current virtualenv), then `make check`.
PYTHON ?= python

# What `make test` installs: the source tree (built by pip through maturin), or a wheel.
PKG ?= .
# pytest runs without Rust on PATH: the installed package must not need a toolchain.
NO_RUST_PATH := $(shell printf '%s' "$$PATH" | tr ':' '\n' | grep -v -e '\.cargo' -e rustup | paste -sd: -)

.PHONY: test check dev core-free lint stubtest test-rust test-python

# The README's test command: install the package with its test tools, then check everything.
test:
	$(PYTHON) -m pip install --quiet "$(PKG)[test,dev]"
	$(MAKE) check PYTHON=$(PYTHON)

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
	PATH="$(NO_RUST_PATH)" $(PYTHON) -m pytest -q
