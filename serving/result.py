"""The one result record every check produces: plan rules, deployment policies, preflight and flag validation.

A :class:`CheckResult` says which check ran (``check``), about what (``subject``: a spec path, a Kubernetes
object, a host, a flag), how it came out (``status``), what it saw with the offending value (``observed``),
what the rule asks for (``expected``) and what to do about it (``fix``). Its :attr:`~CheckResult.message`
is the one-line text every consumer shows; :meth:`~CheckResult.to_json` is its JSON form.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from enum import StrEnum


class Status(StrEnum):
    """How a check came out. ``warn`` is shown but fails nothing; ``skip`` means the check does not apply."""

    PASS = "pass"  # noqa: S105 - a status, not a password
    WARN = "warn"
    FAIL = "fail"
    SKIP = "skip"


# Statuses that must say what to do.
NEEDS_FIX = frozenset({Status.WARN, Status.FAIL})


@dataclass(frozen=True)
class CheckResult:
    """One check's outcome. ``fix`` is required for ``warn`` and ``fail`` and absent otherwise."""

    check: str
    status: Status
    observed: str
    expected: str
    fix: str | None = None
    subject: str | None = None

    def __post_init__(self) -> None:
        if self.status in NEEDS_FIX and not self.fix:
            verb = "failed" if self.status is Status.FAIL else "warned"
            raise ValueError(f"check {self.check!r} {verb} without a fix; every failing check says what to do")
        if self.status not in NEEDS_FIX and self.fix is not None:
            raise ValueError(f"check {self.check!r}: a {self.status} result carries no fix (got {self.fix!r})")

    @property
    def message(self) -> str:
        """``observed (expected …). Fix: …``, leaving out the parts that are empty."""
        text = self.observed + (f" (expected {self.expected})" if self.expected else "")
        return f"{text}. Fix: {self.fix}" if self.fix else text

    def to_json(self) -> dict[str, str | None]:
        """The JSON form, shared by ``plan --json`` and ``check --json`` (the README documents it)."""
        return {
            "check": str(self.check),
            "status": self.status.value,
            "subject": self.subject,
            "observed": self.observed,
            "expected": self.expected,
            "fix": self.fix,
            "message": self.message,
        }


def failures(results: Iterable[CheckResult]) -> list[CheckResult]:
    """The results that fail (warnings do not)."""
    return [r for r in results if r.status is Status.FAIL]
