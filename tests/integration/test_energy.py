"""Energy counters (scalestudy.train.energy): RAPL against a fake powercap tree, NVML and AMD SMI
against stubs of their Python modules, the per-step record, its summary, the runs.csv columns and
summary.md's reason when nothing was measured; then one real run whose ranks read a fake RAPL
counter that their own step hook advances (``tests/fake_rapl.py``: tied to steps, not to a
clock or a thread; the real NVML path needs a GPU: not here)."""

from __future__ import annotations

import json
import os
import sys
import types
from pathlib import Path

import pandas as pd
import pytest

import fake_rapl

from scalestudy.analysis import aggregate
from scalestudy.report import summary
from scalestudy.train import energy

TESTS = Path(__file__).resolve().parents[1]


def powercap(root: Path, zones: dict[str, tuple[str, int, int]]) -> Path:
    """A fake /sys/class/powercap: zone -> (name, energy_uj, max_energy_range_uj)."""
    for zone, (name, uj, rng) in zones.items():
        z = root / zone
        z.mkdir(parents=True)
        (z / "name").write_text(name + "\n")
        (z / "energy_uj").write_text(f"{uj}\n")
        (z / "max_energy_range_uj").write_text(f"{rng}\n")
    return root


def set_uj(root: Path, zone: str, uj: int) -> None:
    (root / zone / "energy_uj").write_text(f"{uj}\n")


def test_rapl_sums_packages_only_and_survives_a_wrap(tmp_path):
    root = powercap(tmp_path, {
        "intel-rapl:0": ("package-0", 1_000_000, 10_000_000),
        "intel-rapl:0:0": ("core", 500_000, 10_000_000),      # inside package 0
        "intel-rapl:1": ("package-1", 2_000_000, 10_000_000),
        "intel-rapl:2": ("psys", 9_000_000, 10_000_000),     # the platform: counts the packages again
        "intel-rapl-mmio:0": ("package-0", 1_000_000, 10_000_000),  # same package via MMIO
    })
    r = energy.RaplReader(root)
    assert [z.name for z in r.zones] == ["intel-rapl:0", "intel-rapl:1"]
    assert (r.source, r.scope) == ("rapl", "host")
    assert r.read() == 0.0
    set_uj(root, "intel-rapl:0", 1_500_000)
    set_uj(root, "intel-rapl:0:0", 9_000_000)  # ignored
    set_uj(root, "intel-rapl:1", 2_250_000)
    assert r.read() == pytest.approx(0.75)
    set_uj(root, "intel-rapl:0", 100_000)       # wrapped: +10 J range
    assert r.read() == pytest.approx(0.75 + (10_000_000 - 1_500_000 + 100_000) * 1e-6)


def test_rapl_unavailable_says_why(tmp_path, monkeypatch):
    with pytest.raises(energy.EnergyUnavailable, match="does not exist"):
        energy.RaplReader(tmp_path / "none")
    with pytest.raises(energy.EnergyUnavailable, match="no RAPL package zone"):
        energy.RaplReader(powercap(tmp_path / "a", {"dtpm": ("dtpm", 1, 1)}))
    root = powercap(tmp_path / "b", {"intel-rapl:0": ("package-0", 1, 10)})
    if os.geteuid() != 0:  # root reads a mode-000 file anyway
        os.chmod(root / "intel-rapl:0" / "energy_uj", 0)
        with pytest.raises(energy.EnergyUnavailable, match="needs root"):
            energy.RaplReader(root)
    monkeypatch.setenv("SCALESTUDY_POWERCAP", str(tmp_path / "none"))
    reader, why = energy.open_reader("cpu")
    assert reader is None and "does not exist" in why
    monkeypatch.setenv("SCALESTUDY_ENERGY", "off")
    assert energy.open_reader("cpu") == (None, "energy recording switched off (SCALESTUDY_ENERGY=off)")
    monkeypatch.setenv("SCALESTUDY_ENERGY", "watts")
    assert "not one of" in energy.open_reader("cpu")[1]


class _NVMLError(Exception):
    pass


def nvml_stub(mj: list[int], by_uuid: bool = True) -> types.ModuleType:
    """A stand-in for nvidia-ml-py's ``pynvml``: a counter in mJ that the test advances."""
    m = types.ModuleType("pynvml")
    m.NVMLError = _NVMLError
    m.calls = []
    m.nvmlInit = lambda: m.calls.append("init")

    def by_uuid_fn(uuid):
        m.calls.append(("uuid", uuid))
        if not by_uuid:
            raise _NVMLError("not found")
        return "h-uuid"

    def by_index(i):
        m.calls.append(("index", i))
        return f"h{i}"
    m.nvmlDeviceGetHandleByUUID = by_uuid_fn
    m.nvmlDeviceGetHandleByIndex = by_index
    m.nvmlDeviceGetTotalEnergyConsumption = lambda h: mj[0]
    return m


def test_nvml_reads_the_ranks_gpu_in_joules(monkeypatch):
    mj = [5_000]
    stub = nvml_stub(mj)
    monkeypatch.setitem(sys.modules, "pynvml", stub)
    r = energy.NvmlReader(0, uuid="GPU-1234")
    assert (r.source, r.scope) == ("nvml", "device") and ("uuid", "GPU-1234") in stub.calls
    assert r.read() == pytest.approx(5.0)
    mj[0] = 7_500
    assert r.read() == pytest.approx(7.5)
    # no UUID match: the physical index behind CUDA_VISIBLE_DEVICES
    stub = nvml_stub(mj, by_uuid=False)
    monkeypatch.setitem(sys.modules, "pynvml", stub)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,5")
    energy.NvmlReader(1, uuid="GPU-x")
    assert ("index", 5) in stub.calls
    # auto on a CUDA device picks NVML
    monkeypatch.setenv("SCALESTUDY_ENERGY", "auto")
    reader, why = energy.open_reader("cuda", 0)
    assert why is None and reader.source == "nvml"


def test_nvml_missing_or_failing_is_a_reason(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", None)  # import fails
    reader, why = energy.open_reader("cuda", 0)
    assert reader is None and "nvidia-ml-py" in why and "not installed" in why
    stub = nvml_stub([0])

    def no_counter(h):
        raise _NVMLError("Not Supported")
    stub.nvmlDeviceGetTotalEnergyConsumption = no_counter
    monkeypatch.setitem(sys.modules, "pynvml", stub)
    reader, why = energy.open_reader("cuda", 0)
    assert reader is None and why == "NVML energy counter not readable: Not Supported"


def test_amdsmi_stub(monkeypatch):
    m = types.ModuleType("amdsmi")
    m.AmdSmiException = type("AmdSmiException", (Exception,), {})
    m.amdsmi_init = lambda: None
    m.amdsmi_get_processor_handles = lambda: ["g0", "g1"]
    count = {"energy_accumulator": 1000, "counter_resolution": 15.3}
    m.amdsmi_get_energy_count = lambda h: dict(count)
    monkeypatch.setitem(sys.modules, "amdsmi", m)
    monkeypatch.setenv("SCALESTUDY_ENERGY", "amdsmi")
    reader, why = energy.open_reader("cuda", 1)
    assert why is None and (reader.source, reader.handle) == ("amdsmi", "g1")
    assert reader.read() == pytest.approx(1000 * 15.3e-6)


def test_step_energy_and_summary_count_a_host_once(tmp_path):
    root = powercap(tmp_path, {"intel-rapl:0": ("package-0", 0, 10**12)})
    ranks = []
    for _ in range(2):  # two ranks on one host read the same package
        m = energy.StepEnergy(energy.RaplReader(root))
        ranks.append(m)
    uj = 0
    for step in range(4):
        for m in ranks:
            m.mark(step)
        uj += 2_000_000  # 2 J per step for the whole package
        set_uj(root, "intel-rapl:0", uj)
    for m in ranks:
        m.mark()
    recs = [m.record() for m in ranks]
    assert recs[0]["j"] == pytest.approx([2.0] * 4) and len(recs[0]["s"]) == 4
    per_step, s = energy.summarize(recs, steps=4, warmup=1, tokens_per_step=100)
    assert [p["energy_j"] for p in per_step] == pytest.approx([2.0] * 4)  # once per host
    assert per_step[0]["rank_energy_j"] == pytest.approx([2.0, 2.0])
    assert s["source"] == "rapl" and s["joules_steady"] == pytest.approx(6.0)
    assert s["joules_per_token"] == pytest.approx(6.0 / 300)
    assert s["avg_power_w"] > 0 and "once per host" in s["note"]
    # device counters add up over ranks
    dev = [{"source": "nvml", "scope": "device", "host": "h", "j": [1.0, 3.0], "s": [0.5, 0.5]},
           {"source": "nvml", "scope": "device", "host": "h", "j": [1.0, 1.0], "s": [0.5, 0.5]}]
    per_step, s = energy.summarize(dev, steps=2, warmup=1, tokens_per_step=10)
    assert per_step[1]["energy_j"] == 4.0 and s["joules_per_token"] == pytest.approx(0.4)
    assert s["avg_power_w"] == pytest.approx(3.0 / 0.5 + 1.0 / 0.5)
    # one rank without a counter: no numbers at all, the reason
    _, s = energy.summarize([dev[0], {"source": None, "reason": "no NVML"}], 2, 1, 10)
    assert s == {"source": None, "reason": "rank 1 has no energy readings: no NVML"}
    _, s = energy.summarize([{"source": None, "reason": "no RAPL: x"}], 2, 1, 10)
    assert s == {"source": None, "reason": "no RAPL: x"}


def test_runs_csv_columns_and_the_summary_note():
    ok = {"energy": {"source": "nvml", "scope": "device", "joules_per_token": 0.02,
                     "avg_power_w": 650.0, "note": "device energy, summed over 8 device(s)"}}
    assert aggregate.energy_columns(ok) == {"joules_per_token": 0.02, "avg_power_w": 650.0,
                                            "energy_source": "nvml",
                                            "energy_note": "device energy, summed over 8 device(s)"}
    none = aggregate.energy_columns({"energy": {"source": None, "reason": "no RAPL: x"}})
    assert none == {"joules_per_token": None, "avg_power_w": None, "energy_source": None,
                    "energy_note": "no RAPL: x"}
    assert "no energy record" in aggregate.energy_columns({})["energy_note"]
    runs = pd.DataFrame({"status": ["ok", "ok", "oom"], "joules_per_token": [None, None, None],
                         "avg_power_w": [None] * 3, "energy_source": [None] * 3,
                         "energy_note": ["no RAPL: /sys/class/powercap does not exist"] * 2 + [None]})
    note = summary.energy_note(runs)
    assert note.startswith("Energy: `joules_per_token` and `avg_power_w` are empty (never a guess)")
    assert "no RAPL: /sys/class/powercap does not exist" in note
    runs.loc[0, ["joules_per_token", "avg_power_w", "energy_source"]] = [0.02, 650.0, "nvml"]
    assert summary.energy_note(runs).startswith("Energy (nvml): ")


def test_columns_are_appended_and_empty_on_this_host(tiny_study_run):
    """The shared tiny run: no readable counter here, so the columns are empty and say why."""
    _, results, _ = tiny_study_run
    runs = pd.read_csv(results / "tiny" / "runs.csv")
    cols = list(runs.columns)  # appended after the older columns (later ones may follow)
    at = cols.index("joules_per_token")
    assert cols[at:at + 4] == ["joules_per_token", "avg_power_w", "energy_source", "energy_note"]
    assert at > cols.index("workload")
    ok = runs[runs["status"] == "ok"]
    if ok["energy_source"].isna().all():  # no RAPL readable on this machine
        assert ok["joules_per_token"].isna().all() and ok["energy_note"].notna().all()
        assert "Energy: `joules_per_token` and `avg_power_w` are empty" in \
            (results / "tiny" / "summary.md").read_text()


@pytest.mark.timeout(300)
def test_a_real_run_records_energy_per_step_per_rank(tmp_path, monkeypatch):
    """Two ranks under torchrun read a fake RAPL package that advances with the steps, not
    with time: before step i every rank's step hook (``tests/fake_rapl.py``) sets the counter
    to ``counter_uj(i)``, so step i's energy is exactly (i + 1) mJ (the last step's 0: no hook
    follows the meter's read after the loop) on any host, loaded or not. steps.jsonl,
    summary.json and runs.csv carry it, counted once per host."""
    from scalestudy.config.point import Point
    from scalestudy.config.parts import Model
    from scalestudy.config.identity import identify
    from scalestudy.run import runner

    root = powercap(tmp_path / "powercap", {"intel-rapl:0": ("package-0", 0, 2**40)})
    monkeypatch.setenv("SCALESTUDY_POWERCAP", str(root))
    monkeypatch.setenv("SCALESTUDY_ENERGY", "auto")
    monkeypatch.setenv("SCALESTUDY_STEP_HOOK", fake_rapl.HOOK_SPEC)
    monkeypatch.setenv(fake_rapl.FAKE_RAPL_ENV, str(root / "intel-rapl:0" / "energy_uj"))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(
        [str(TESTS), str(TESTS.parent / "src"), *filter(None, [os.environ.get("PYTHONPATH")])]))
    steps, warm = 6, 2
    model = Model(name="m", layers=2, hidden=32, heads=2, seq_len=16, vocab=64)
    point = identify(Point.for_layout(model, dp=2, micro_batch=1, device="cpu", steps=steps,
                                      warmup_steps=warm, series="e", mode="weak", baseline_n=2))
    run_dir = tmp_path / "runs" / point.point_id
    run_dir.mkdir(parents=True)
    (run_dir / "point.json").write_text(point.json_text())
    status = runner.run_point(run_dir / "point.json", run_dir)
    assert status["state"] == "ok", status
    lines = [json.loads(x) for x in (run_dir / "steps.jsonl").read_text().splitlines()]
    want = [fake_rapl.step_energy_j(i, steps) for i in range(steps)]
    assert want[:2] == [0.001, 0.002] and want[-1] == 0.0
    exact = {"rel": 1e-9, "abs": 1e-15}  # (µJ counts summed as floats)
    # one host: the package is counted once, not once per rank; both ranks read the same
    assert [s["energy_j"] for s in lines] == pytest.approx(want, **exact)
    assert all(len(s["rank_energy_j"]) == 2 for s in lines)
    assert [r for s in lines for r in s["rank_energy_j"]] == pytest.approx(
        [w for w in want for _ in range(2)], **exact)
    e = json.loads((run_dir / "summary.json").read_text())["energy"]
    assert e["source"] == "rapl" and e["scope"] == "host" and e["counted_ranks"] == [0]
    steady = sum(want[warm:])
    assert e["joules_steady"] == pytest.approx(steady, **exact)
    tokens = point.tokens_per_step * (steps - warm)
    assert e["joules_per_token"] == pytest.approx(steady / tokens, **exact)
    assert e["avg_power_w"] > 0
    row = aggregate.energy_columns(json.loads((run_dir / "summary.json").read_text()))
    assert row["energy_source"] == "rapl" and row["joules_per_token"] == e["joules_per_token"]
