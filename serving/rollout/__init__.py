"""The 5-batch rolling updater: a pure state machine (:mod:`.plan`, :mod:`.gates`, :mod:`.machine`),
its durable journal and lock (:mod:`.journal`), the I/O shell (:mod:`.runner`, :mod:`.session`) and
the platform backends (:mod:`.backends`). See ``docs/rollout.md``.
"""
