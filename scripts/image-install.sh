#!/bin/sh
# Runs in the Dockerfile's install stage: the venv /opt/exaserve with requirements-image.lock (every hash checked)
# and the exaserve wheel without its dependencies (pyproject.toml's `image` group: what `controller run` and
# `agent run` import; the wheel's other requirements, the operator's tools, stay out), offline, from the build
# context scripts/build-image.sh staged in $1: dist/ the wheel, wheels/ the lock's wheels. Debian's python3 and
# python3-venv are installed by the caller. pip and setuptools leave the venv after the install: nothing in the
# image installs anything. The image's SBOM goes to /opt/exaserve/sbom.cdx.json.
set -eu
ctx=${1:?usage: image-install.sh BUILD_CONTEXT}
lock=$ctx/requirements-image.lock
for f in "$lock" "$ctx/requirements-sbom.lock" "$ctx/pyproject.toml"; do
  if [ ! -f "$f" ]; then
    echo "image-install.sh: no $f in the build context; build with scripts/build-image.sh, which stages it" >&2
    exit 2
  fi
done
python3 -m venv /opt/exaserve
pip="/opt/exaserve/bin/pip install --no-cache-dir --no-index --find-links $ctx/wheels"
$pip --require-hashes -r "$lock"
$pip --no-deps "$ctx"/dist/*.whl
/opt/exaserve/bin/pip uninstall --yes --quiet pip setuptools
# The SBOM of what the venv now holds (CycloneDX JSON, the wheel as the main component), by cyclonedx-py from
# requirements-sbom.lock in a venv of its own that stays in this stage.
python3 -m venv /tmp/sbom
/tmp/sbom/bin/pip install --no-cache-dir --no-index --find-links "$ctx/wheels" --require-hashes -r "$ctx/requirements-sbom.lock"
/tmp/sbom/bin/cyclonedx-py environment --pyproject "$ctx/pyproject.toml" --output-reproducible --of JSON \
  -o /opt/exaserve/sbom.cdx.json /opt/exaserve/bin/python
rm -rf /tmp/sbom
/opt/exaserve/bin/exaserve --version
/opt/exaserve/bin/exaserve controller run --help >/dev/null
/opt/exaserve/bin/exaserve agent run --help >/dev/null
