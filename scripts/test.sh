#!/usr/bin/env bash
# The whole test suite: bootstrap (idempotent), then linters, type checks and every test.
# CI runs exactly this (see .ci/run). Exit status: non-zero when any step fails.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/bootstrap.sh
export PATH="$PWD/.venv/bin:$PATH"
echo "== ruff";          ruff check serving infra policies ansible tests bench scripts
echo "== mypy (strict on serving/)"; mypy serving
echo "== yamllint";      yamllint -s .
echo "== ansible-lint (production profile)"; (cd ansible && ansible-lint)
echo "== ansible-test sanity"; scripts/ansible-sanity.sh
echo "== ansible-playbook --syntax-check"
(cd ansible && ansible-playbook --syntax-check -i inventory/prod.exaserve.yml preflight.yml site.yml)
gpu=()  # gpu-marked tests run where torch sees a CUDA device; elsewhere they are deselected, and said so
if [[ $(python -m tests.support.gpu 2>/dev/null) == 0 ]]; then gpu=(-m "not gpu"); echo "== no CUDA device: gpu tests deselected"; fi
echo "== pytest";        pytest -q -p no:cacheprovider "${gpu[@]}" "$@"
