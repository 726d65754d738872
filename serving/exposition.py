"""Prometheus text exposition (format 0.0.4) to samples, at the rate the fleet reads it.

``prometheus_client``'s parser is the reference: :func:`samples` gives exactly its samples (name, labels, value), and
a text it cannot vouch for line by line goes to that parser whole. What it adds is speed on the lines exporters
write: ``name{label="value",…} value [timestamp]`` with legacy names, as SGLang's ``generate_latest`` and smg's Rust
exporter write them. prometheus_client scans every label character by character in Python (~20 µs a sample): 4.3 to
5.4 times this module's CPU on the fleet's texts (``bench/exposition_bench.py``). It matters because one process
reads the whole fleet: an updater's soak reads 2,048 replicas' ``/metrics`` in one event loop, and at 2,048 replicas
on two cores its own parsing (70 % of its CPU, ``py-spy``) held the loop past the 3 s bound of the answers still in
flight, which it then reported as replicas whose ``/metrics`` did not answer (docs/scale.md). The node agents parse
their replicas' every heartbeat.

Outside the fast grammar the whole text is parsed by prometheus_client, which also raises its ``ValueError`` on what
it rejects: UTF-8 or quoted names, exemplars, more than a timestamp after the value, whitespace other than spaces,
quotes in a comment, a label name with ``__``, a duplicate label, a type prometheus_client does not know, a number of
over 300 characters, anything malformed. ``tests/test_exposition.py`` holds the two to the same samples on real
expositions and on each such edge.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from prometheus_client.metrics_core import METRIC_TYPES
from prometheus_client.parser import text_string_to_metric_families

Parsed = tuple[str, Mapping[str, str], float]

_NAME = r"[a-zA-Z_:][a-zA-Z0-9_:]*"
_QUOTED = r'"[^"\\]*(?:\\.[^"\\]*)*"'
# name, then {labels} (quoted values may hold any character, escaped ones included), then value and an optional
# timestamp separated by spaces (prometheus_client splits on " ", or on tabs only where there is no space)
_SAMPLE = re.compile(rf"({_NAME})(?:\{{([^\"\\}}]*(?:{_QUOTED}[^\"\\}}]*)*)\}})? +([^ \t]+)(?: +([^ \t]+))?")
_LABEL_NAME = r"[a-zA-Z][a-zA-Z0-9_]*|_[a-zA-Z0-9][a-zA-Z0-9_]*"  # legacy, and not reserved (``__``)
_PAIR = rf"(?:{_LABEL_NAME})={_QUOTED}"
_LABELS = re.compile(rf"{_PAIR}(?:,{_PAIR})*,?")
_LABEL = re.compile(rf'({_LABEL_NAME})="([^"\\]*(?:\\.[^"\\]*)*)"')
_METRIC_NAME = re.compile(_NAME)
_ESCAPE = re.compile(r'\\[\\n"]')  # prometheus_client's: other backslashes stay as they are
_UNESCAPED = {"\\\\": "\\", "\\n": "\n", '\\"': '"'}
_OTHER_SPACE = re.compile(r"[^\S ]")  # whitespace but the space: prometheus_client splits and strips it its own ways
_LONGEST_NUMBER = 300  # characters: longer integers stay exact ints in prometheus_client, and overflow a float
_TYPES = frozenset(METRIC_TYPES) | {"untyped"}  # prometheus_client's Metric refuses any other
# the sample names a family of each type holds (text_fd_to_metric_families' allowed_names)
_SUFFIXES = {"summary": ("_count", "_sum", ""), "histogram": ("_count", "_sum", "_bucket")}


class _Unvouched(Exception):
    """A line outside the fast grammar: prometheus_client parses the text."""


def samples(text: str) -> list[Parsed]:
    """Every sample of ``text``, as ``prometheus_client.parser.text_string_to_metric_families`` yields them in
    order, values as floats; raises ``ValueError`` where it does, and where a value is too large for a float."""
    try:
        return _fast(text)
    except _Unvouched:
        try:
            return [
                (s.name, s.labels, float(s.value))
                for family in text_string_to_metric_families(text)
                for s in family.samples
            ]
        except OverflowError as exc:
            raise ValueError(f"a value or timestamp too large: {exc}") from None


def _value(token: str) -> float:
    """prometheus_client's ``_parse_value`` (an int where the token is one, else a float) as a float, for the tokens
    both read alike: not what it would reject (underscores, which ``float`` accepts) nor a number too long to be a
    float."""
    if "_" in token or len(token) > _LONGEST_NUMBER:
        raise _Unvouched
    try:
        return float(int(token)) if token.lstrip("+-").isdigit() else float(token)  # "-0" is int 0
    except ValueError:
        raise _Unvouched from None


def _unescaped(escape: re.Match[str]) -> str:
    return _UNESCAPED[escape[0]]


def _labels(text: str) -> dict[str, str]:
    if not _LABELS.fullmatch(text):
        raise _Unvouched  # anything but pairs between the commas
    pairs = _LABEL.findall(text)
    labels = {name: _ESCAPE.sub(_unescaped, value) if "\\" in value else value for name, value in pairs}
    if len(labels) != len(pairs):
        raise _Unvouched  # a duplicate name: prometheus_client's to reject
    return labels


def _fast(text: str) -> list[Parsed]:
    out: list[Parsed] = []
    # text_fd_to_metric_families' state: the family being read, its type, the sample names it holds, and where its
    # samples begin in ``out`` (a counter whose name lacks ``_total`` has it added to its samples' names when it ends)
    family, kind, allowed, start = "", "untyped", set[str](), 0

    def close() -> None:
        if kind == "counter" and family and not family.endswith("_total"):
            out[start:] = [(name + "_total", labels, value) for name, labels, value in out[start:]]

    for raw in text.split("\n"):
        line = raw.strip()
        if not line:
            continue
        if _OTHER_SPACE.search(line):
            raise _Unvouched
        if line[0] == "#":
            if '"' in line:
                raise _Unvouched  # prometheus_client splits a comment outside quotes only
            words = line.split(None, 3)
            if len(words) < 3 or words[1] not in ("HELP", "TYPE"):
                if len(words) == 2 and words[1] in ("HELP", "TYPE"):
                    raise _Unvouched
                continue  # a comment
            name = words[2]
            if not _METRIC_NAME.fullmatch(name):
                raise _Unvouched
            if words[1] == "HELP":
                if name != family:
                    close()
                    family, kind, allowed, start = name, "untyped", {name}, len(out)
                continue
            if len(words) < 4:
                raise _Unvouched  # prometheus_client raises on a TYPE without a type
            if name != family:
                close()
                family, start = name, len(out)
            kind = words[3]
            if kind not in _TYPES or (kind == "counter" and name == "_total"):
                raise _Unvouched  # prometheus_client refuses the type, or the empty name _total leaves
            allowed = {name + suffix for suffix in _SUFFIXES.get(kind, ("",))}
            continue
        m = _SAMPLE.fullmatch(line)
        if m is None:
            raise _Unvouched
        name, labels, value, stamp = m.groups()
        if stamp is not None:
            _value(stamp)
        sample = (name, _labels(labels) if labels else {}, _value(value))
        if name in allowed:
            out.append(sample)
        else:  # a sample of no declared family: prometheus_client makes it an untyped family of its own
            close()
            out.append(sample)
            family, kind, allowed, start = "", "untyped", set(), len(out)
    close()
    return out
