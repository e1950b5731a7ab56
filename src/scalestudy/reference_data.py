"""The published reference tables shipped with the package (``data/*.csv``; sources in
``data/README.md``), as published: one loader for the stages that read them (the performance
model compares with them, the report overlays them on its figures)."""

from __future__ import annotations

from importlib import resources

FILES = {
    "frontier_dash2024": "frontier_dash2024.csv",
    "frontier_dash2024_configs": "frontier_dash2024_configs.csv",
    "megatron_sc21": "megatron_sc21_table1.csv",
}


def load(name: str):
    """The shipped CSV of a reference (see ``FILES``) as a pandas DataFrame."""
    import pandas as pd

    if name not in FILES:
        raise ValueError(f"references: {name!r} is not known; allowed: {', '.join(FILES)}")
    with resources.files("scalestudy").joinpath("data", FILES[name]).open() as f:
        return pd.read_csv(f)
