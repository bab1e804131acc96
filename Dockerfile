# rtpool image: one image for the master and the workers (`rtpool master ...`, `rtpool worker ...`).
#
#   docker build -t rtpool:0.1.0 .
#   docker run --rm -p 7070:7070 -v rtpool-data:/var/lib/rtpool rtpool:0.1.0 \
#       master --listen 0.0.0.0:7070 --data-dir /var/lib/rtpool
#
# Workers import task functions by module name unless they travel by value, so an image for
# real work starts `FROM rtpool:0.1.0` and pip-installs the packages its tasks need.
# docs/deploy.md has the Kubernetes and systemd set-ups that use it.

# --- builder: the Rust core and the wheel (maturin) -------------------------------------------
FROM rust:1-slim-bookworm AS builder
RUN apt-get update \
    && apt-get install -y --no-install-recommends python3 python3-venv \
    && rm -rf /var/lib/apt/lists/*
RUN python3 -m venv /opt/maturin && /opt/maturin/bin/pip install --no-cache-dir "maturin>=1.5,<2"
WORKDIR /src
COPY Cargo.toml Cargo.lock pyproject.toml README.md ./
COPY crates crates
COPY python python
# The module is abi3 (Python >= 3.9), so the wheel built here loads in the runtime's Python.
RUN /opt/maturin/bin/maturin build --release --locked --out /dist

# --- runtime: Python, the wheel, nothing else ---------------------------------------------------
FROM python:3.12-slim-bookworm
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    RTPOOL_DATA_DIR=/var/lib/rtpool
COPY --from=builder /dist /tmp/dist
RUN pip install --no-cache-dir /tmp/dist/rtpool-*.whl \
    && rm -rf /tmp/dist \
    && useradd --system --uid 10001 --user-group --home-dir /var/lib/rtpool --shell /usr/sbin/nologin rtpool \
    && install -d -o rtpool -g rtpool -m 0700 /var/lib/rtpool
USER 10001:10001
WORKDIR /var/lib/rtpool
# Tokens, journal and SQLite store of the master; workers keep nothing here.
VOLUME ["/var/lib/rtpool"]
EXPOSE 7070
# PID 1 is rtpool itself: both the master and the worker supervisor handle SIGTERM (graceful
# stop) and the supervisor reaps every child, so no init shim is needed.
ENTRYPOINT ["rtpool"]
CMD ["master", "--listen", "0.0.0.0:7070", "--data-dir", "/var/lib/rtpool"]
