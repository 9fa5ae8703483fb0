# Multi-stage build of the context-proxy binary.
FROM rust:1-slim-bookworm AS build
WORKDIR /src
COPY Cargo.toml Cargo.lock ./
COPY crates ./crates
COPY src ./src
COPY benches ./benches
RUN cargo build --release --locked --bin context-proxy

FROM debian:bookworm-slim
RUN apt-get update && apt-get install -y --no-install-recommends ca-certificates && rm -rf /var/lib/apt/lists/*
COPY --from=build /src/target/release/context-proxy /usr/local/bin/context-proxy
COPY deploy/compose.toml /etc/context-proxy/config.toml
EXPOSE 8080
ENTRYPOINT ["context-proxy", "--config", "/etc/context-proxy/config.toml"]
