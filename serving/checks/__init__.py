"""Every check ExaServe runs, each producing :class:`serving.result.CheckResult` records.

``rules`` judge a plan before merge, ``policy`` judges rendered Kubernetes objects (offline and as the
CrossGuard pack in ``policies/``), ``preflight`` turns per-host probe results into the preflight report.
The renderers' own check of their command lines against the pinned parsers (:mod:`serving.flags`) and the result
record (:mod:`serving.result`) sit below both, so ``serving.render`` never imports this package.
"""
