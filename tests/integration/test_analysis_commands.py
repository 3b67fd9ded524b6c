"""The analysis commands on trained checkpoints: which layers the dense connections read."""

import json

import pytest
from helpers import train

from fairseq_capsagg.analysis.__main__ import main as analysis_main


def test_depth_weights_command_reads_every_connection(tiny_data_bin, tmp_path):
    train(tiny_data_bin, tmp_path / "mudd", "transformer_mudd_small")
    out = tmp_path / "analysis"
    code = analysis_main(["depth-weights", "--path", str(tmp_path / "mudd" / "checkpoint_last.pt"), "--data",
                          str(tiny_data_bin), "--subset", "valid", "--output-dir", str(out)])
    assert code == 0
    result = json.loads((out / "depth-weights.json").read_text())
    assert set(result) == {"encoder between blocks", "decoder between blocks"}
    for place in result.values():
        assert place["positions"] > 0
        connections = place["connections"]
        assert [c["inputs"] for c in connections] == [2, 3, 4]  # after each of the 3 blocks
        assert [list(c["streams"]) for c in connections] == [["query", "key", "value", "residual"]] * 2 + [["output"]]
        for c in connections:  # three updates from the start, the newest input still carries ~all the weight
            for weights in c["streams"].values():
                assert len(weights) == c["inputs"] and weights[-1] == pytest.approx(1.0, abs=0.2)
    assert (out / "depth-weights-encoder-between-blocks.png").stat().st_size > 0


def test_depth_weights_of_a_model_without_peers_is_one_line(tiny_data_bin, tmp_path, capsys):
    train(tiny_data_bin, tmp_path / "lin", "transformer_linagg_small")
    code = analysis_main(["depth-weights", "--path", str(tmp_path / "lin" / "checkpoint_last.pt"), "--data",
                          str(tiny_data_bin), "--subset", "valid", "--output-dir", str(tmp_path / "a")])
    assert code == 2
    assert capsys.readouterr().err.strip().splitlines() == [
        "analysis depth-weights: error: the model has no dense connections and no dwa, depth-attention or mudd aggregator"]


@pytest.mark.parametrize("command", ["agreement", "depth-weights"])
def test_a_missing_checkpoint_is_one_line(command, tiny_data_bin, tmp_path, capsys):
    missing = tmp_path / "none.pt"
    code = analysis_main([command, "--path", str(missing), "--data", str(tiny_data_bin), "--output-dir", str(tmp_path)])
    assert code == 2
    assert capsys.readouterr().err.strip().splitlines() == [f"analysis {command}: error: Model file not found: {missing}"]
