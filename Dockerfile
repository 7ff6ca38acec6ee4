# syntax=docker/dockerfile:1
# ferry on CPU: the gateway, a worker, or both in one (`ferry serve`), with model_repo/ at /models.
#
#   docker build -t ferry:0.1.0 .
#   docker run --rm -p 8000:8000 ferry:0.1.0                  # ferry serve --model-repository /models
#   docker run --rm ferry:0.1.0 worker --broker redis://HOST:6379/0 --model-repository /models
#
# Two stages: torch and the bundled MiniLM weights are needed only to export the embedding
# demo to ONNX, so they stay in the first stage and the image carries the exported files, and
# ferry's wheel, built there once.

FROM python:3.11.11-slim-bookworm AS convert
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /src
COPY pyproject.toml README.md ./
COPY broker broker
COPY ferry ferry
COPY gateway gateway
COPY workers workers
# The CPU build of torch: the export needs no CUDA, and it is a tenth of the size.
# ferry's own requirements and their floors live in pyproject.toml, not here.
# hadolint ignore=DL3013
RUN pip install --extra-index-url https://download.pytorch.org/whl/cpu '.[embedding]'
COPY model_repo model_repo
RUN python model_repo/convert_minilm.py \
    && pip wheel --no-deps --wheel-dir /wheels .


FROM python:3.11.11-slim-bookworm
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PYTHONUNBUFFERED=1 \
    FERRY_HEALTH_PORT=8000
WORKDIR /src
COPY --from=convert /wheels /wheels
# tokenizers is the one part of the embedding extra the served ensemble needs at run time.
RUN pip install /wheels/ferry-*.whl 'tokenizers>=0.15' \
    && rm -rf /wheels \
    && groupadd --system --gid 10001 ferry \
    && useradd --system --uid 10001 --gid 10001 --no-create-home --home-dir /nonexistent --shell /usr/sbin/nologin ferry
COPY --from=convert --chown=root:root /src/model_repo /models
WORKDIR /
# Numeric, so Kubernetes' runAsNonRoot can check it.
USER 10001:10001
# 8000: HTTP gateway (KServe V2, /metrics, /dashboard); 8001: Triton's gRPC; 8002: a worker's /metrics and health.
EXPOSE 8000 8001 8002
# A gateway answers on 8000 and a worker on 8002: set FERRY_HEALTH_PORT=8002 for a worker.
HEALTHCHECK --interval=10s --timeout=3s --start-period=60s --retries=3 \
    CMD ["python", "-c", "import os, urllib.request; urllib.request.urlopen('http://127.0.0.1:%s/v2/health/live' % os.environ.get('FERRY_HEALTH_PORT', '8000'), timeout=2)"]
ENTRYPOINT ["ferry"]
CMD ["serve", "--model-repository", "/models", "--http-port", "8000"]
