"""The ExaServe Pulumi program: `pulumi up --stack NAME` deploys the fleet Pulumi.<NAME>.yaml describes.

The entry point only: it loads the stack's fleet and runs the program, `fleet_stack`
(serving/pulumi/components/stack.py: one explicit Kubernetes provider, one component per concern, the outputs). `exaserve render`, `check` and `diff`
run that same function in-process under Pulumi's mocks, from a checkout or an installed wheel alike.

`pulumi install` (Pulumi.yaml: toolchain uv) installs uv.lock and this project, editable, into .venv-pulumi, so
`serving` imports from the checkout.
"""

from serving.pulumi.components import fleet_stack
from serving.pulumi.program import program_fleet

fleet_stack(program_fleet())
