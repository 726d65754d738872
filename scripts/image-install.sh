#!/bin/sh
# Runs inside the image (Dockerfile RUN) or a chroot of its root filesystem (scripts/build-image.sh --rootfs):
# the non-root user and the venv with the exaserve wheel and its pinned dependencies, offline, from the build
# context that scripts/build-image.sh staged in $1 (dist/ the wheel, wheels/ its dependencies, and requirements.lock
# when the checkout has one). Debian's python3 and python3-venv are installed by the caller.
set -eu
ctx=${1:?usage: image-install.sh BUILD_CONTEXT}
uid=65532  # serving.render.k8s.runtime.RUNTIME_UID: the pods' runAsUser

groupadd --system --gid "$uid" exaserve
useradd --system --uid "$uid" --gid "$uid" --home-dir /nonexistent --no-create-home --shell /usr/sbin/nologin exaserve
python3 -m venv /opt/exaserve
pip="/opt/exaserve/bin/pip install --no-cache-dir --no-index --find-links $ctx/wheels"
# Dependencies: the hashed lock when the checkout has one, else the wheel's own pins (one line to change).
if [ -f "$ctx/requirements.lock" ]; then $pip --require-hashes -r "$ctx/requirements.lock"; $pip --no-deps "$ctx"/dist/*.whl; else $pip "$ctx"/dist/*.whl; fi
/opt/exaserve/bin/exaserve --version
