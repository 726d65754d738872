# The exaserve image: the `exaserve` CLI (fleet controller, node agents, rolling updater) on Debian 12 slim, as the
# non-root user 65532. Build it with scripts/build-image.sh, which stages the context this file expects: dist/ (the
# wheel), wheels/ (its dependencies, so the build installs offline) and requirements.lock when the checkout has one.
# The base is pinned by digest (debian:bookworm-slim); update it deliberately (docs/infra.md, "The image").
FROM debian:bookworm-slim@sha256:7b140f374b289a7c2befc338f42ebe6441b7ea838a042bbd5acbfca6ec875818

RUN apt-get update \
    && apt-get install -y --no-install-recommends python3 python3-venv ca-certificates \
    && rm -rf /var/lib/apt/lists/*
COPY . /tmp/build
RUN sh /tmp/build/image-install.sh /tmp/build && rm -rf /tmp/build

ENV PATH=/opt/exaserve/bin:/usr/sbin:/usr/bin:/sbin:/bin PYTHONDONTWRITEBYTECODE=1
USER 65532:65532
ENTRYPOINT ["/opt/exaserve/bin/exaserve"]
