# `make test` installs the package and runs `make check`: everything CI runs (fmt, clippy, ruff,
# stubtest, cargo test, pytest), against the mimi_py the current Python imports. For iteration:
# `make dev` (a fast build into the current virtualenv), then `make check`.
PYTHON ?= python

# What `make test` installs: the source tree (built by pip through maturin), or a wheel.
PKG ?= .
# pytest runs without Rust on PATH: the installed package must not need a toolchain.
NO_RUST_PATH := $(shell printf '%s' "$$PATH" | tr ':' '\n' | grep -v -e '\.cargo' -e rustup | paste -sd: -)

.PHONY: test check dev core-free layout lint stubtest test-rust test-python fuzz

# The README's test command: install the package with its test tools, then check everything.
# The test extra holds every other extra, so a suite whose extra is missing fails, not skips
# (MIMI_TEST_REQUIRE_EXTRAS, tests/support/extras.py).
test:
	$(PYTHON) -m pip install --quiet "$(PKG)[test,dev]"
	MIMI_TEST_REQUIRE_EXTRAS=1 $(MAKE) check PYTHON=$(PYTHON)

check: core-free layout lint stubtest test-rust test-python

# A fast build into the current virtualenv (release speed, no fat LTO): for iteration.
dev:
	maturin develop --profile fast

# crates/mimi-core is the computation: pyo3 and numpy must not be anywhere in its dependency
# tree (the compiler then keeps the boundary), and its test binaries must not link libpython.
core-free:
	@tree="$$(cargo tree -p mimi-core -e normal,build,dev --prefix none)" && test -n "$$tree" || exit 1; \
	if printf '%s\n' "$$tree" | grep -E '^(pyo3|numpy)[ -]'; then \
		echo "mimi-core depends on pyo3 or numpy (they belong in src/)"; exit 1; \
	else echo "mimi-core's dependency tree ($$(printf '%s\n' "$$tree" | sort -u | wc -l) crates) is free of pyo3/numpy"; fi

# File and function sizes, every module named in ARCHITECTURE.md, no `_name` imported across
# mimi_py's modules (scripts/check_layout.py).
layout:
	$(PYTHON) scripts/check_layout.py

lint:
	cargo fmt --all --check
	cargo clippy --workspace --all-targets -- -D warnings
	$(PYTHON) -m ruff check .
	$(PYTHON) -m ruff format --check .

stubtest:
	$(PYTHON) -m mypy.stubtest mimi_py --mypy-config-file pyproject.toml --allowlist .stubtest-allowlist

# The core's tests (no Python needed). The binding crate has no Rust tests: pytest covers it.
test-rust:
	cargo test -p mimi-core
	@for t in $$(cargo test -p mimi-core --no-run --message-format=json 2>/dev/null | \
		$(PYTHON) -c 'import json,sys; [print(m["executable"]) for m in map(json.loads, sys.stdin) if m.get("executable")]'); do \
		if ldd "$$t" | grep -q libpython; then echo "$$t links libpython"; exit 1; fi; \
	done; echo "the core's test binaries do not link libpython"

test-python:
	PATH="$(NO_RUST_PATH)" $(PYTHON) -m pytest -q

# The fuzz campaign: each target of fuzz/ and the server's doors for 10 minutes (FUZZ_SECONDS),
# growing the corpus in fuzz/target/campaign; CI runs the same script for 30 s each.
fuzz:
	PYTHON=$(PYTHON) scripts/fuzz.sh campaign
