"""The devices of the shipped hardware table (``data/hardware.yaml``): the words
``platform.hardware`` may be, and the rows the performance model (``scalestudy.perf.hardware``)
reads its peaks and systems from."""

from __future__ import annotations

import re
from functools import lru_cache
from importlib import resources

import yaml

TABLE = "hardware.yaml"


@lru_cache(maxsize=1)
def table() -> dict:
    """The parsed ``data/hardware.yaml``: ``{"devices": {...}, "systems": {...}}``."""
    text = resources.files("scalestudy").joinpath("data", TABLE).read_text()
    return yaml.safe_load(text)


def devices() -> dict[str, dict]:
    return table()["devices"]


def device_key(device_name_or_key: str | None) -> str | None:
    """Table key for a device name (``"NVIDIA H100 80GB HBM3"``), a key (``"H100-SXM5"``,
    any case) or an alias (``MI250X``); ``None`` when the table has no row for it."""
    if not device_name_or_key:
        return None
    name = str(device_name_or_key).strip().lower()
    for key, d in devices().items():
        if name == key.lower() or name in (a.lower() for a in d.get("aliases", ())):
            return key
    for key, d in devices().items():
        if any(re.search(p, name, flags=re.IGNORECASE) for p in d.get("names", ())):
            return key
    return None
