"""The aggregator registry: what flags, defaults and architectures derive from, and the worked example
of adding an aggregator (docs/extending.md)."""

import dataclasses
import os
import re
import shutil
import subprocess
import sys

import pytest

from fairseq_capsagg import USER_DIR
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
from helpers import ROOT, parse_model_args


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


def worked_example():
    """The two code blocks of docs/extending.md's worked example."""
    guide = (ROOT / "docs" / "extending.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", guide, flags=re.S)
    assert len(blocks) == 2
    return blocks


@pytest.mark.slow
def test_the_worked_example_adds_an_aggregator(tmp_path, tiny_data_bin):
    """One new file and one import line give the flags, the architectures, the systems and the errors."""
    module, import_line = worked_example()
    package = tmp_path / "fairseq_capsagg"
    shutil.copytree(USER_DIR, package, ignore=shutil.ignore_patterns("__pycache__"))
    (package / "aggregators" / "layer_mean.py").write_text(module)
    init = package / "aggregators" / "__init__.py"
    init.write_text(init.read_text().replace("from .em_routing import EMRouting\n",
                                             "from .em_routing import EMRouting\n" + import_line))
    code = r'''
import sys
sys.path.insert(0, sys.argv[1])
import fairseq_capsagg, torch
from fairseq import options
from fairseq.data import Dictionary
from types import SimpleNamespace
assert fairseq_capsagg.USER_DIR.startswith(sys.argv[2])
from fairseq_capsagg.models import CapsAggTransformerModel
from fairseq_capsagg.pipeline import fairseq_runs
from fairseq_capsagg.tools.param_count import count_parameters
from flops import aggregator_macs
args = options.parse_args_and_arch(options.get_training_parser(), ["x", "--task", "translation",
    "--user-dir", fairseq_capsagg.USER_DIR, "--arch", "transformer_layermean_small", "--layer-mean-scale", "0.5"])
d = Dictionary()
model = CapsAggTransformerModel.build_model(args, SimpleNamespace(source_dictionary=d, target_dictionary=d))
agg = model.encoder.aggregator
layers = [torch.randn(3, 2, 128) for _ in range(6)]
torch.testing.assert_close(agg(layers), 0.5 * torch.stack(layers).mean(0))
assert "layermean" in fairseq_runs.systems() and fairseq_runs.label("layermean") == "+ Layer Mean"
assert aggregator_macs("layer-mean", 128, 6, 128) == 6 * 128
assert count_parameters("transformer_layermean_small", 100, ["--aggregation-layer-norm", "off"]) == \
    count_parameters("transformer_linagg_small", 100, ["--encoder-aggregation", "none", "--decoder-aggregation", "none"])
print("ok")
'''
    env = dict(os.environ, PYTHONPATH=str(tmp_path), PYTHONWARNINGS="ignore")
    result = subprocess.run([sys.executable, "-c", code, str(ROOT / "benchmarks"), str(package)], capture_output=True,
                            text=True, env=env, timeout=300, cwd=tmp_path)
    assert result.returncode == 0 and result.stdout.strip().endswith("ok"), result.stderr[-3000:]
    bad = subprocess.run([str(sys.executable), "-m", "fairseq_cli.train", str(tiny_data_bin), "--user-dir", str(package),
                          "--arch", "transformer_layermean_small", "--layer-mean-scale", "0", "--task", "translation",
                          "--cpu", "--max-tokens", "1000"],
                         capture_output=True, text=True, env=env, timeout=300, cwd=tmp_path)
    assert bad.returncode != 0 and "error: --layer-mean-scale: got 0.0; it must be > 0" in bad.stderr
