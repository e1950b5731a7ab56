"""The hardware description: device peaks (the MFU denominator) and systems (the performance
model's presets), both read from one file shipped with the package, ``data/hardware.yaml``
(``scalestudy.config.devices`` reads it and names its devices).

A device the table does not know, a CPU, or a precision that is not an MFU denominator of the
device (fp32 on a GPU) gets no peak: ``(None, None, None)``, never a fallback guess.
Units: peaks in FLOP/s, memory in bytes (the YAML says TFLOP/s and GB), bandwidth in bytes/s
per direction per device, latency in seconds per call (a GPU system's ring collectives: its
collective library's latency per call and per step, ``CollectiveLatency``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from functools import lru_cache
from importlib import resources
from pathlib import Path

from scalestudy.config.devices import devices, table
from scalestudy.perf.assumption import Assumption
from scalestudy.perf.framework import FRAMEWORK_ASSUMPTIONS, Framework, load_framework

# --- systems (the performance model's presets) ----------------------------------------------

FIT = "perf_fit.yaml"


@lru_cache(maxsize=1)
def fitted() -> dict:
    """The fitted constants of ``data/perf_fit.yaml`` (written by ``scalestudy fit
    --write``): ``{"constants": {name: {value, low, high, source}}, "fit": {...}}``;
    empty when the file is absent."""
    import yaml

    f = resources.files("scalestudy").joinpath("data", FIT)
    return yaml.safe_load(f.read_text()) if f.is_file() else {}


def power_factor(limit_w: float | None, tdp_w: float | None, exponent: float) -> float:
    """``(limit / TDP) ** exponent``: the compute rate of a GPU capped at ``limit_w`` relative
    to the rate at its TDP (``hardware.yaml`` ``gpu.power_exponent``); 1 without a cap."""
    if not limit_w or not tdp_w or limit_w >= tdp_w:
        return 1.0
    return (float(limit_w) / float(tdp_w)) ** exponent


#: The shared GPU constants that are host-side latencies (seconds; slow at their high end).
HOST_LATENCIES = ("kernel_gap_s", "host_sync_s")


def gpu_constants() -> dict:
    """The constants every GPU system shares (``gpu:`` of ``hardware.yaml``), with the fitted
    ones (``perf_fit.yaml``) in place of their ``fitted`` markers: ``{name: Assumption}``."""
    shared = dict(table().get("gpu") or {})
    consts = (fitted().get("constants") or {})
    out = {}
    for k, v in shared.items():
        if v == "fitted":
            v = consts.get(k, 1.0)
        out[k] = Assumption.parse(v, slow="high" if k in HOST_LATENCIES else "low")
    out.setdefault("sustained", Assumption(1.0, 1.0, 1.0))
    out.setdefault("power_exponent", Assumption(0.0, 0.0, 0.0))
    for k in HOST_LATENCIES:
        out.setdefault(k, Assumption(0.0, 0.0, 0.0, slow="high"))
    return out


#: The collectives a ring runs (``ring_steps``); any other call (send/recv) is one transfer.
RING_OPS = ("all_reduce", "all_gather", "reduce_scatter")


def ring_steps(op: str, ranks: int) -> int:
    """Steps of a ring ``op`` among ``ranks`` (NVIDIA/nccl ``src/graph/tuning.cc``,
    ``ncclTopoTuneModel``: ``nsteps = 2 * (nRanks - 1)`` for an all-reduce, ``nRanks - 1`` for
    an all-gather or a reduce-scatter); 0 for one rank."""
    if op not in RING_OPS:
        raise ValueError(f"op={op!r} is not a ring collective; use one of {', '.join(RING_OPS)}")
    k = max(0, int(ranks) - 1)
    return 2 * k if op == "all_reduce" else k


@dataclass(frozen=True)
class CollectiveLatency:
    """The latency of one collective as the collective library prices it (seconds), Simple
    protocol: a base per call plus a hardware latency per step, a step inside a node at the
    intra-node link's figure and a step between nodes at the network's. NCCL's model (NVIDIA/nccl
    ``src/graph/tuning.cc``, ``ncclTopoTuneModel``), RCCL's the same with its own figures
    (``hardware.yaml`` ``collectives``). Ring: ``baseLat + (nsteps - nInterSteps) · intraLat +
    nInterSteps · interLat``, ``nInterSteps`` the ring's steps among the nodes; tree (all-reduce
    only): ``baseLat + 2 · ((nRanks / nNodes - 1) · intraLat + log2(nNodes) · interLat)``."""

    base_s: float
    intra_step_s: float
    inter_step_s: float
    tree_base_s: float
    tree_intra_s: float
    tree_inter_s: float

    def ring(self, op: str, ranks: int, nodes: int = 1) -> float:
        """Seconds of latency of one ring ``op`` among ``ranks`` spread over ``nodes`` nodes
        (at most one node per rank)."""
        steps = ring_steps(op, ranks)
        inter = ring_steps(op, min(max(1, int(nodes)), int(ranks)))
        return self.base_s + (steps - inter) * self.intra_step_s + inter * self.inter_step_s

    def tree_all_reduce(self, ranks: int, nodes: int = 1) -> float:
        """Seconds of latency of one tree all-reduce among ``ranks`` on ``nodes`` nodes: up and
        down a chain of ``ranks / nodes`` ranks per node and a tree of ``log2(nodes)`` levels."""
        nodes = min(max(1, int(nodes)), int(ranks))
        return self.tree_base_s + 2 * ((int(ranks) // nodes - 1) * self.tree_intra_s
                                       + int(math.log2(nodes)) * self.tree_inter_s)

    def scalar_all_reduce(self, ranks: int, nodes: int = 1) -> float:
        """Seconds of an all-reduce too small for its bytes to matter (a norm): the library
        picks the algorithm of least latency, ring or tree."""
        return min(self.ring("all_reduce", ranks, nodes), self.tree_all_reduce(ranks, nodes))


@dataclass(frozen=True)
class Link:
    """A communication path: ``bandwidth`` in bytes/s per direction per device, ``latency``
    in seconds per call, ``bandwidth_pair`` (optional) for groups of two, ``library`` (a GPU
    system's collective library, ``CollectiveLatency``): the latency of a ring collective grows
    with its ranks and nodes; without one (a CPU host, a measured spec) every call costs
    ``latency``, as does a send/recv everywhere."""

    bandwidth: float
    latency: float
    bandwidth_pair: float | None = None
    library: CollectiveLatency | None = None

    def call_latency(self, op: str, ranks: int, nodes: int = 1) -> float:
        """Seconds of latency of one ``op`` among ``ranks`` on ``nodes`` nodes: the library's
        ring latency for a ring collective where the link has one, else ``latency``."""
        if self.library is not None and op in RING_OPS:
            return self.library.ring(op, ranks, nodes)
        return self.latency

    def bw(self, group: int, adjacent: bool = True) -> float:
        """Bandwidth for a group of ``group`` ranks; ``adjacent``: consecutive devices (the
        pair bandwidth applies to two adjacent devices only, e.g. the GCDs of one MI250X)."""
        if group == 2 and adjacent and self.bandwidth_pair:
            return self.bandwidth_pair
        return self.bandwidth

    def scaled(self, bandwidth: float) -> "Link":
        """The same link at ``bandwidth`` (the pair bandwidth scales in proportion)."""
        f = bandwidth / self.bandwidth
        return Link(bandwidth, self.latency,
                    None if self.bandwidth_pair is None else self.bandwidth_pair * f, self.library)


#: The assumptions a system may declare, and which field of HardwareSpec each sets.
SPEC_ASSUMPTIONS = ("gemm_efficiency", "gemm_quantisation", "attention_efficiency",
                    "mem_bw_efficiency", "intra_bandwidth", "inter_bandwidth", "sustained",
                    "kernel_gap_s", "host_sync_s")


@dataclass(frozen=True)
class HardwareSpec:
    """A device, its interconnect and the framework that drives it. Rates in FLOP/s and
    bytes/s, sizes in bytes. Uncertain inputs hold their central value here; their stated
    ranges are in ``assumptions`` (``with_assumption`` / ``scenarios`` move them).

    ``matmul_efficiency``: the fraction of peak large GEMMs reach on one device at their best
    shape (the same kind of figure for every GPU); ``sustained``: the fraction of that ceiling
    (and of the attention kernel's rate) a training run sustains with every device busy (one
    constant for every GPU system, ``data/perf_fit.yaml``; 1 on a measured CPU host);
    ``kernel_gap_s``: the idle time between two dependent kernels on a GPU stream (seconds per
    launch); ``host_sync_s``: a value read back to the host, the GPU idle meanwhile (seconds
    per round trip); ``host_bandwidth``: a device's link to the host (bytes/s; None: not
    declared); ``power_factor``: the clock a fully loaded device holds over the boost clock its
    peak assumes (the device's documented ``sustained_clock``, 1 where none is documented),
    times the rate at the system's power limit over the rate at TDP (``power_limit_w``,
    ``gpu.power_exponent``); ``gemm_tile`` (M×N of a
    thread-block tile) and ``multiprocessors`` (SMs / CUs) add tile and wave quantisation to
    smaller products (``gemm_quantisation``: the fraction of that loss applied, 1 = all);
    ``attention_efficiency``: the fused attention kernel's rate as a fraction of peak (None:
    the attention products run as GEMMs); ``mem_bw_efficiency``: the fraction of ``mem_bw``
    memory-bound kernels reach."""

    name: str
    device: str
    devices_per_node: int
    peak_flops: dict
    memory_bytes: float
    mem_bw: float
    matmul_efficiency: float
    intra: Link
    inter: Link | None = None
    source: str = ""
    overhead: dict = field(default_factory=dict)
    compute_units: int | None = None  # cores a CPU node's processes share; None: one per device
    gemm_tile: tuple | None = None
    multiprocessors: int | None = None
    gemm_quantisation: float = 1.0
    attention_efficiency: float | None = None
    mem_bw_efficiency: float = 1.0
    sustained: float = 1.0
    kernel_gap_s: float = 0.0
    host_sync_s: float = 0.0
    host_bandwidth: float | None = None
    power_factor: float = 1.0
    framework: Framework = field(default_factory=Framework)
    assumptions: dict = field(default_factory=dict)

    def peak(self, dtype: str) -> float:
        if dtype not in self.peak_flops:
            raise ValueError(f"hardware {self.name!r} declares no peak for {dtype!r}; add "
                             "peak_tflops to its description")
        return float(self.peak_flops[dtype])

    def with_assumption(self, name: str, value: float) -> "HardwareSpec":
        """This spec with assumption ``name`` set to ``value``."""
        if name in FRAMEWORK_ASSUMPTIONS:
            return replace(self, framework=replace(self.framework, **{name: float(value)}))
        if name == "gemm_efficiency":
            return replace(self, matmul_efficiency=float(value))
        if name == "intra_bandwidth":
            return replace(self, intra=self.intra.scaled(float(value)))
        if name == "inter_bandwidth":
            return replace(self, inter=self.inter.scaled(float(value)) if self.inter else None)
        if name in SPEC_ASSUMPTIONS:
            return replace(self, **{name: float(value)})
        raise ValueError(f"unknown assumption {name!r}")

    def at(self, ends: dict) -> "HardwareSpec":
        """This spec with each named assumption at an end (``low``/``high``/``slow``/
        ``fast``/``value``)."""
        hw = self
        for name, which in ends.items():
            hw = hw.with_assumption(name, self.assumptions[name].end(which))
        return hw

    def with_framework(self, name: str) -> "HardwareSpec":
        """This spec driven by another framework of ``hardware.yaml``."""
        fw, assume = load_framework(name)
        keep = {k: v for k, v in self.assumptions.items() if k not in FRAMEWORK_ASSUMPTIONS}
        return replace(self, framework=fw, assumptions={**keep, **assume})

    def scenarios(self) -> list[tuple[str, "HardwareSpec"]]:
        """``[(label, spec), ...]``: the central spec; every uncertain assumption at its slow
        end, at its fast end; and each one alone at either end of its range (the others
        central). A prediction's range is the envelope over these."""
        varied = [k for k, a in self.assumptions.items() if a.low != a.high]
        out = [("central", self)]
        if not varied:
            return out
        out.append(("all slow", self.at({k: "slow" for k in varied})))
        out.append(("all fast", self.at({k: "fast" for k in varied})))
        for k in varied:
            out.append((f"{k} low", self.at({k: "low"})))
            out.append((f"{k} high", self.at({k: "high"})))
        return out

    @classmethod
    def from_dict(cls, d: dict, name: str, source: str = "") -> "HardwareSpec":
        """A system entry of ``hardware.yaml`` (or a YAML file of the same form). Its device's
        peaks, memory and bandwidth come from the devices table unless it declares them."""
        dev = devices().get(d.get("device") or "", {})
        for key in ("devices_per_node", "intra_node"):
            if key not in d:
                raise ValueError(f"hardware {name!r}: {key} is missing")
        peaks = d.get("peak_tflops") or dev.get("peak_tflops")
        mem = d.get("memory_gb") or dev.get("memory_gb")
        if not peaks or mem is None:
            raise ValueError(f"hardware {name!r}: device {d.get('device')!r} is not in the "
                             "devices table; declare peak_tflops and memory_gb")
        assume: dict = {}

        def take(key: str, x, slow: str = "low") -> float:
            a = Assumption.parse(x, slow)
            if a.low != a.high or a.source:
                assume[key] = a
            return a.value

        library = collective_latency(d, name)

        def link(x, key):
            if not x:
                return None
            bw = take(key, x["bandwidth"])
            return Link(bw, float(x.get("latency", 0.0)),
                        float(x["bandwidth_pair"]) if x.get("bandwidth_pair") else None, library)

        gemm = d.get("gemm") or {}
        if "matmul_efficiency" in d and "efficiency" not in gemm:
            gemm = {**gemm, "efficiency": d["matmul_efficiency"]}
        eff = take("gemm_efficiency", gemm.get("efficiency", 1.0))
        tile = tuple(int(t) for t in gemm["tile"]) if gemm.get("tile") else None
        quant = take("gemm_quantisation", gemm.get("quantisation", 1.0), slow="high")
        att = d.get("attention") or {}
        att_eff = take("attention_efficiency", att["efficiency"]) if "efficiency" in att else None
        fw, fw_assume = load_framework(str(d.get("framework", "torch")))
        spec = cls(
            name=name, device=str(d.get("device") or name),
            devices_per_node=int(d["devices_per_node"]),
            peak_flops={k: float(v) * 1e12 for k, v in peaks.items()},
            memory_bytes=float(mem) * 1e9,
            mem_bw=float(d.get("mem_bw") or dev.get("mem_bw") or 1e12),
            host_bandwidth=float(d["host_bandwidth"]) if d.get("host_bandwidth") else None,
            matmul_efficiency=eff,
            intra=link(d["intra_node"], "intra_bandwidth"),
            inter=link(d.get("inter_node"), "inter_bandwidth"), source=source,
            overhead={k: float(v) for k, v in (d.get("overhead") or {}).items()},
            compute_units=int(d["compute_units"]) if d.get("compute_units") else None,
            gemm_tile=tile,
            multiprocessors=int(dev["multiprocessors"]) if tile and dev.get("multiprocessors") else None,
            gemm_quantisation=quant,
            attention_efficiency=att_eff,
            mem_bw_efficiency=take("mem_bw_efficiency", d.get("mem_bw_efficiency", 1.0)),
            framework=fw,
        )
        if dev:  # a GPU of the devices table: the constants every GPU system shares
            shared = gpu_constants()
            spec = replace(spec, sustained=take("sustained", shared["sustained"]),
                           kernel_gap_s=take("kernel_gap_s", shared["kernel_gap_s"], slow="high"),
                           host_sync_s=take("host_sync_s", shared["host_sync_s"], slow="high"),
                           power_factor=float(dev.get("sustained_clock", 1.0)) * power_factor(
                               d.get("power_limit_w"), dev.get("tdp_w"),
                               shared["power_exponent"].value))
        return replace(spec, assumptions={**assume, **fw_assume})

    @classmethod
    def load(cls, name_or_path: str) -> "HardwareSpec":
        """A system of ``hardware.yaml`` by name, or a YAML file describing one."""
        import yaml

        p = Path(name_or_path)
        if p.suffix in (".yaml", ".yml") and p.exists():
            d = yaml.safe_load(p.read_text())
            return cls.from_dict(d, str(d.get("name") or p.stem), source=str(p))
        systems = table()["systems"]
        if name_or_path not in systems:
            raise ValueError(f"--hardware {name_or_path!r}: no such preset; use one of "
                             f"{', '.join(presets())} or a path to a YAML file")
        return cls.from_dict(systems[name_or_path], name_or_path,
                             source=f"preset {name_or_path}")


def collective_latency(system: dict, name: str = "") -> CollectiveLatency | None:
    """The latency model of a system entry's collective library (its ``collectives``, an
    entry of ``hardware.yaml`` ``collectives:``): base latencies and the step latencies of its
    intra-node link's ``type`` and of its inter-node link's (``net`` when it declares none);
    None for a system that names no library (a CPU host: gloo, whose calls cost the measured
    ``latency``)."""
    lib_name = system.get("collectives")
    if not lib_name:
        return None
    libs = table().get("collectives") or {}
    if lib_name not in libs:
        raise ValueError(f"hardware {name!r}: collectives {lib_name!r} is not an entry of "
                         f"hardware.yaml collectives ({', '.join(sorted(libs))})")
    lib = libs[lib_name]
    kinds = ((system.get("intra_node") or {}).get("type"),
             (system.get("inter_node") or {}).get("type", "net"))
    steps = []
    for table_key in ("ring_step_s", "tree_step_s"):
        for kind in kinds:
            if kind not in lib[table_key]:
                raise ValueError(f"hardware {name!r}: link type {kind!r} has no {table_key} in "
                                 f"collectives {lib_name!r} ({', '.join(sorted(lib[table_key]))})")
            steps.append(float(lib[table_key][kind]))
    return CollectiveLatency(float(lib["ring_base_s"]), steps[0], steps[1],
                             float(lib["tree_base_s"]), steps[2], steps[3])


def presets() -> list[str]:
    """Names of the systems in ``hardware.yaml``."""
    return sorted(table()["systems"])
