"""What measuring code concludes, as facts: a key naming the finding, a level, and the numbers it
cites (thresholds included). Torch-free and leaf: steps, observers and experiments return these;
report/ alone turns a key into words (report.wording), so the report can restyle or translate them."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

Level = Literal["good", "info", "warn", "bad"]
LEVELS: tuple[Level, ...] = ("good", "info", "warn", "bad")


@dataclass(frozen=True)
class Finding:
    """`key` says which finding ("sweep.overhead"); `values` holds every number, name and threshold
    the sentence cites, JSON-ready, so results.json carries the facts and not the prose."""

    key: str
    level: Level
    values: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.level not in LEVELS:
            raise ValueError(f"finding {self.key!r}: level {self.level!r} is not one of {', '.join(LEVELS)}")

    def to_json(self) -> dict[str, Any]:
        return {"key": self.key, "level": self.level, "values": dict(self.values)}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Finding:
        return cls(data["key"], data["level"], dict(data.get("values", {})))
