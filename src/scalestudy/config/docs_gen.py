"""Generated blocks of the docs (placeholder)."""

from __future__ import annotations

from pathlib import Path


def generated_blocks(repo: Path) -> dict[Path, str]:
    return {}
