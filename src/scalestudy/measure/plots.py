"""Figures of the ``matmul`` and ``collectives`` tables (``microbench plot``)."""

from __future__ import annotations

import os


def plot(kind: str, csv: str | os.PathLike, out: str | os.PathLike) -> None:
    """Figure of a ``matmul`` (GFLOP/s vs size, per dtype) or ``collectives`` (bus bandwidth
    vs message size, per op and group size) CSV; the format follows ``out``'s suffix."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import pandas as pd
    import seaborn as sns

    from scalestudy.record.io import atomic_path

    df = pd.read_csv(csv)
    fig, ax = plt.subplots(figsize=(6, 4))
    if df.empty:
        ax.text(0.5, 0.5, "no measurements", ha="center")
    elif kind == "matmul":
        df["size"] = (df["m"] * df["n"] * df["k"]) ** (1 / 3)
        df["GFLOP/s"] = df["flops_per_s"] / 1e9
        sns.lineplot(df, x="size", y="GFLOP/s", hue="dtype", marker="o", errorbar=("pi", 50), ax=ax)
        ax.set_xscale("log", base=2)
        ax.set_xlabel("matrix size (m·n·k)^(1/3)")
        ax.set_title(f"matmul throughput, {df['device_name'].iloc[0]}")
    elif kind == "collectives":
        df["GB/s (bus)"] = df["busbw_Bps"] / 1e9
        df["series"] = df["op"] + " p=" + df["group_size"].astype(str)
        sns.lineplot(df, x="bytes", y="GB/s (bus)", hue="series", marker="o", errorbar=("pi", 50), ax=ax)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("message size (bytes)")
        ax.set_title(f"collectives, {df['backend'].iloc[0]} on {df['device'].iloc[0]}")
    else:
        raise ValueError(f"plot kind {kind!r} is not supported; use matmul or collectives")
    fig.tight_layout()
    with atomic_path(out) as tmp:
        fig.savefig(tmp)
    plt.close(fig)
