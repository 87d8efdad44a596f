# Switchyard's image with Docker (or any BuildKit/Buildah builder):
#
#   docker build -t localhost/switchyard:0.1.0 .
#
# The same image as scripts/build-image.sh builds without a daemon: the
# multi-call binary `switchyard` in /usr/local/bin with a link to it under
# each service's name (the chart runs each service by its name), the node
# agent's own small binary `switchyard-node-agent`, glibc and libgcc, CA
# certificates, the non-root user 65532, `switchyard` as the entrypoint. No
# shell at run time.

FROM rust:1.95-bookworm AS build
WORKDIR /src
COPY . .
# protox compiles the protos in Rust: nothing to install beyond the toolchain.
# The image and node-agent profiles: for size, whole-program (Cargo.toml).
RUN cargo build --locked --profile image -p switchyard --bin switchyard \
    && cargo build --locked --profile node-agent -p switchyard-node-agent --bin switchyard-node-agent \
    && mkdir /out \
    && strip --strip-debug -o /out/switchyard target/image/switchyard \
    && strip --strip-debug -o /out/switchyard-node-agent target/node-agent/switchyard-node-agent \
    && ln -s switchyard /out/switchyard-inventory \
    && ln -s switchyard /out/switchyard-stack-assigner \
    && ln -s switchyard /out/switchyard-class-compiler \
    && ln -s switchyard /out/switchyard-claim-allocator \
    && ln -s switchyard /out/switchyard-alerter

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
