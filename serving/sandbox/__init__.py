"""The simulator only: simulated SGLang workers, local processes, the local rollout backend and the sandbox
runtime. Production code never imports it (tests/test_architecture.py)."""
