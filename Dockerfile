# Multi-stage build of the context-proxy binary (the proxy, the mock upstream and the healthcheck
# are subcommands of it). Build context: the repository root (see .dockerignore).
FROM rust:1-slim-bookworm AS build
WORKDIR /src
# The whole workspace: the proxy package at the root and its crates under crates/.
COPY Cargo.toml Cargo.lock ./
COPY crates ./crates
COPY src ./src
COPY benches ./benches
RUN cargo build --release --locked --bin context-proxy

FROM debian:bookworm-slim
RUN apt-get update \
 && apt-get install -y --no-install-recommends ca-certificates \
 && rm -rf /var/lib/apt/lists/* \
 && useradd --system --uid 10001 --user-group --no-create-home --shell /usr/sbin/nologin context-proxy \
 && mkdir -p /data \
 && chown context-proxy:context-proxy /data
COPY --from=build /src/target/release/context-proxy /usr/local/bin/context-proxy
COPY deploy/compose.toml /etc/context-proxy/config.toml
# Never root: the proxy needs no privilege (port 8080, its store under /data or in Redis).
USER context-proxy
EXPOSE 8080
# GET /healthz from inside the container; no shell or curl needed.
HEALTHCHECK --interval=5s --timeout=3s --retries=10 CMD ["context-proxy", "healthcheck"]
ENTRYPOINT ["context-proxy", "--config", "/etc/context-proxy/config.toml"]
