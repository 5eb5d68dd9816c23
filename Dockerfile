# syntax=docker/dockerfile:1
# One image for every lorapool component: pods run `lorapool <command>`
# (operator, router, sidecar, sim; the renderer emits `args: [sidecar, ...]` / `[router, ...]`).
#
#   docker build -t ghcr.io/lorapool/lorapool:0.1.0 .          # the release image (target runtime)
#   docker build --target sim -t lorapool-sim:0.1.0 .           # + `vllm serve` running the simulator
#   docker build --target books -t ghcr.io/lorapool/lorapool-books:0.1.0 .  # the routers' shared store
#
# Base image: an exact tag. For reproducible releases pin its digest too:
#   docker buildx imagetools inspect python:3.11-slim-bookworm   -> python:3.11-slim-bookworm@sha256:<digest>
ARG PYTHON_IMAGE=python:3.11-slim-bookworm
# = lorapool.__version__ (tests/delivery checks it; the build fails when the wheel disagrees)
ARG VERSION=0.1.0

# --- build: the wheel, then a virtualenv with it and its runtime dependencies ----------
# No extras: the image carries what runs in a cluster (operator, router, sidecar, simulator).
# The `test` extra (cryptography for `lorapool cluster`/`dev`, pytest, ...) and `bench` stay out;
# list the set without Docker: pip install --dry-run --ignore-installed --report out.json .
FROM ${PYTHON_IMAGE} AS build
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /src
COPY pyproject.toml README.md ./
COPY operator ./operator
# Optional, for machines whose build containers reach no package index: a directory of wheels
# (this project's dependencies and its build backend, made on the host with `pip wheel`) mounted
# at this path for the RUN steps (`buildah build --volume DIR:/wheelhouse:ro --build-arg
# WHEELHOUSE=/wheelhouse`; `lorapool image build` does this). Empty (the default, a plain
# `docker build`): pip installs from the index.
ARG WHEELHOUSE=
RUN if [ -n "$WHEELHOUSE" ]; then export PIP_NO_INDEX=1 PIP_FIND_LINKS="$WHEELHOUSE"; fi \
 && pip wheel --no-deps --wheel-dir /wheels . \
 && python -m venv /opt/venv \
 && /opt/venv/bin/pip install /wheels/lorapool-*.whl \
 && /opt/venv/bin/pip check

# --- base of the runtime images: no compilers, no build tools, non-root -----------------
FROM ${PYTHON_IMAGE} AS runtime-base
ARG VERSION
# uid/gid 1000: the rendered pods and the chart run as runAsUser 1000.
RUN groupadd --gid 1000 lorapool \
 && useradd --uid 1000 --gid 1000 --home-dir /tmp --no-create-home --shell /usr/sbin/nologin lorapool
COPY --from=build /opt/venv /opt/venv
# HOME=/tmp: the only writable path when the root filesystem is read-only (an emptyDir in the pods).
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    HOME=/tmp
RUN test "$(lorapool --version)" = "lorapool ${VERSION}"
LABEL org.opencontainers.image.version="${VERSION}"
USER 1000:1000
WORKDIR /tmp
# router/engine 8000, operator metrics 8080, operator /healthz and sidecar status 8081
EXPOSE 8000 8080 8081
ENTRYPOINT ["lorapool"]
CMD ["--help"]

# --- sim: the runtime plus a `vllm` that runs the simulator (e2e on kind, GPU-free demos) --
# A pool with spec.vllm.image set to this image runs `vllm serve MODEL FLAGS` -> `lorapool sim`.
FROM runtime-base AS sim
COPY --chmod=0755 e2e/vllm_shim.py /opt/venv/bin/vllm
LABEL org.opencontainers.image.title="lorapool-sim" \
      org.opencontainers.image.description="lorapool with a vllm entry point that runs the vLLM simulator"

# --- books: Debian's redis-server for a pool's rendered shared store (docs/high-availability.md) --
# spec.router.sharedState.rendered runs it as <pool>-books: memory only, non-root, read-only root.
# Not built by CI; spec.router.sharedState.rendered.image overrides it (any image with redis-server).
FROM runtime-base AS books
USER root
RUN apt-get update \
 && apt-get install -y --no-install-recommends redis-server \
 && rm -rf /var/lib/apt/lists/* \
 && redis-server --version
USER 1000:1000
EXPOSE 6379
ENTRYPOINT ["redis-server"]
CMD ["--save", "", "--appendonly", "no", "--protected-mode", "no"]
LABEL org.opencontainers.image.title="lorapool-books" \
      org.opencontainers.image.description="redis-server for the shared books of a LoRAPool's routers"

# --- runtime: the release image (default target: last stage) ---------------------------
FROM runtime-base AS runtime
LABEL org.opencontainers.image.title="lorapool" \
      org.opencontainers.image.description="lorapool operator, router, adapter-sync sidecar and vLLM simulator" \
      org.opencontainers.image.licenses="Apache-2.0"
