"""Reaching the nodes over SSH: the read-only probe guard (``probes.py``) and the parallel fan-out (``fanout.py``)."""
