"""Gate arithmetic: each batch (the canary) judged against replicas that were not updated, over the same window — pure.

Why the same window. Comparing the fleet after a batch with the fleet before the rollout blames the new
version for everything that happens meanwhile: a replica outside the batch failing, a traffic dip, a slow
hour. Kayenta and Argo Rollouts' analysis compare a canary with a baseline *running at the same time*; so
does :func:`.judge.judge`. The thresholds stay the source's (§ 4.4): QPS −20 %, P99 +30 %, errors 0.1 %.

The parts, each a module: :mod:`.window` reads every router instance and each replica and turns two reads into a
window's figures (per replica, per group, router-wide); :mod:`.findings` holds the gates themselves (QPS, P99 and
median, errors, down), each a finding with its significance; :mod:`.judge` weighs the canary against its peers,
and the replicas outside the batch against theirs, into a verdict; :mod:`.verdict` is what the journal keeps of it
(:class:`~.verdict.Gates`, :class:`~.verdict.Verdict`), with the canary's KV pool check added to it.
"""
