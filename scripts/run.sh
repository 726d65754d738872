#!/usr/bin/env bash
# The main job on the built-in default stack (prod): bootstrap, then what a pull request runs —
# the capacity plan, the policy pack, and the offline render of every Kubernetes object (validated
# against the Kubernetes schemas), written to build/render/<stack>/.
# Another stack: STACK=dev ./scripts/run.sh
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/bootstrap.sh
STACK=${STACK:-prod}
exaserve=.venv/bin/exaserve
"$exaserve" plan --stack "$STACK"
# --allow-tags: prod's images are tags until the image workflow publishes their digests (docs/infra.md, "Production
# images"); `pulumi up`'s policy pack refuses them. --summary says how many are pending in one line, so the plan stays
# the first screen; `exaserve check --stack prod` (the line names it) lists each with the digest to set.
"$exaserve" check --stack "$STACK" --allow-tags --summary
"$exaserve" render --stack "$STACK" --out "build/render/$STACK"
