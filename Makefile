# numa-device-plugin developer targets. Everything runs from a local venv that
# `make install` creates; nothing is installed system-wide.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
BIN    := $(VENV)/bin

.PHONY: install run test lint proto bench soak clean

install: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet -e '.[dev]'
	touch $@

## run: the demo: plugin on this machine's sysfs against the in-process kubelet stand-in
run: install
	$(BIN)/numa-device-plugin demo

## test: the whole offline test suite
test: install
	$(BIN)/pytest -q

## lint: ruff (lint + format check) and mypy --strict
lint: install
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

## proto: regenerate the committed gRPC stubs from protos/ (pinned grpcio-tools)
proto: install
	$(PY) protos/generate.py

## bench: every benchmark against a real serve process; prints a table (BENCH_ARGS=--json for JSON)
bench: install
	$(PY) -m benchmarks.bench all $(BENCH_ARGS)

## soak: 1,000 kubelet restarts with Allocate calls and deleted sockets; stops by itself
soak: install
	$(PY) -m benchmarks.soak --restarts 1000 $(SOAK_ARGS)

clean:
	rm -rf $(VENV) build dist *.egg-info .mypy_cache .ruff_cache .pytest_cache
