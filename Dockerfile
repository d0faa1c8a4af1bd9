# numa-device-plugin image. Stage 1 installs the runtime dependencies from
# requirements.lock (pinned with hashes: `make lock`) and the plugin's wheel into
# /opt/venv; stage 2 is the slim Python runtime with that venv and neither pip nor
# build tools. Kubernetes probes do the health checking, so there is no HEALTHCHECK.
ARG PYTHON_IMAGE=python:3.11-slim-bookworm

FROM ${PYTHON_IMAGE} AS build
WORKDIR /src
# A venv without pip: the base image's pip installs into it (pip --python).
RUN python -m venv --without-pip /opt/venv
COPY requirements.lock requirements-build.lock ./
RUN pip --python /opt/venv/bin/python install --no-cache-dir --require-hashes \
        --only-binary=:all: --requirement requirements.lock
# The build backend (setuptools, wheel) pinned with hashes too, in a venv of its own:
# an isolated build would fetch whatever version is newest, unchecked.
RUN python -m venv /opt/build \
 && /opt/build/bin/pip install --no-cache-dir --require-hashes --only-binary=:all: \
        --requirement requirements-build.lock
COPY pyproject.toml README.md ./
COPY numa_device_plugin ./numa_device_plugin
# --no-deps: everything it needs came from the lock file above.
RUN /opt/build/bin/pip wheel --no-cache-dir --no-deps --no-build-isolation --wheel-dir /dist . \
 && pip --python /opt/venv/bin/python install --no-cache-dir --no-deps /dist/*.whl

FROM ${PYTHON_IMAGE}
ARG VERSION=0.2.1
ARG REVISION=""
ARG SOURCE=""
LABEL org.opencontainers.image.title="numa-device-plugin" \
      org.opencontainers.image.description="Kubernetes device plugin: one extended resource per NUMA node" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}" \
      org.opencontainers.image.source="${SOURCE}" \
      org.opencontainers.image.licenses="Apache-2.0"
# The runtime needs no installer: remove the base image's pip, setuptools and wheel.
RUN python -m pip uninstall --yes --quiet pip setuptools wheel \
 && rm -rf /root/.cache
COPY --from=build /opt/venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    GRPC_VERBOSITY=ERROR \
    MALLOC_ARENA_MAX=2
# dumb-init (from requirements.lock) is PID 1: it forwards SIGTERM to the plugin from the
# first moment and reaps zombies; the plugin also catches stop signals before anything
# else runs (numa_device_plugin/ops/signals.py), so it stops as PID 1 too.
ENTRYPOINT ["dumb-init", "--", "numa-device-plugin", "serve"]
