# Switchyard's image with Docker (or any BuildKit/Buildah builder):
#
#   docker build -t localhost/switchyard:0.1.0 .
#
# The same image as scripts/build-image.sh builds without a daemon: the seven
# binaries in /usr/local/bin, glibc and libgcc, CA certificates, the non-root
# user 65532, `switchyard` as the entrypoint (the chart runs each service's
# binary by name). No shell at run time.

FROM rust:1.95-bookworm AS build
WORKDIR /src
COPY . .
# protox compiles the protos in Rust: nothing to install beyond the toolchain.
RUN cargo build --release --locked --bins \
        -p switchyard \
        -p switchyard-inventory \
        -p switchyard-stack-assigner \
        -p switchyard-class-compiler \
        -p switchyard-claim-allocator \
        -p switchyard-alerter \
    && cargo build --profile node-agent --locked --bins -p switchyard-node-agent \
    && mkdir /out \
    && for b in switchyard switchyard-inventory switchyard-stack-assigner \
                switchyard-class-compiler switchyard-claim-allocator \
                switchyard-alerter; do \
           strip --strip-debug -o "/out/$b" "target/release/$b"; \
       done \
    && strip --strip-debug -o /out/switchyard-node-agent target/node-agent/switchyard-node-agent

# glibc, libgcc, CA certificates and the user nonroot (65532); no shell.
FROM gcr.io/distroless/cc-debian12:nonroot
COPY --from=build /out/ /usr/local/bin/
ENV PATH=/usr/local/bin:/usr/bin:/bin \
    SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt
USER 65532:65532
WORKDIR /
ENTRYPOINT ["/usr/local/bin/switchyard"]
LABEL org.opencontainers.image.title="switchyard" \
      org.opencontainers.image.description="Switchyard: the device-plugin and DRA GPU stacks side by side, and the migration between them" \
      org.opencontainers.image.version="0.1.0" \
      org.opencontainers.image.licenses="Apache-2.0"
