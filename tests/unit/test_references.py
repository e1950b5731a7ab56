import pytest

from scalestudy.report import references


def test_frontier_values_as_published():
    # Dash et al. 2024 (arXiv:2312.12705) abstract: weak 100% at 1024 / 3072 GCDs, strong
    # 89.93% / 87.05% (press coverage of the paper; the abstract rounds to 89% / 87%).
    e = references.efficiency_points("frontier_dash2024").set_index(["model", "mode"])
    assert e.loc[("gpt-175b", "weak"), "n"] == 1024 and e.loc[("gpt-175b", "weak"), "efficiency"] == 1.0
    assert e.loc[("gpt-1t", "weak"), "n"] == 3072
    assert e.loc[("gpt-175b", "strong"), "efficiency"] == pytest.approx(0.8993)
    assert e.loc[("gpt-1t", "strong"), "efficiency"] == pytest.approx(0.8705)
    p = references.peak_fraction_points("frontier_dash2024").set_index("model")
    assert p.loc["gpt-1t", "fraction"] == pytest.approx(0.3196)
    # TFLOPS per GCD = fraction x 191.5 (the MI250X-GCD bf16 peak in data/hardware.yaml)
    from scalestudy.config import devices

    assert devices.resolve_peak("MI250X-GCD", "bf16")[1] == 191.5e12
    raw = references.load("frontier_dash2024").set_index("model")
    assert (raw["pct_of_peak"] / 100 * 191.5).tolist() == pytest.approx(raw["tflops_per_device"].tolist(), abs=0.05)


def test_megatron_table_and_configs_load():
    m = references.load("megatron_sc21")
    assert len(m) == 10 and m["gpus"].max() == 3072
    e = references.efficiency_points("megatron_sc21")
    assert e["efficiency"].iloc[0] == 1.0 and (e["mode"] == "weak").all()
    assert len(references.load("frontier_dash2024_configs")) >= 1


def test_unknown_reference_names_the_allowed_ones():
    with pytest.raises(ValueError, match="references: 'nope'.*frontier_dash2024"):
        references.efficiency_points("nope")


def test_every_reference_a_study_may_list_is_shipped():
    # the words a study may list (config.vocab.Reference, the schema's enum) are the ones
    # this module can overlay
    from scalestudy.config.vocab import Reference

    assert set(references.REFERENCES) == set(Reference)
    for name in Reference:
        assert len(references.efficiency_points(name)) > 0
        assert len(references.peak_fraction_points(name)) > 0
