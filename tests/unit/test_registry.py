"""The aggregator registry: what flags, defaults and architectures derive from, and the worked example
of adding an aggregator (docs/extending.md)."""

import dataclasses
import pytest
from fairseq_capsagg.aggregators import (
    AGGREGATORS,
    AggregationConfigError,
    LayerAggregator,
    Settings,
    aggregation_choices,
    build_aggregator,
    dense_connection_choices,
    families,
    register_aggregator,
    setting,
    settings_classes,
)
from fairseq_capsagg.models import ARCHITECTURES
from fairseq_capsagg.models.capsagg_transformer import aggregation_fields
from helpers import parse_model_args


def test_choices_families_and_architectures_come_from_the_registry():
    assert aggregation_choices() == ["none", "linear", "dynamic", "dynamic-routing", "em-routing",
                                     "dwa", "depth-attention", "mudd"]
    assert dense_connection_choices() == ["none", "dwa", "depth-attention", "mudd"]
    assert families() == {"linagg": "linear", "dyncomb": "dynamic", "dynrouting": "dynamic-routing",
                          "emrouting": "em-routing", "dwa": "dwa", "depthattn": "depth-attention", "mudd": "mudd"}
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
    args = parse_model_args("transformer_dyncomb_small", ["--aggregation-ffn-dim", "7",
                                                          "--linear-combination-weights", "matrix"])
    assert args.aggregation_ffn_dim == 7 and args.linear_combination_weights == "matrix"
    assert build_aggregator("dynamic", 16, 3, args).ffn_dim == 7
    assert build_aggregator("linear", 16, 3, args).weights == "matrix"
    assert build_aggregator("em-routing", 16, 3, args, side="decoder").side == "decoder"


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
