# numa-device-plugin developer targets. Everything runs from a local venv that
# `make install` creates; nothing is installed system-wide.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
BIN    := $(VENV)/bin

.PHONY: install run test test-e2e lint proto bench soak docker-build docker-push deploy undeploy clean

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

## test-e2e: the end-to-end tests against $$KUBECONFIG (see test/infra/create-cluster.sh)
test-e2e: install
	$(BIN)/pytest -m e2e -v tests/e2e

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

REGISTRY ?= registry.local:5000
TAG      ?= $(shell $(PYTHON) -c "import re;print(re.search(r'__version__ = \"(.+)\"', open('numa_device_plugin/__init__.py').read())[1])")
IMAGE    := $(REGISTRY)/numa-device-plugin:$(TAG)

## docker-build: the container image $(REGISTRY)/numa-device-plugin:$(TAG)
docker-build:
	docker build --build-arg VERSION=$(TAG) -t $(IMAGE) .

## docker-push: push it (the test cluster's registry is insecure: see test/infra)
docker-push:
	docker push $(IMAGE)

## deploy / undeploy: kubectl apply -k deployments/ (image tag from TAG)
deploy:
	cd deployments && kubectl kustomize . | sed 's#registry.local:5000/numa-device-plugin:[^" ]*#$(IMAGE)#' | kubectl apply -f -

undeploy:
	kubectl delete -k deployments/ --ignore-not-found

clean:
	rm -rf $(VENV) build dist *.egg-info .mypy_cache .ruff_cache .pytest_cache
