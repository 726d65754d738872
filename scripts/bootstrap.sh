#!/usr/bin/env bash
# Idempotent bootstrap for a fresh Debian 12 machine (as root) or an existing checkout:
# apt packages the tests and tools need, a venv in .venv with the locked dependencies (requirements-dev.lock: the dev
# extra; torch for the fabric worker) and the project, and the upstream CRDs pinned in serving/data/crds.lock.json.
# Re-running it is cheap: each step checks before it acts.
set -euo pipefail
cd "$(dirname "$0")/.."

APT_PACKAGES=(python3 python3-venv python3-dev gcc git openssh-server openssh-client chrony iproute2
  iputils-ping util-linux procps systemd
  prometheus  # promtool checks the rendered rules; the sandbox's Prometheus server (sandbox.prometheus)
  etcd-server  # the controllers' leader election on bare metal; tests/test_runtime_* run a real etcd
  python3-apt python3-debian)  # Ansible's apt and deb822_repository modules on the SSH test hosts

missing=()
for pkg in "${APT_PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
done
if ((${#missing[@]})); then
  if [ "$(id -u)" -ne 0 ]; then
    echo "bootstrap: missing apt packages ${missing[*]}; run as root or install them" >&2
    exit 2
  fi
  echo "bootstrap: installing apt packages: ${missing[*]}" >&2
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

PY=${EXASERVE_PYTHON:-python3}
# --sglang-parser (scripts/test.sh): also the venv holding the pinned SGLang's real server parser, which the tests
# run (scripts/sglang-manifest.sh; 2 GB in the user's cache, kept across clones). Its install (about 50 s of one core
# on a machine without it) runs beside this one, which keeps one core busy; a machine that has it only checks it.
parser=""
if [[ ${1:-} == --sglang-parser ]]; then
  parser_log=$(mktemp)
  bash scripts/sglang-manifest.sh --venv-only >"$parser_log" 2>&1 & parser=$!
fi
stamp=.venv/.exaserve-installed
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
# The locked set (docs/dependencies.md): requirements-dev.lock with every hash checked, torch at uv.lock's version
# (its wheel is per machine: the CPU build here, the CUDA build on a GPU node, so it has no hash in the lock),
# then the checkout itself, editable, built offline by the locked setuptools; `pip check` proves the set complete.
# Reinstall only when the build declaration or the lock changed since the last install.
want=$(cat pyproject.toml setup.py uv.lock requirements-dev.lock | sha256sum | cut -d' ' -f1)
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
  torch=$(.venv/bin/python -c '
import tomllib
print(next(p["version"] for p in tomllib.load(open("uv.lock", "rb"))["package"] if p["name"] == "torch"))')
  .venv/bin/python -m pip install -q --upgrade "pip>=24"
  .venv/bin/python -m pip install -q --require-hashes --no-deps -r requirements-dev.lock
  # its pure-Python dependencies are already there from the lock; a machine without the CPU wheel gets PyPI's CUDA
  # build and the nvidia-* wheels it requires, resolved by pip (unhashed: the one part outside the lock)
  .venv/bin/python -m pip install -q --only-binary=:all: "torch==$torch"
  .venv/bin/python -m pip install -q --no-deps --no-build-isolation -e .
  .venv/bin/python -m pip check
  echo "$want" >"$stamp"
fi
# The pinned CRDs: ../shared/crds (the offline mirror) or the cache is verified against the lock; only when
# neither is there are the files fetched from upstream into the cache (and verified).
.venv/bin/python -m serving.pulumi.crds fetch
if [ -n "$parser" ]; then
  if ! wait "$parser"; then
    echo "bootstrap: building the SGLang parser venv failed (scripts/sglang-manifest.sh --venv-only):" >&2
    tail -n 40 "$parser_log" >&2
    exit 1
  fi
  # said, so that a CI log shows whether its machine had it (a build costs the run about 50 s of one core)
  grep -h "^sglang-manifest: building" "$parser_log" >&2 || true
  rm -f "$parser_log"
fi
