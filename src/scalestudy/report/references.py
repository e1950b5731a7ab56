"""Published reference results shipped with the package (``data/*.csv``; sources in
``data/README.md``), in the units of our own tables so they can be overlaid on the figures.

Names a study may list under ``references``: ``frontier_dash2024``, ``megatron_sc21``.
"""

from __future__ import annotations

import pandas as pd

from scalestudy.reference_data import load

REFERENCES = ("frontier_dash2024", "megatron_sc21")
SHORT = {"frontier_dash2024": "Frontier (Dash et al. 2024)", "megatron_sc21": "Megatron-LM (SC21)"}
# What the published percentage of peak counts (for the figure legend).
PEAK_BASIS = {
    "frontier_dash2024": "counts the recompute pass (HFU-like), MI250X GCD 191.5 TFLOPS",
    "megatron_sc21": "counts the recompute pass (HFU-like), A100 312 TFLOPS",
}


def _check(name: str, allowed) -> str:
    if name not in allowed:
        raise ValueError(f"references: {name!r} is not known; allowed: {', '.join(allowed)}")
    return name


def efficiency_points(name: str) -> pd.DataFrame:
    """Published scaling efficiencies: ``reference, label, model, mode, n, efficiency``
    (fraction; ``n`` in devices = GCDs for Frontier, at the largest scale reported)."""
    _check(name, REFERENCES)
    rows = []
    if name == "frontier_dash2024":
        for r in load(name).itertuples(index=False):
            if pd.notna(r.weak_scaling_efficiency):
                rows.append({"mode": "weak", "n": int(r.weak_scaling_gpus),
                             "efficiency": float(r.weak_scaling_efficiency), "model": r.model})
            if pd.notna(r.strong_scaling_efficiency):
                rows.append({"mode": "strong", "n": int(r.gpus_max),
                             "efficiency": float(r.strong_scaling_efficiency), "model": r.model})
    elif name == "megatron_sc21":
        # Table 1 is weak scaling of model size with GPUs: per-GPU throughput relative to the
        # smallest configuration is its weak-scaling efficiency.
        d = load(name).sort_values("gpus")
        base = float(d["tflops_per_gpu"].iloc[0])
        for r in d.itertuples(index=False):
            rows.append({"mode": "weak", "n": int(r.gpus), "efficiency": r.tflops_per_gpu / base,
                         "model": f"gpt-{r.params_b:g}b"})
    out = pd.DataFrame(rows, columns=["mode", "n", "efficiency", "model"])
    out.insert(0, "reference", name)
    out.insert(1, "label", [f"{SHORT[name]}, {m}" for m in out["model"]])
    return out


def peak_fraction_points(name: str) -> pd.DataFrame:
    """Published fraction of the device peak: ``reference, label, model, n, fraction, basis``
    (``n`` NaN when the publication gives no device count for it)."""
    _check(name, REFERENCES)
    d = load(name)
    if name == "frontier_dash2024":
        n = d["gpus_max"]
        frac = d["pct_of_peak"] / 100.0
        models = d["model"]
    else:
        n = d["gpus"]
        frac = d["pct_of_peak"] / 100.0
        models = [f"gpt-{p:g}b" for p in d["params_b"]]
    out = pd.DataFrame({"reference": name, "model": list(models), "n": list(n),
                        "fraction": list(frac), "basis": PEAK_BASIS[name]})
    out.insert(1, "label", [f"{SHORT[name]}, {m}" for m in out["model"]])
    return out
