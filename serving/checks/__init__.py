"""Every check ExaServe runs, each producing :class:`serving.checks.result.CheckResult` records.

``rules`` judge a plan before merge, ``policy`` judges rendered Kubernetes objects (offline and as the
CrossGuard pack in ``policies/``), ``preflight`` turns per-host probe results into the preflight report,
and ``flags`` checks rendered SGLang and router command lines against the pinned parsers.
"""
