"""Command modules of the ``exaserve`` CLI; importing this package registers them all on the app.

Each module does ``from serving.cliutil import app`` and decorates its commands; add one import line
per module below.
"""
