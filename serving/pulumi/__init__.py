"""Pulumi: the ComponentResources (``components/``), the program run offline under mocks, schema and CRD
validation against the pinned CRDs (``crds.py``), render output and the fleet diff."""
