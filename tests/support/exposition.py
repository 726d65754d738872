"""The reference for :mod:`serving.exposition`: prometheus_client's own parser, and a comparison that treats NaN as
equal to itself (a NaN sample is the same sample)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from prometheus_client.parser import text_string_to_metric_families

Parsed = tuple[str, Mapping[str, str], float]


def reference(text: str) -> list[Parsed]:
    """The samples prometheus_client yields for ``text``, in order."""
    return [(s.name, s.labels, float(s.value)) for f in text_string_to_metric_families(text) for s in f.samples]


def comparable(parsed: Sequence[Parsed]) -> list[tuple[str, dict[str, str], str]]:
    return [(name, dict(labels), repr(value)) for name, labels, value in parsed]
