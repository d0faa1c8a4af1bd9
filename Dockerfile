# numa-device-plugin image: build a wheel, then install only that wheel into a
# slim Python runtime (no compilers, no pip cache). Kubernetes probes do the
# health checking, so there is no HEALTHCHECK.
ARG PYTHON_IMAGE=python:3.11-slim

FROM ${PYTHON_IMAGE} AS build
WORKDIR /src
COPY pyproject.toml README.md ./
COPY numa_device_plugin ./numa_device_plugin
RUN pip wheel --no-cache-dir --no-deps --wheel-dir /dist .

FROM ${PYTHON_IMAGE}
ARG VERSION=0.1.0
LABEL org.opencontainers.image.title="numa-device-plugin" \
      org.opencontainers.image.description="Kubernetes device plugin: one extended resource per NUMA node" \
      org.opencontainers.image.source="https://github.com/numa-device-plugin/numa-device-plugin" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.licenses="Apache-2.0"
COPY --from=build /dist/ /tmp/dist/
RUN pip install --no-cache-dir /tmp/dist/*.whl && rm -rf /tmp/dist /root/.cache
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    GRPC_VERBOSITY=ERROR \
    MALLOC_ARENA_MAX=2
ENTRYPOINT ["numa-device-plugin", "serve"]
