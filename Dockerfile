# The vllm-sidecar-exporter image: a slim Python base, pinned dependencies, a non-root user,
# an exec-form entrypoint and a health check on /healthz.
FROM python:3.12.8-slim-bookworm AS build
WORKDIR /src
COPY deploy/docker/requirements.lock /src/requirements.lock
RUN python -m pip install --no-cache-dir --disable-pip-version-check --prefix=/install -r /src/requirements.lock
COPY pyproject.toml README.md LICENSE /src/
COPY exporter /src/exporter
RUN python -m pip install --no-cache-dir --disable-pip-version-check --no-deps --prefix=/install /src

FROM python:3.12.8-slim-bookworm
LABEL org.opencontainers.image.title="vllm-sidecar-exporter" \
      org.opencontainers.image.description="Prometheus sidecar and alerting pack for vLLM" \
      org.opencontainers.image.licenses="Apache-2.0"
COPY --from=build /install /usr/local
RUN groupadd --system --gid 65532 sidecar && useradd --system --uid 65532 --gid 65532 --no-create-home --shell /usr/sbin/nologin sidecar
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 VLLM_SIDECAR_LISTEN=0.0.0.0:9181
USER 65532:65532
EXPOSE 9181
HEALTHCHECK --interval=15s --timeout=3s --start-period=10s --retries=3 \
  CMD ["python", "-c", "import sys, urllib.request; sys.exit(0 if urllib.request.urlopen('http://127.0.0.1:9181/healthz', timeout=2).status == 200 else 1)"]
ENTRYPOINT ["vllm-sidecar-exporter"]
CMD ["--log-format", "json"]
