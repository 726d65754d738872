#!/usr/bin/env bash
# Ansible's own collection test, `ansible-test sanity`, over the exaserve.fleet collection
# (ansible/collections/ansible_collections/exaserve/fleet), with the project's Python (3.11, from .venv).
# Runs every sanity test ansible-test runs by default; ansible-test says which it skips and why (no
# PowerShell or shell scripts in the collection, no changelogs/ fragments). Extra arguments go to
# ansible-test, e.g. `scripts/ansible-sanity.sh --test validate-modules`.
# Needs scripts/bootstrap.sh first. Idempotent; offline except for the package index (pip's own config).
# Exit status: ansible-test's (non-zero when a test fails).
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
venv_bin=$root/.venv/bin
collection=$root/ansible/collections/ansible_collections/exaserve/fleet

# ansible-test gives every sanity test its own virtualenv, created without pip, and puts pip into it with a
# get-pip.py that it downloads from its CI file host into ~/.ansible/test/cache, a host this project cannot
# reach. scripts/ansible_test_get_pip.py stands in for that download (it installs the same pip through the
# package index; see its docstring), in the cache under the name ansible-test looks for. A home of its own in the
# user's cache ($EXASERVE_ANSIBLE_TEST_HOME, default ${XDG_CACHE_HOME:-~/.cache}/exaserve/ansible-test-home) keeps
# the stand-in out of the user's real ~/.ansible, and its virtualenvs (about 3 minutes to build; reused while
# ansible-test's pins stay the same) survive a clean clone. Keep that path short: pip writes the virtualenvs' paths
# into script shebangs (127 characters).
export HOME=${EXASERVE_ANSIBLE_TEST_HOME:-${XDG_CACHE_HOME:-$HOME/.cache}/exaserve/ansible-test-home}
pip_version=$("$venv_bin/python" -c '
from types import SimpleNamespace
from ansible_test._internal.python_requirements import get_venv_packages
print(get_venv_packages(SimpleNamespace(version="3.11"))["pip"])')
cache=$HOME/.ansible/test/cache
mkdir -p "$cache"
install -m 0644 scripts/ansible_test_get_pip.py "$cache/get_pip_${pip_version//./_}.py"

cd "$collection"
PATH=$venv_bin:$PATH exec ansible-test sanity --local --python 3.11 --color no "$@"
