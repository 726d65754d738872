"""Fault drills: the scenario catalogue (:mod:`serving.drill.scenarios`) that the drill engine runs against a fleet
and :mod:`serving.render.k8s.chaos` renders as Chaos Mesh experiments (docs/drills.md)."""
