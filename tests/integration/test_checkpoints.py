"""Warm start from a vanilla Transformer, safe loading, and exact resume."""

import pickle
import re

import pytest
import torch
from fairseq import checkpoint_utils
from fairseq.data import Dictionary

from fairseq_capsagg import USER_DIR
from fairseq_capsagg.aggregators import family_class
from fairseq_capsagg.patches.safe_checkpoints import UnsafeCheckpointError, check_checkpoint
from helpers import FAMILIES, TINY, VANILLA_TINY, build_tiny_model, run_tool, train


@pytest.fixture(scope="module")
def vanilla_checkpoint(tiny_data_bin, tmp_path_factory):
    """A plain fairseq `transformer` trained for 3 updates at the tiny shape."""
    save_dir = tmp_path_factory.mktemp("vanilla")
    run_tool(
        "fairseq-train", str(tiny_data_bin), "--arch", "transformer", *VANILLA_TINY,
        "--user-dir", USER_DIR, "--encoder-normalize-before", "--decoder-normalize-before",
        "--share-decoder-input-output-embed", "--task", "translation", "--cpu", "--optimizer", "adam",
        "--lr", "1e-3", "--max-tokens", "2000", "--max-update", "3", "--save-dir", str(save_dir),
        "--no-epoch-checkpoints", "--num-workers", "0",
    )
    return save_dir / "checkpoint_last.pt"


@pytest.mark.parametrize("family", FAMILIES)
def test_vanilla_checkpoint_initialises_every_shared_weight(family, vanilla_checkpoint, tiny_data_bin):
    state = checkpoint_utils.load_checkpoint_to_cpu(str(vanilla_checkpoint))
    vanilla = state["model"]
    dictionary = Dictionary.load(str(tiny_data_bin / "dict.en.txt"))
    model, _ = build_tiny_model(f"transformer_{family}_small", TINY, dictionary=dictionary)
    fresh = {k: v.clone() for k, v in model.state_dict().items()}
    model.load_state_dict(dict(vanilla), strict=True)  # what --finetune-from-model does
    loaded = model.state_dict()
    shared = [k for k in loaded if k in vanilla]
    new = [k for k in loaded if k not in vanilla]
    if family_class(family).architecture_placement == "between-blocks":
        assert new and all(".dense_connections." in k for k in new)  # the connections only
    else:
        # the aggregator and (pre-norm, --aggregation-layer-norm on) the LayerNorm of each aggregated layer
        assert new and all(".aggregator." in k or ".layer_norms." in k for k in new)
        assert any(".aggregator." in k for k in new) and any(".layer_norms." in k for k in new)
    for k in shared:
        torch.testing.assert_close(loaded[k], vanilla[k], rtol=0, atol=0, msg=k)
    for k in new:
        torch.testing.assert_close(loaded[k], fresh[k], rtol=0, atol=0, msg=k)


def test_finetune_from_vanilla_checkpoint_on_the_command_line(vanilla_checkpoint, tiny_data_bin, tmp_path):
    result = train(tiny_data_bin, tmp_path, "transformer_emrouting_small", "--finetune-from-model",
                   str(vanilla_checkpoint), "--share-decoder-input-output-embed")
    assert "initialised" in result.stdout + result.stderr
    assert (tmp_path / "checkpoint_last.pt").exists()


def test_our_checkpoints_pass_the_safe_check_and_load_weights_only(vanilla_checkpoint):
    check_checkpoint(vanilla_checkpoint)
    state = torch.load(vanilla_checkpoint, map_location="cpu", weights_only=True)
    assert "model" in state


class Payload:
    """Stands for an arbitrary pickled object a hostile checkpoint could carry."""


def test_checkpoint_with_other_globals_is_refused(vanilla_checkpoint, tmp_path):
    state = torch.load(vanilla_checkpoint, map_location="cpu", weights_only=True)
    state["extra"] = Payload()
    bad = tmp_path / "bad.pt"
    torch.save(state, bad)
    with pytest.raises(UnsafeCheckpointError, match=r"refusing to load .*bad\.pt: it pickles test_checkpoints\.Payload"):
        check_checkpoint(bad)
    with pytest.raises(pickle.UnpicklingError):
        torch.load(bad, map_location="cpu", weights_only=True)


def test_resumed_training_logs_the_same_losses(tiny_data_bin, tmp_path):
    extra = ["--max-tokens", "500", "--log-interval", "1", "--dropout", "0.1"]

    def losses(output):
        return {int(u): loss for loss, u in re.findall(r"\bloss=([0-9.]+),.*?num_updates=(\d+)", output)}

    straight = train(tiny_data_bin, tmp_path / "straight", "transformer_emrouting_small", *extra,
                     "--max-update", "8")
    first = train(tiny_data_bin, tmp_path / "resumed", "transformer_emrouting_small", *extra, "--max-update", "4")
    second = train(tiny_data_bin, tmp_path / "resumed", "transformer_emrouting_small", *extra, "--max-update", "8")
    expected = losses(straight.stdout + straight.stderr)
    got = {**losses(first.stdout + first.stderr), **losses(second.stdout + second.stderr)}
    assert sorted(expected) == list(range(1, 9))
    assert got == expected


def test_checkpoint_that_cannot_be_inspected_is_refused(vanilla_checkpoint, tmp_path):
    truncated = tmp_path / "truncated.pt"
    truncated.write_bytes(vanilla_checkpoint.read_bytes()[:5000])
    with pytest.raises(UnsafeCheckpointError, match=r"refusing to load .*truncated\.pt: its pickle cannot be inspected"):
        check_checkpoint(truncated)


def test_ramp_state_travels_with_checkpoints(tiny_data_bin, tmp_path):
    flags = ["--aggregation-ramp-updates", "4", "--routing-init", "identity"]
    train(tiny_data_bin, tmp_path, "transformer_emrouting_small", *flags)  # 3 updates
    key = "encoder.aggregation_ramp.num_updates"
    # the third update was computed at t = 2 (a_t = 2/4): a saved model decodes with its last a_t
    assert int(checkpoint_utils.load_checkpoint_to_cpu(str(tmp_path / "checkpoint_last.pt"))["model"][key]) == 2
    train(tiny_data_bin, tmp_path, "transformer_emrouting_small", *flags, "--max-update", "6")  # resumes at 3
    state = checkpoint_utils.load_checkpoint_to_cpu(str(tmp_path / "checkpoint_last.pt"))
    assert state["optimizer_history"][-1]["num_updates"] == 6
    assert int(state["model"][key]) == 5 and int(state["model"][key.replace("encoder", "decoder")]) == 5


def test_interactive_constraints_keep_their_tab_separated_fields(vanilla_checkpoint, tiny_data_bin):
    """With the plugin loaded, fairseq-interactive --constraints still reads the constraints."""
    words = [line.split()[0] for line in (tiny_data_bin / "dict.de.txt").read_text().splitlines()[40:43]]
    source = "the file is open"
    lines = [f"{source}\t{words[0]}", f"  {source} \t {words[1]} \t\t{words[2]} ", source]
    result = run_tool(
        "fairseq-interactive", str(tiny_data_bin), "--path", str(vanilla_checkpoint), "--user-dir", USER_DIR,
        "--source-lang", "en", "--target-lang", "de", "--constraints", "--beam", "4", "--cpu",
        stdin="\n".join(lines) + "\n")
    out = result.stdout.splitlines()
    assert [line for line in out if line.startswith("C-")] == [
        f"C-0\t{words[0]}", f"C-1\t{words[1]}", f"C-1\t{words[2]}"]
    sources = [line.split("\t", 1)[1] for line in out if line.startswith("S-")]
    assert sources == [source, source, source]
    hypotheses = {line.split("\t")[0]: line.split("\t")[2].split() for line in out if line.startswith("H-")}
    assert words[0] in hypotheses["H-0"] and {words[1], words[2]} <= set(hypotheses["H-1"])
    assert "H-2" in hypotheses
    # the one line with empty fields is named once
    assert len(re.findall(r"input line 2 \(H-1\): empty tab-separated fields removed", result.stderr)) == 1


def test_a_dynamic_routing_checkpoint_saved_before_its_architectures_set_the_capsules_keeps_n_equal_d(
        tiny_data_bin, tmp_path):
    """Its arguments leave --output-capsules unset (N = d then); fairseq runs today's architecture on them when
    it loads the model, which would give it today's N: it loads with the N = d it was trained with."""
    train(tiny_data_bin, tmp_path, "transformer_dynrouting_small", shape=VANILLA_TINY)
    saved = tmp_path / "checkpoint_last.pt"
    state = torch.load(saved, weights_only=False)
    today = state["cfg"]["model"].output_capsules
    assert today == family_class("dynrouting").architecture_settings["output_capsules"] != 32
    (models,), _ = checkpoint_utils.load_model_ensemble([str(saved)], arg_overrides={"data": str(tiny_data_bin)})
    assert models.encoder.aggregator.output_capsules == today
    state["cfg"]["model"].output_capsules = None  # as saved before the architectures set it
    old = tmp_path / "saved-before.pt"
    torch.save(state, old)
    (models,), _ = checkpoint_utils.load_model_ensemble([str(old)], arg_overrides={"data": str(tiny_data_bin)})
    assert models.encoder.aggregator.output_capsules == models.decoder.aggregator.output_capsules == 32  # d
