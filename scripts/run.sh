#!/usr/bin/env bash
# The main job on the built-in default stack (prod): bootstrap, then plan it.
# Pass another stack with STACK=dev ./scripts/run.sh
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/bootstrap.sh
STACK=${STACK:-prod}
exec .venv/bin/exaserve plan --stack "$STACK"
