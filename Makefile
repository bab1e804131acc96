# rtpool: one entry point for people, pre-commit and CI. `make help` lists the targets.
SHELL := /bin/bash
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
STAMP := $(VENV)/.rtpool-installed
CARGO ?= cargo
# The Python package's native module is rebuilt whenever a Rust or packaging file changes.
NATIVE_SRC := $(shell find crates -name '*.rs' -o -name Cargo.toml -o -name '*.html' 2>/dev/null) Cargo.toml Cargo.lock pyproject.toml

.DEFAULT_GOAL := help
.PHONY: capi capi-header help install fmt lint test test-rust test-python bench bench-check bench-ninf bench-ops demo clean

help: ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-12s %s\n", $$1, $$2}'

$(PY):
	@command -v cargo >/dev/null || { echo "cargo not found: install Rust (https://rustup.rs)"; exit 1; }
	python3 -m venv $(VENV)
	$(PIP) install -q --upgrade pip

# Editable: python/ (rtpool and rtpool_bench) is on the venv's path. Extras: test (pytest),
# bench (rtpool bench/demo: rich, hdrhistogram, matplotlib, chess), linalg (numpy, scipy: bench ninf).
$(STAMP): $(PY) $(NATIVE_SRC)
	@echo "installing rtpool into $(VENV): pip builds the Rust core (cargo, release mode);" \
	      "the first build takes about 3-5 minutes on 2 CPUs, later ones less (cargo's cache)"
	$(PIP) install -q "maturin>=1.5,<2" "ruff>=0.5"
	$(PIP) install -q -e '.[test,bench,linalg]'
	@echo "rtpool installed in $(VENV)"
	@touch $(STAMP)

install: $(STAMP) ## create .venv and install rtpool (builds the Rust core) with test deps

fmt: $(STAMP) ## format Rust and Python code
	$(CARGO) fmt --all
	$(VENV)/bin/ruff format python tests benches examples
	$(VENV)/bin/ruff check --fix python tests benches examples

lint: $(STAMP) ## rustfmt, clippy, ruff, no import circle
	$(CARGO) fmt --all --check
	$(CARGO) clippy --workspace --all-targets --locked -- -D warnings
	$(VENV)/bin/ruff check python tests benches examples
	$(VENV)/bin/ruff format --check python tests benches examples
	python3 scripts/check-imports

test-rust: ## Rust unit, property and scenario tests (+ benches compile)
	$(CARGO) test --workspace --locked
	$(CARGO) bench --workspace --locked -- --test

test-python: $(STAMP) ## pytest end-to-end tests against a real master
	$(PY) -m pytest tests -q --durations=25

# A throwaway PostgreSQL (scripts/pg-test-server) serves the store tests of both suites through
# RTPOOL_TEST_PG_URL; it is stopped however the tests end. tests/test_slurm.py starts and stops
# its own one-node Slurm cluster (scripts/slurm-test-server; as root, installs it when missing).
test: ## every test (installs what it needs, starts a throwaway PostgreSQL)
	@pg_dir=$$(mktemp -d /tmp/rtpool-pg.XXXXXX); \
	cleanup() { scripts/pg-test-server stop "$$pg_dir" || true; rm -rf "$$pg_dir"; }; \
	url=$$(scripts/pg-test-server start "$$pg_dir") || { cleanup; exit 1; }; \
	trap cleanup EXIT; trap 'exit 130' INT TERM; \
	echo "PostgreSQL for the store tests: $$url"; \
	RTPOOL_TEST_PG_URL="$$url" $(MAKE) --no-print-directory test-rust test-python

bench: $(STAMP) ## latency, throughput, payload benchmarks (prints percentiles)
	$(PY) -m rtpool bench all

# The no-regression check of a hot-path change: this checkout's python/ against BASE's, built
# once under .bench-base/<sha>/ (benches/ab_noop.py --compare), interleaved A B, B A.
BASE ?= HEAD~1
ROUNDS ?= 4
bench-check: $(STAMP) ## head vs BASE=rev (default HEAD~1): latency, throughput, 64K/1M echo ratios
	$(PY) benches/ab_noop.py --compare $(BASE) --rounds $(ROUNDS)

# librtpool for C and Fortran: target/release/librtpool.{a,so} and a pkg-config file pointing at
# this checkout (PKG_CONFIG_PATH=target/release pkg-config --cflags --libs rtpool).
capi: ## build librtpool (C/Fortran GridRPC library) and target/release/rtpool.pc
	$(CARGO) build --release --locked -p rtpool-capi
	@printf '%s\n' "prefix=$(CURDIR)" 'includedir=$${prefix}/include' 'libdir=$${prefix}/target/release' '' \
	  'Name: rtpool' 'Description: librtpool, the GridRPC (GFD.52) C API of rtpool' 'Version: 0.1.0' \
	  'Cflags: -I$${includedir}' 'Libs: $${libdir}/librtpool.a -lpthread -ldl -lm -lrt' > target/release/rtpool.pc
	@echo "wrote target/release/rtpool.pc"

# include/rtpool_grpc.h, librtpool's C header, is generated from crates/rtpool-capi and checked in
# (tests/test_capi.py fails when it is stale).
capi-header: ## regenerate include/rtpool_grpc.h with cbindgen (scripts/ensure-native-toolchain)
	scripts/ensure-native-toolchain cbindgen
	cbindgen --config crates/rtpool-capi/cbindgen.toml --crate rtpool-capi --output include/rtpool_grpc.h crates/rtpool-capi

bench-ninf: $(STAMP) ## the Ninf paper's grid RPC benchmarks and bars (about 2 minutes)
	$(PY) -m rtpool bench ninf

# Needs no venv: a Rust bench of the scheduler core alone (docs/benchmarks.md, "Worst case of
# every core operation"). RTPOOL_WORST_CASE_JSON=path also writes the figures as JSON.
bench-ops: ## worst case of every core operation at 10^3-10^6 tasks (about a minute)
	$(CARGO) bench -p rtpool-core --locked --bench worst_case

demo: $(STAMP) ## the main job: factorization benchmark on a LocalCluster
	@echo "rtpool demo: a LocalCluster on this machine factorizes numbers in packages of tasks; progress bars show each step"
	$(PY) -m rtpool demo

clean: ## remove build outputs and the venv
	$(CARGO) clean
	rm -rf $(VENV) build dist .pytest_cache .ruff_cache python/rtpool/*.so .bench-base
