"""The parameter-count command counts what the aggregators really add."""

import torch
from fairseq.utils import move_to_cpu

from fairseq_capsagg.tools.param_count import count_checkpoint_parameters
from fairseq_capsagg.tools.param_count import count_parameters, format_table, parameter_table


def test_added_parameters_follow_the_module_shapes():
    d, layers = 128, 6
    rows = {(r["shape"], r["family"]): r for r in parameter_table(vocab_size=1000, share="decoder")
            if r["shape"] == "small"}
    layer_norms = 2 * layers * d  # small is pre-norm: a LayerNorm on each aggregated layer
    per_side_routing = (layers * d) ** 2 + layers * d + layers * d * d + layer_norms  # F_l (Eq. 9) + votes (Eq. 8)
    assert rows["small", "dynrouting"]["delta"] == 2 * per_side_routing
    assert rows["small", "emrouting"]["delta"] == 2 * (per_side_routing + layers * d + layers + 2 * d)
    assert rows["small", "linagg"]["delta"] == 2 * (layers * d + layer_norms)
    table = format_table(list(rows.values()))
    assert "| small | emrouting |" in table


def test_matrix_linear_combination_adds_l_d_squared():
    base = count_parameters("transformer_linagg_small", 1000)
    matrix = count_parameters("transformer_linagg_small", 1000, ["--linear-combination-weights", "matrix"])
    assert matrix - base == 2 * 6 * (128 * 128 - 128)


def test_a_checkpoint_counts_its_tied_embeddings_once_however_it_was_saved(tmp_path):
    """On a CPU fairseq saves tied embeddings as one storage; on a GPU or from half precision its
    ``utils.move_to_cpu`` copies each tensor on its own, so the tie survives only as equal values."""
    embedding, ffn = torch.randn(50, 8), torch.randn(16, 8)
    shared = {"encoder.embed_tokens.weight": embedding, "decoder.embed_tokens.weight": embedding,
              "decoder.output_projection.weight": embedding, "encoder.layers.0.fc1.weight": ffn,
              "encoder.version": torch.tensor([3])}
    half = {name: tensor.to(torch.bfloat16) if tensor.is_floating_point() else tensor for name, tensor in shared.items()}
    untied = dict(shared, **{"decoder.embed_tokens.weight": torch.randn(50, 8)})
    counts = {}
    for label, model in (("shared", shared), ("copied", move_to_cpu(half)), ("untied", untied)):
        torch.save({"model": model}, tmp_path / f"{label}.pt")
        counts[label] = count_checkpoint_parameters(tmp_path / f"{label}.pt")
    assert counts == {"shared": 50 * 8 + 16 * 8, "copied": 50 * 8 + 16 * 8, "untied": 2 * 50 * 8 + 16 * 8}
