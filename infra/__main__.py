"""The ExaServe Pulumi program: `pulumi up --stack NAME` deploys the fleet Pulumi.<NAME>.yaml describes.

The entry point only: it loads the stack's fleet and runs the program, `fleet_stack`
(serving/pulumi/components/stack.py: one explicit Kubernetes provider, one component per concern, the outputs). `exaserve render`, `check` and `diff`
run that same function in-process under Pulumi's mocks, from a checkout or an installed wheel alike.

`pulumi install` installs requirements.txt, the hashed lock of the dependencies (docs/dependencies.md), not this
checkout (pip's hash-checking mode refuses an editable install); Pulumi's language host runs this file with
`runpy.run_path`, which puts only infra/ on sys.path, so the checkout's `serving` is put there when none is installed.
"""

import importlib.util
import sys
from pathlib import Path

if importlib.util.find_spec("serving") is None:
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from serving.pulumi.components import fleet_stack
from serving.pulumi.program import program_fleet

fleet_stack(program_fleet())
