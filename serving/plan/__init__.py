"""The capacity plan: the immutable :class:`~serving.plan.model.Plan` (``model.py``), the functions computing it
(``planner.py``, SGLang's memory arithmetic in ``memory.py``) and the audit of the source plan (``audit.py``)."""
