"""The parameter-count command counts what the aggregators really add."""

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
