# syntax=docker/dockerfile:1
# The service image: the project's wheel and its runtime dependencies in a virtualenv, run as an
# unprivileged user. Every setting is an environment variable (README, "Settings").

ARG PYTHON_IMAGE=python:3.12-slim-bookworm

FROM ${PYTHON_IMAGE} AS builder
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /src
COPY pyproject.toml README.md ./
COPY app ./app
COPY migrations ./migrations
# A wheel, not an editable install: the image runs from site-packages, migrations included.
RUN pip wheel --no-deps --wheel-dir /wheels . \
 && python -m venv /opt/grounding \
 && /opt/grounding/bin/pip install /wheels/*.whl

FROM ${PYTHON_IMAGE}
ENV PATH=/opt/grounding/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1
RUN groupadd --system --gid 10001 grounding \
 && useradd --system --uid 10001 --gid grounding --create-home --home-dir /home/grounding \
      --shell /usr/sbin/nologin grounding
COPY --from=builder /opt/grounding /opt/grounding
WORKDIR /home/grounding
USER 10001:10001
EXPOSE 8000
HEALTHCHECK --interval=10s --timeout=3s --start-period=30s --retries=3 \
    CMD ["python", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8000/healthz', timeout=2)"]
CMD ["grounding", "serve", "--host", "0.0.0.0"]
