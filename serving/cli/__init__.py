"""The command line (typer): one module per command group, shared options and the JSON/exit-code contract in
:mod:`serving.cli.options`, lazy registration in :mod:`serving.cli.commands`."""
