"""The SGLang router from the outside: its HTTP API and Prometheus metrics (``client.py``) and a bounded load
generator (``loadgen.py``), shared by the updater, the runtime layer and the sandbox."""

# The router's client-facing generation routes, as smg labels its smg_http_* metrics (the matched route template,
# middleware/metrics.rs): the gates' and the alerts' client figures count these paths only; the control API's
# (/workers…), the probes' (/liveness, /readiness, /health) and the scrapes' answers are no client's.
INFERENCE_PATHS = ("/generate", "/v1/chat/completions", "/v1/completions", "/v1/embeddings", "/v1/responses")
