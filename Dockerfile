# The exaserve image: the `exaserve` CLI as the fleet controller and the node agents run it, on Debian 12 slim, as
# the non-root user 65532. Build it with scripts/build-image.sh, which stages the context this file expects: dist/
# (the wheel), wheels/ (the two locks' wheels, so the build installs offline), requirements-image.lock (the
# pyproject.toml `image` group: what `controller run` and `agent run` import, nothing of the operator's tools), and
# requirements-sbom.lock with pyproject.toml for the SBOM the install stage writes (/opt/exaserve/sbom.cdx.json).
# The base is pinned by digest (debian:bookworm-slim); update it deliberately (docs/infra.md, "The image"). BASE is
# an argument only so that scripts/build-image.sh --local-base can build these same steps on a base made from
# Debian's packages where no registry is reachable; a release build uses the default.
ARG BASE=debian:bookworm-slim@sha256:7b140f374b289a7c2befc338f42ebe6441b7ea838a042bbd5acbfca6ec875818

# The venv, installed from the staged context; only /opt/exaserve leaves this stage (the context's wheels do not).
FROM ${BASE} AS install
RUN apt-get update \
    && apt-get install -y --no-install-recommends python3 python3-venv \
    && apt-get clean && rm -rf /var/lib/apt/lists/*
COPY . /tmp/build
RUN sh /tmp/build/image-install.sh /tmp/build

FROM ${BASE}
RUN apt-get update \
    && apt-get install -y --no-install-recommends python3 ca-certificates \
    && apt-get clean && rm -rf /var/lib/apt/lists/* /var/cache/apt/*.bin \
    && groupadd --system --gid 65532 exaserve \
    && useradd --system --uid 65532 --gid 65532 --home-dir /nonexistent --no-create-home --shell /usr/sbin/nologin exaserve
COPY --from=install /opt/exaserve /opt/exaserve

ENV PATH=/opt/exaserve/bin:/usr/sbin:/usr/bin:/sbin:/bin PYTHONDONTWRITEBYTECODE=1
USER 65532:65532
ENTRYPOINT ["/opt/exaserve/bin/exaserve"]
