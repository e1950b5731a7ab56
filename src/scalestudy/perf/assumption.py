"""A model input known within a stated range (``Assumption``): the systems' and frameworks'
figures of ``data/hardware.yaml`` that are estimates, each with its range and source."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Assumption:
    """A model input that is not known exactly: ``value`` (the central estimate, what a
    prediction uses), the stated range ``[low, high]`` in the same unit, and its source.
    ``slow`` says which end makes a step slower (``"low"`` for rates, bandwidths and overlaps;
    ``"high"`` for a cost)."""

    value: float
    low: float
    high: float
    source: str = ""
    slow: str = "low"

    def __post_init__(self):
        if not self.low <= self.value <= self.high:
            raise ValueError(f"assumption {self.value} is outside its range [{self.low}, "
                             f"{self.high}] ({self.source})")
        if self.slow not in ("low", "high"):
            raise ValueError(f"slow={self.slow!r}: use 'low' or 'high'")

    @property
    def fast(self) -> str:
        return "high" if self.slow == "low" else "low"

    def end(self, which: str) -> float:
        """The value at ``"value"``, ``"low"``, ``"high"``, ``"slow"`` or ``"fast"``."""
        which = {"slow": self.slow, "fast": self.fast}.get(which, which)
        return float(getattr(self, which))

    @classmethod
    def parse(cls, x, slow: str = "low", source: str = "") -> "Assumption":
        """A YAML entry: a number (exact: low = high = value) or ``{value, low, high, source}``."""
        if isinstance(x, Assumption):
            return x
        if isinstance(x, dict):
            v = float(x["value"])
            return cls(v, float(x.get("low", v)), float(x.get("high", v)),
                       str(x.get("source", source)).strip(), str(x.get("slow", slow)))
        v = float(x)
        return cls(v, v, v, source, slow)
