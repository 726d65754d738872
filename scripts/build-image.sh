#!/usr/bin/env bash
# Build the exaserve image (Dockerfile) from this checkout.
#
#   scripts/build-image.sh [--tag NAME:TAG]        docker (or buildah) build of the Dockerfile; prints the image ID
#   scripts/build-image.sh --rootfs DIR [--tag T]  no registry needed: the same image's root filesystem from Debian's
#                                                  own packages (debootstrap), the same install step in a chroot, the
#                                                  CLI run from it as uid 65532; then, with buildah, an OCI image of
#                                                  it, the CLI run in it (buildah run) and its digest printed
#
# Both stage one build context: dist/ (this checkout's wheel), wheels/ (its dependencies, from requirements.lock when
# the checkout has one, else the wheel's pins), image-install.sh. The Debian mirror for --rootfs is this machine's own
# (its apt sources), or DEBIAN_MIRROR.
set -euo pipefail
cd "$(dirname "$0")/.."

tag="exaserve/exaserve-deploy:$(sed -n 's/^version = "\(.*\)"/\1/p' pyproject.toml)"
rootfs=""
while (($#)); do
  case "$1" in
    --tag) tag=${2:?--tag needs NAME:TAG}; shift 2 ;;
    --rootfs) rootfs=${2:?--rootfs needs a directory}; shift 2 ;;
    *) echo "build-image: unknown argument $1 (use --tag NAME:TAG, --rootfs DIR)" >&2; exit 2 ;;
  esac
done
PY=${PYTHON:-.venv/bin/python}

ctx=$(mktemp -d)
trap 'rm -rf "$ctx"' EXIT
"$PY" -m pip wheel -q --no-deps --wheel-dir "$ctx/dist" .
if [ -f requirements.lock ]; then
  cp requirements.lock "$ctx/"
  "$PY" -m pip wheel -q --require-hashes --wheel-dir "$ctx/wheels" -r requirements.lock
else
  "$PY" -m pip wheel -q --wheel-dir "$ctx/wheels" "$ctx"/dist/*.whl
fi
cp scripts/image-install.sh "$ctx/"

if [ -z "$rootfs" ]; then
  if command -v docker >/dev/null && docker info >/dev/null 2>&1; then
    docker build --quiet --tag "$tag" --file Dockerfile "$ctx"
  else
    buildah bud --quiet --tag "$tag" --file "$PWD/Dockerfile" "$ctx"
  fi
  exit 0
fi

if [ "$(id -u)" -ne 0 ]; then
  echo "build-image: --rootfs needs root (debootstrap, chroot)" >&2
  exit 2
fi
mirror=${DEBIAN_MIRROR:-$(sed -n 's/^URIs: *\([^ ]*\/debian\)$/\1/p' /etc/apt/sources.list.d/*.sources 2>/dev/null | head -n1)}
if [ -z "$mirror" ]; then
  echo "build-image: no Debian mirror in /etc/apt/sources.list.d/*.sources; set DEBIAN_MIRROR" >&2
  exit 2
fi
if [ ! -x "$rootfs/usr/bin/python3" ]; then
  debootstrap --variant=minbase --include=python3,python3-venv,ca-certificates bookworm "$rootfs" "$mirror"
fi
rm -rf "$rootfs/tmp/build" "$rootfs/opt/exaserve"
# A clean environment: nothing of this machine's pip or Python configuration reaches the image.
in_root() { env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin LANG=C.UTF-8 chroot "$@"; }
in_root "$rootfs" sh -c 'userdel exaserve 2>/dev/null; groupdel exaserve 2>/dev/null; true'
cp -r "$ctx" "$rootfs/tmp/build"
in_root "$rootfs" sh /tmp/build/image-install.sh /tmp/build
rm -rf "$rootfs/tmp/build" "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/lib/apt/lists/*
# The CLI as the image runs it: uid 65532, the venv's entry point.
in_root --userspec=65532:65532 "$rootfs" /opt/exaserve/bin/exaserve --version
in_root --userspec=65532:65532 "$rootfs" /opt/exaserve/bin/exaserve controller run --help >/dev/null
echo "build-image: root filesystem in $rootfs runs exaserve as uid 65532"
if command -v buildah >/dev/null; then
  c=$(buildah from scratch)
  buildah copy --quiet "$c" "$rootfs" /
  buildah config --user 65532:65532 --entrypoint '["/opt/exaserve/bin/exaserve"]' \
    --env PATH=/opt/exaserve/bin:/usr/sbin:/usr/bin:/sbin:/bin --env PYTHONDONTWRITEBYTECODE=1 "$c"
  buildah commit --quiet --rm "$c" "$tag"
  # The image as a container runs it (its user, entry point and environment); chroot isolation needs no runtime.
  c=$(buildah from --quiet "$tag")
  trap 'buildah rm "$c" >/dev/null; rm -rf "$ctx"' EXIT
  test "$(buildah run --isolation chroot "$c" -- id -u)" = 65532
  buildah run --isolation chroot "$c" -- /opt/exaserve/bin/exaserve --version
  buildah run --isolation chroot "$c" -- /opt/exaserve/bin/exaserve controller run --help >/dev/null
  buildah images --digests --format '{{.Name}}:{{.Tag}} {{.Digest}}' "$tag"
fi
