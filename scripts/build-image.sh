#!/usr/bin/env bash
# Build the exaserve image from the Dockerfile in this checkout.
#
#   scripts/build-image.sh [--tag NAME:TAG]
#       docker (or buildah) builds the Dockerfile on its pinned base; prints the image ID
#   scripts/build-image.sh --local-base DIR [--tag NAME:TAG]
#       for a machine that reaches no container registry: the base made here from Debian's own packages
#       (debootstrap of the base's release, bookworm, into DIR, kept for the next build, committed as
#       localhost/exaserve-base:bookworm), then the same Dockerfile, every RUN and COPY, built on it with buildah;
#       then the image is run as a container runs it (buildah run): uid 65532, `exaserve --version`,
#       `exaserve controller run --help`, `exaserve agent run --help`; its size and layers printed, its SBOM
#       (/opt/exaserve/sbom.cdx.json in the image) copied to DIR.sbom.cdx.json.
#
# Both stage one build context: dist/ (this checkout's wheel, built without build isolation by this venv's setuptools,
# the one requirements-dev.lock pins), wheels/ (requirements-image.lock's and requirements-sbom.lock's wheels for the
# image's CPython 3.11 on x86_64 glibc 2.36, every hash checked), the two locks, pyproject.toml (the SBOM's main
# component) and image-install.sh. The Debian mirror for --local-base is this machine's own (its apt sources), or
# DEBIAN_MIRROR. Exit status: 0 built (and, with --local-base, run), 2 bad input or a missing tool, else
# the failing tool's.
set -euo pipefail
cd "$(dirname "$0")/.."

tag="exaserve/exaserve-deploy:$(sed -n 's/^version = "\(.*\)"/\1/p' pyproject.toml)"
base_dir=""
while (($#)); do
  case "$1" in
    --tag) tag=${2:?--tag needs NAME:TAG}; shift 2 ;;
    --local-base) base_dir=${2:?--local-base needs a directory}; shift 2 ;;
    *) echo "build-image.sh: unknown argument $1 (use --tag NAME:TAG, --local-base DIR)" >&2; exit 2 ;;
  esac
done
PY=${PYTHON:-.venv/bin/python}
if ! "$PY" -c 'import setuptools, sys; sys.exit(int(setuptools.__version__.split(".")[0]) < 77)' 2>/dev/null; then
  echo "build-image.sh: $PY has no setuptools >= 77 to build the wheel with; install requirements-dev.lock there" \
    "(scripts/bootstrap.sh), or set PYTHON to an interpreter that has it" >&2
  exit 2
fi

ctx=$(mktemp -d)
trap 'rm -rf "$ctx"' EXIT
# from a copy of the tracked and untracked (not ignored) files: setuptools writes build/ and *.egg-info beside them
mkdir "$ctx/src"
git ls-files -z --cached --others --exclude-standard | tar --null -T - -cf - | tar -xf - -C "$ctx/src"
"$PY" -m pip wheel -q --no-deps --no-build-isolation --wheel-dir "$ctx/dist" "$ctx/src"
rm -rf "$ctx/src"
cp requirements-image.lock requirements-sbom.lock pyproject.toml scripts/image-install.sh "$ctx/"
# the wheels the image's Python takes (Debian 12: CPython 3.11, glibc 2.36, x86_64), whatever runs this script; pip
# takes --platform literally (it widens only manylinux2014/2010 to the older tags), so every glibc up to 2.36 is named
platforms=(manylinux2014_x86_64 manylinux2010_x86_64 manylinux1_x86_64)
for glibc in $(seq 5 36); do platforms+=("manylinux_2_${glibc}_x86_64"); done
"$PY" -m pip download -q --require-hashes --no-deps --only-binary=:all: --implementation cp --python-version 3.11 \
  --abi cp311 "${platforms[@]/#/--platform=}" --dest "$ctx/wheels" -r requirements-image.lock -r requirements-sbom.lock

if [ -z "$base_dir" ]; then
  if command -v docker >/dev/null && docker info >/dev/null 2>&1; then
    docker build --quiet --tag "$tag" --file Dockerfile "$ctx"
  else
    buildah bud --quiet --tag "$tag" --file "$PWD/Dockerfile" "$ctx"
  fi
  exit 0
fi

for tool in debootstrap buildah; do
  command -v "$tool" >/dev/null || { echo "build-image.sh: --local-base needs $tool (apt-get install $tool)" >&2; exit 2; }
done
if [ "$(id -u)" -ne 0 ]; then
  echo "build-image.sh: --local-base needs root (debootstrap)" >&2
  exit 2
fi
mirror=${DEBIAN_MIRROR:-$(sed -n 's/^URIs: *\([^ ]*\/debian\)$/\1/p' /etc/apt/sources.list.d/*.sources 2>/dev/null | head -n1)}
if [ -z "$mirror" ]; then
  echo "build-image.sh: no Debian mirror in /etc/apt/sources.list.d/*.sources; set DEBIAN_MIRROR" >&2
  exit 2
fi
# The Dockerfile's base is debian:bookworm-slim: Debian 12's minimal set (minbase) with the same release's packages.
if [ ! -x "$base_dir/usr/bin/apt-get" ]; then
  debootstrap --variant=minbase bookworm "$base_dir" "$mirror"
  rm -rf "$base_dir"/var/cache/apt/archives/*.deb "$base_dir"/var/lib/apt/lists/*
fi
base=localhost/exaserve-base:bookworm
c=$(buildah from scratch)
buildah copy --quiet "$c" "$base_dir" /
buildah commit --quiet --rm "$c" "$base" >/dev/null
# chroot isolation: RUN steps need no container runtime (this sandbox's refuses setrlimit); the host's network
buildah bud --quiet --isolation chroot --build-arg "BASE=$base" --tag "$tag" --file "$PWD/Dockerfile" "$ctx"

# The image as a container runs it: its user, entry point and environment.
c=$(buildah from --quiet "$tag")
trap 'buildah rm "$c" >/dev/null; rm -rf "$ctx"' EXIT
uid=$(buildah run --isolation chroot "$c" -- id -u)
[ "$uid" = 65532 ] || { echo "build-image.sh: the image runs as uid $uid, not 65532" >&2; exit 1; }
buildah run --isolation chroot "$c" -- /opt/exaserve/bin/exaserve --version
buildah run --isolation chroot "$c" -- /opt/exaserve/bin/exaserve controller run --help >/dev/null
buildah run --isolation chroot "$c" -- /opt/exaserve/bin/exaserve agent run --help >/dev/null
buildah images --format '{{.Name}}:{{.Tag}} {{.ID}} {{.Size}}' "$tag"
sbom="$base_dir.sbom.cdx.json"
buildah run --isolation chroot "$c" -- cat /opt/exaserve/sbom.cdx.json >"$sbom"
echo "build-image.sh: the image's SBOM (CycloneDX) is in $sbom"
buildah inspect --type image --format '{{range .Docker.History}}{{.CreatedBy}}{{"\n"}}{{end}}' "$tag" | grep -v '^$'
