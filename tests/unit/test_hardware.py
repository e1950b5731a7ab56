import pytest

from scalestudy.config import devices
from scalestudy.perf import framework, hardware
from scalestudy import cli
from scalestudy.commands.calibrate import parse_shape


@pytest.mark.parametrize(
    "name,key,tflops",
    [
        ("NVIDIA H200", "H200-SXM", 989),
        ("NVIDIA H100 80GB HBM3", "H100-SXM5", 989),
        ("NVIDIA H100 PCIe", "H100-PCIe", 756),
        ("NVIDIA A100-SXM4-80GB", "A100-SXM4", 312),
        ("NVIDIA A100-SXM4-40GB", "A100-SXM4", 312),
        ("AMD Instinct MI250X", "MI250X-GCD", 191.5),  # one GCD = one torch device
        ("AMD Instinct MI250X / MI250", "MI250X-GCD", 191.5),
        ("AMD Instinct MI300X", "MI300X", 1307.4),
        ("H200-SXM", "H200-SXM", 989),  # a table key passes through
        ("mi250x-gcd", "MI250X-GCD", 191.5),
    ],
)
def test_resolve_known_devices(name, key, tflops):
    k, peak, source = devices.resolve_peak(name, "bf16")
    assert k == key
    assert peak == pytest.approx(tflops * 1e12)
    assert source


@pytest.mark.parametrize(
    "name", [None, "", "AMD EPYC 7763", "cpu", "NVIDIA H200 NVL", "NVIDIA H100 NVL",
             "NVIDIA A100-PCIE-40GB", "AMD Instinct MI250", "NVIDIA GeForce RTX 4090"]
)
def test_unknown_devices_get_no_peak(name):
    assert devices.resolve_peak(name, "bf16") == (None, None, None)


def test_fp32_on_gpu_gets_no_peak():
    assert devices.resolve_peak("NVIDIA H200", "fp32") == (None, None, None)


def test_bad_dtype_is_an_error():
    with pytest.raises(ValueError, match="dtype='int8'"):
        devices.resolve_peak("NVIDIA H200", "int8")


def test_devices_have_sources_and_frontier_gcd():
    devs = devices.devices()
    assert min(len(d["source"]) for d in devs.values()) > 10
    gcd = devs["MI250X-GCD"]
    assert float(gcd["peak_tflops"][gcd["mfu_dtypes"][0]]) == 191.5  # the first MFU dtype's peak
    # fp32 is an MFU dtype of no GPU (see test_fp32_on_gpu_gets_no_peak)
    assert not any("fp32" in d["mfu_dtypes"] for d in devs.values())


def test_one_hardware_description():
    """devices() and the systems (presets) come from the same data/hardware.yaml: every
    system's device is a device of the table (or a CPU host declaring its own peaks), and
    memory_gb / resolve_peak read the same rows."""
    devs = devices.devices()
    for name in hardware.presets():
        system = devices.table()["systems"][name]
        assert system["device"] in devs or system.get("peak_tflops"), name
    assert devices.memory_gb("NVIDIA H200") == 141 == devs["H200-SXM"]["memory_gb"]
    assert devices.memory_gb("MI250X") == 64
    assert devices.memory_gb("AMD EPYC 7763") is None


def test_a_framework_inherits_what_it_does_not_state(monkeypatch):
    """An entry naming another as ``inherits`` takes its keys, its own winning; a missing or
    circular base is an error."""
    table = {"base": {"fused_qkv": True, "dropout": True, "grad_accumulation": "autograd"},
             "child": {"inherits": "base", "grad_accumulation": "hp_grad_copy"},
             "self": {"inherits": "self"}, "orphan": {"inherits": "none"}}
    monkeypatch.setattr(framework, "frameworks", lambda: table)
    fw, _ = framework.load_framework("child")
    assert (fw.name, fw.fused_qkv, fw.dropout, fw.grad_accumulation) == (
        "child", True, True, "hp_grad_copy")
    for bad in ("self", "orphan"):
        with pytest.raises(ValueError, match="inherits"):
            framework.load_framework(bad)


def test_dp_alternatives_name_other_entries(monkeypatch):
    """A framework's data-parallel alternatives are other entries; Megatron-LM v1's torch
    DDP differs from its local DDP only in the reduction's overlap and buckets."""
    local, _ = framework.load_framework("megatron-lm-2019")
    torch_ddp, _ = framework.load_framework("megatron-lm-2019-torch-ddp")
    assert local.dp_alternatives == ("megatron-lm-2019-torch-ddp",)
    differ = {f for f in vars(local) if getattr(local, f) != getattr(torch_ddp, f)}
    assert differ == {"name", "dp_alternatives", "dp_overlap", "dp_bucket_params"}
    assert (local.dp_overlap, torch_ddp.dp_overlap, torch_ddp.dp_alternatives) == (0.0, 1.0, ())
    table = {"a": {"dp_alternatives": ["b"]}, "b": {}, "bad": {"dp_alternatives": ["nope"]}}
    monkeypatch.setattr(framework, "frameworks", lambda: table)
    assert framework.load_framework("a")[0].dp_alternatives == ("b",)
    with pytest.raises(ValueError, match="dp_alternatives"):
        framework.load_framework("bad")


def test_deepspeed_precisions_are_two_descriptions():
    """The shipped bf16 description differs from the fp16 one only where DeepSpeed's code
    does (BF16_Optimizer: fp32 accumulation, an all-reduce of the gradients)."""
    fp16, _ = framework.load_framework("megatron-deepspeed")
    bf16, _ = framework.load_framework("megatron-deepspeed-bf16")
    differ = {f for f in vars(fp16) if getattr(fp16, f) != getattr(bf16, f)}
    assert differ == {"name", "grad_accumulation", "zero1_all_reduce"}
    assert (bf16.grad_accumulation, bf16.zero1_all_reduce) == ("hp_grad_copy", True)


def test_detect_cpu():
    from scalestudy.train.device import detect_device

    d = detect_device("cpu")
    assert d["device_type"] == "cpu" and d["count"] >= 1 and d["device_name"]
    with pytest.raises(ValueError, match="device_type='tpu'"):
        detect_device("tpu")


def test_calibrate_writes_record(tmp_path):
    from scalestudy.record.io import read_json

    out = tmp_path / "calibration.json"
    assert cli.main(["calibrate", "--device", "cpu", "--dtype", "fp32", "--out", str(out), "--size", "64",
                           "--samples", "3", "--max-seconds", "0.5"]) == 0
    rec = read_json(out)
    for key in ("device_name", "device_type", "host", "dtype", "m", "n", "k", "flops_per_s",
                "samples_flops_per_s"):
        assert key in rec
    assert rec["m"] == rec["n"] == rec["k"] == 64 and rec["dtype"] == "fp32"
    assert rec["flops_per_s"] > 0 and len(rec["samples_flops_per_s"]) == 3
    assert sorted(rec["samples_flops_per_s"])[1] == rec["flops_per_s"]  # the median


def test_calibrate_times_the_studys_own_shapes(tmp_path):
    import argparse

    from scalestudy.record.io import read_json

    out = tmp_path / "calibration.json"
    assert cli.main(["calibrate", "--device", "cpu", "--out", str(out), "--size", "64", "--samples", "3",
                           "--max-seconds", "0.5", "--shapes", "32x16x8", "64x64x64"]) == 0
    shapes = read_json(out)["shapes"]
    assert [(r["m"], r["n"], r["k"]) for r in shapes] == [(32, 16, 8), (64, 64, 64)]
    assert all(r["flops_per_s"] > 0 for r in shapes)
    with pytest.raises(argparse.ArgumentTypeError, match="use MxNxK"):
        parse_shape("64x64")
