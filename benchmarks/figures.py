"""One measured figure of a benchmark, and the units the benchmarks share."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

MB = 1024 * 1024


@dataclass
class Figure:
    """One measured figure; ``target`` is a bound and ``higher_is_worse`` its direction."""

    benchmark: str
    config: str
    name: str
    value: float
    unit: str
    target: float | None = None
    higher_is_worse: bool = True
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def verdict(self) -> str:
        if self.target is None:
            return ""
        ok = self.value <= self.target if self.higher_is_worse else self.value >= self.target
        return "ok" if ok else "MISSED"
