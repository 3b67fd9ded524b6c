"""docs/extending.md's worked example: one new file and one import line give the flags, the architectures,
the systems and the errors."""

import os
import re
import shutil
import subprocess
import sys

from helpers import ROOT

from fairseq_capsagg import USER_DIR


def worked_example():
    """The two code blocks of docs/extending.md's worked example."""
    guide = (ROOT / "docs" / "extending.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", guide, flags=re.S)
    assert len(blocks) == 2
    return blocks


def test_the_worked_example_adds_an_aggregator(tmp_path, tiny_data_bin):
    """One new file and one import line give the flags, the architectures, the systems and the errors."""
    module, import_line = worked_example()
    package = tmp_path / "fairseq_capsagg"
    shutil.copytree(USER_DIR, package, ignore=shutil.ignore_patterns("__pycache__"))
    (package / "aggregators" / "methods" / "layer_mean.py").write_text(module)
    init = package / "aggregators" / "__init__.py"
    anchor = "from .methods.em_routing import EMRouting\n"
    assert anchor in init.read_text()
    init.write_text(init.read_text().replace(anchor, anchor + import_line))
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
