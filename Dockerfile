# One image, two roles. The API image installs the server extra; a worker image adds a
# framework (CUDA builds of torch come from the PyTorch index, see docs/deploy.md).
#
#   docker build -t steady-api .
#   docker build -t steady-worker --build-arg EXTRAS=torch,workloads \
#       --build-arg PIP_EXTRA_INDEX_URL=https://download.pytorch.org/whl/cu124 .
#
# The browser assets (uPlot, Swagger UI, ReDoc) are npm packages pinned by package-lock.json: the
# first stage installs them (npm ci checks their integrity hashes), the second builds the wheel,
# whose build step (setup.py, scripts/fetch-assets) copies them into the package; the image
# installs that wheel and holds no node_modules.
FROM node:20-slim AS assets
WORKDIR /src
COPY package.json package-lock.json ./
RUN npm ci --ignore-scripts --no-audit --no-fund

FROM python:3.11-slim AS wheel
WORKDIR /src
COPY pyproject.toml setup.py package.json package-lock.json README.md LICENSE ./
COPY scripts/fetch-assets ./scripts/fetch-assets
COPY --from=assets /src/node_modules ./node_modules
COPY app ./app
COPY worker ./worker
COPY steady ./steady
COPY migrations ./migrations
RUN pip wheel --no-cache-dir --no-deps --wheel-dir /wheels .

FROM python:3.11-slim

ARG EXTRAS=server
ARG PIP_EXTRA_INDEX_URL=""
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_EXTRA_INDEX_URL=${PIP_EXTRA_INDEX_URL} \
    STEADY_DATA_DIR=/data

WORKDIR /opt/steady
COPY --from=wheel /wheels /wheels
RUN pip install "$(echo /wheels/steady-*.whl)[${EXTRAS}]" \
    && useradd --create-home --uid 10001 steady \
    && mkdir -p /data && chown steady /data
USER steady
EXPOSE 8000
# The API listens on all interfaces inside the container; put it behind the proxy or a firewall.
CMD ["steady", "serve", "--host", "0.0.0.0", "--port", "8000", "--workers", "2", "--log-level", "info"]
