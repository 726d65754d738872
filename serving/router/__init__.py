"""The SGLang router from the outside: its HTTP API and Prometheus metrics (``client.py``) and a bounded load
generator (``loadgen.py``), shared by the updater, the runtime layer and the sandbox."""
