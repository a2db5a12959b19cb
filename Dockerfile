# Multi-stage build of the Gatehouse binaries into a small, non-root runtime image.
FROM rust:1.95-bookworm AS build
WORKDIR /src
COPY . .
RUN cargo build --release --locked -p control-plane -p worker \
 && strip target/release/control-plane target/release/worker target/release/gatehousectl

FROM debian:bookworm-slim
RUN apt-get update && apt-get install -y --no-install-recommends ca-certificates tzdata libssl3 \
 && rm -rf /var/lib/apt/lists/* \
 && useradd --system --uid 10001 --no-create-home gatehouse
COPY --from=build /src/target/release/control-plane /src/target/release/worker /src/target/release/gatehousectl /usr/local/bin/
USER 10001
EXPOSE 8080 8081
ENTRYPOINT []
