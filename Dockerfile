# tollgate container image.
#   docker build -t tollgate .
#   docker build --build-arg PGO=0 -t tollgate .   # a plain release build: minutes, not 25
#   docker run -p 8080:8080 -v $PWD/my.yaml:/etc/tollgate/tollgate.yaml:ro tollgate
# The mounted config must bind its listeners to 0.0.0.0 (not 127.0.0.1) to be
# reachable from outside the container; the admin port may stay on 127.0.0.1,
# where the health check below reaches it.

FROM rust:1-slim-bookworm AS build
WORKDIR /src
# The profile-guided build (scripts/pgo-build): rustup's llvm-profdata
# merges the training counts; redis-server lets the training cover the
# Redis store. Neither reaches the final image.
RUN rustup component add llvm-tools \
 && apt-get update \
 && apt-get install -y --no-install-recommends redis-server \
 && rm -rf /var/lib/apt/lists/*
COPY Cargo.toml Cargo.lock ./
COPY src ./src
COPY benches ./benches
COPY examples ./examples
COPY scripts ./scripts
ARG PGO=1
RUN if [ "$PGO" = 1 ]; then scripts/pgo-build && cp target/pgo/tollgate /tollgate; \
    else cargo build --release --locked && cp target/release/tollgate /tollgate; fi \
 && strip /tollgate

FROM debian:bookworm-slim
RUN apt-get update \
 && apt-get install -y --no-install-recommends ca-certificates \
 && rm -rf /var/lib/apt/lists/* \
 && useradd --system --no-create-home --uid 10001 tollgate \
 && mkdir -p /etc/tollgate
COPY --from=build /tollgate /usr/local/bin/tollgate
COPY config.example.yaml /etc/tollgate/tollgate.yaml
USER tollgate
EXPOSE 8080 8443
# No curl in the image: bash's /dev/tcp asks the admin listener directly.
HEALTHCHECK --interval=10s --timeout=3s --retries=3 CMD \
  bash -c 'exec 3<>/dev/tcp/127.0.0.1/9090 && printf "GET /healthz HTTP/1.0\r\n\r\n" >&3 && head -1 <&3 | grep -q " 200 "'
STOPSIGNAL SIGTERM
ENTRYPOINT ["/usr/local/bin/tollgate"]
CMD ["run", "--config", "/etc/tollgate/tollgate.yaml"]
