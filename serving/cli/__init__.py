"""The command line (typer): one module per command group, shared options and the JSON/exit-code contract in
:mod:`serving.cli.options`, the app and its command table (a command's module is imported when it runs) in
:mod:`serving.cli.commands`."""
