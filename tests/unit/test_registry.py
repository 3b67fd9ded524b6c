"""The aggregator registry: what flags, defaults and architectures derive from, and the worked example
of adding an aggregator (docs/extending.md)."""

import dataclasses

import pytest

from fairseq_capsagg.aggregators import (AGGREGATORS, AggregationConfigError, LayerAggregator, Settings,
                                         aggregation_choices, architecture_defaults, build_aggregator,
                                         dense_connection_choices, families,
                                         register_aggregator, setting, settings_classes)
from fairseq_capsagg.models import ARCHITECTURES
from fairseq_capsagg.models.aggregating_stack import AggregationPlan
from fairseq_capsagg.models.build import model_args
from fairseq_capsagg.models.capsagg_transformer import aggregation_fields
from helpers import build_tiny_model, parse_model_args


def test_choices_families_and_architectures_come_from_the_registry():
    assert aggregation_choices() == ["none", "linear", "dynamic", "dynamic-routing", "em-routing",
                                     "dwa", "depth-attention", "mudd", "dlcl"]  # the residual streams connect blocks only
    assert dense_connection_choices() == ["none", "dwa", "depth-attention", "mudd", "dlcl", "hyper-connections", "mhc"]
    assert families() == {"linagg": "linear", "dyncomb": "dynamic", "dynrouting": "dynamic-routing",
                          "emrouting": "em-routing", "dwa": "dwa", "depthattn": "depth-attention", "mudd": "mudd",
                          "dlcl": "dlcl", "hc": "hyper-connections", "mhc": "mhc"}
    assert sorted(ARCHITECTURES) == sorted(f"transformer_{f}_{s}" for f in families() for s in ("base", "big", "small"))


def test_every_setting_is_a_flag_with_its_default():
    """A field's name is its flag and its namespace attribute; the architecture fills its default."""
    args = parse_model_args("transformer_emrouting_small")
    for field in aggregation_fields():
        if field.name == "output_capsules":
            continue  # the tiny shape sets it
        assert getattr(args, field.name) == field.default, field.name
    assert {f.name for cls in settings_classes() for f in dataclasses.fields(cls)} <= {f.name for f in aggregation_fields()}


def test_flags_reach_the_aggregator_by_name():
    flags = ["--aggregation-ffn-dim", "7", "--linear-combination-weights", "matrix"]
    args = parse_model_args("transformer_dyncomb_small", flags)
    assert args.aggregation_ffn_dim == 7 and args.linear_combination_weights == "matrix"
    model, _ = build_tiny_model("transformer_dyncomb_small", flags)
    assert model.encoder.aggregator.ffn_dim == 7 and model.decoder.aggregator.side == "decoder"
    linear, _ = build_tiny_model("transformer_linagg_small", flags)
    assert linear.encoder.aggregator.weights == "matrix"


def test_aggregators_receive_their_settings_never_the_namespace():
    args = parse_model_args("transformer_dyncomb_small", ["--aggregation-ffn-dim", "7"])
    plan = AggregationPlan.from_args(args)
    assert type(plan.encoder.output.settings).__name__ == "DynamicCombinationSettings"
    assert plan.encoder.output.settings.aggregation_ffn_dim == 7 and plan.decoder.dense is None
    with pytest.raises(AggregationConfigError, match=r"unknown aggregation settings \['encoder_layers'\]"):
        build_aggregator("dynamic", 16, 3, {"encoder_layers": 6})  # a model flag is no aggregator setting


def test_a_misspelt_setting_is_refused():
    with pytest.raises(AggregationConfigError, match=r"unknown aggregation settings \['output_capsule'\]"):
        build_aggregator("em-routing", 16, 3, {"output_capsule": 4})


def test_names_and_flags_are_registered_once():
    taken = AGGREGATORS["linear"]

    class Again(LayerAggregator):
        name = "linear"

    with pytest.raises(ValueError, match="registered twice"):
        register_aggregator(Again)

    @dataclasses.dataclass
    class Clashing(Settings):
        routing_iters: int = setting(5, "another meaning")

    class Other(LayerAggregator):
        name = "other-clashing"
        Settings = Clashing

    with pytest.raises(ValueError, match="--routing-iters is defined twice"):
        register_aggregator(Other)
    assert AGGREGATORS["linear"] is taken and "other-clashing" not in AGGREGATORS


def test_an_architecture_sets_its_familys_settings_a_flag_away(monkeypatch):
    """A family's architectures may give a shared flag another value than its default (dynamic routing's capsule
    count, not EM routing's); the command line still wins, and other families keep the flag's default."""
    routing = AGGREGATORS["dynamic-routing"]
    monkeypatch.setattr(routing, "architecture_settings", {"output_capsules": 4})

    def capsules(arch, *flags):
        return model_args(arch, list(flags), data="unused-data").output_capsules

    assert capsules("transformer_dynrouting_small") == 4
    assert capsules("transformer_dynrouting_small", "--output-capsules", "2") == 2
    assert capsules("transformer_emrouting_small") is None  # d, the flag's default
    assert architecture_defaults("dynrouting")["output_capsules"] == 4
    assert architecture_defaults("emrouting")["output_capsules"] is None

    class Misnamed(LayerAggregator):
        name = "misnamed"
        architecture_settings = {"output_capsule": 4}

    with pytest.raises(ValueError, match=r"architecture_settings: \['output_capsule'\] are not its settings"):
        register_aggregator(Misnamed)
    assert "misnamed" not in AGGREGATORS
