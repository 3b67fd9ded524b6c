"""The initialisation health report: every family's output and gradients at init, on a real batch."""

import json
import math

import pytest

from fairseq_capsagg.aggregators import family_class
from fairseq_capsagg.analysis.health import checkpoint_report, cli_main, health_report
from helpers import FAMILIES, VANILLA_TINY, train


SHAPES = ("small", "base")


@pytest.fixture(scope="module")
def report(tiny_data_bin):
    """Every family at the pre-norm small and the post-norm base shape, N = d (the defaults)."""
    archs = [f"transformer_{family}_{shape}" for shape in SHAPES for family in FAMILIES]
    return health_report(archs, str(tiny_data_bin))


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("family", FAMILIES)
def test_no_aggregate_is_swamped_by_the_layer_norm_eps(report, family, shape):
    result = report[f"transformer_{family}_{shape}"]
    for side in ("encoder", "decoder"):
        out = result["outputs"][side]
        if math.isnan(out["eps_share"]):
            # post-norm, no LayerNorm after a weighted sum of normalised layers: it is the output
            assert shape == "base" and family not in ("dynrouting", "emrouting"), (side, out)
            assert out["aggregate_std"] > 0.5, (side, out)
            continue
        # eps / (var + eps) of the LayerNorm after the aggregate: its variance is >= 99x eps
        assert out["eps_share"] < 0.01, (side, out)
        assert out["normalised_std"] > 0.5


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("family", FAMILIES)
def test_transformer_layers_get_a_gradient_like_the_vanilla_models(report, family, shape):
    result = report[f"transformer_{family}_{shape}"]
    # DLCL starts as its paper's uniform average of the normalised layers, not as the Transformer: each layer
    # then reaches the loss through a 1/L share, and its layers get 0.2-0.3x the vanilla gradient (measured)
    low = 0.1 if not family_class(family).starts_as_transformer else 0.5
    assert low <= result["layer_grad_ratio"] <= 2.0, result
    assert 0.0 <= result["aggregator_grad_share"] < 0.9
    assert math.isfinite(result["grad_norm"]) and result["grad_norm"] > 0


@pytest.mark.parametrize("shape", SHAPES)
def test_identity_preserving_aggregators_start_at_the_vanilla_loss(report, shape):
    for family in ("linagg", "dyncomb", "dwa", "depthattn", "mudd", "hc", "mhc"):
        result = report[f"transformer_{family}_{shape}"]
        assert result["loss"] == pytest.approx(result["vanilla_loss"], abs=1e-3)
        assert result["layer_grad_ratio"] == pytest.approx(1.0, abs=1e-3)


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("family", FAMILIES)
def test_routing_reports_how_uniform_its_last_agreement_is(report, family, shape):
    outputs = report[f"transformer_{family}_{shape}"]["outputs"]
    for side in ("encoder", "decoder"):
        if family in ("dynrouting", "emrouting"):
            # the first iteration's C is uniform; later ones may sharpen, never below one-hot
            assert 0.0 <= outputs[side]["agreement_entropy"] <= 1.0 + 1e-6, (side, outputs[side])
        else:
            assert "agreement_entropy" not in outputs[side]


def test_health_report_leaves_no_agreement_captured(tiny_data_bin):
    from fairseq_capsagg.analysis.agreement import routing_modules
    from fairseq_capsagg.models import CapsAggTransformerModel
    from fairseq_capsagg.analysis import health

    built = []
    original = CapsAggTransformerModel.build_model.__func__

    def keep(cls, args, task):
        model = original(cls, args, task)
        built.append(model)
        return model

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(CapsAggTransformerModel, "build_model", classmethod(keep))
        health.health_report(["transformer_dynrouting_small"], str(tiny_data_bin))
    modules = routing_modules(built[-1])
    assert set(modules) == {"encoder", "decoder"}
    assert all(not m.capture_agreement and m.agreement == [] for m in modules.values())


def test_health_command_prints_every_side(tiny_data_bin, capsys):
    assert cli_main(["--data", str(tiny_data_bin), "--shapes", "small", "--families", "emrouting",
                     "--model-args=--routing-init identity"]) == 0
    out = capsys.readouterr().out
    assert "| transformer_emrouting_small |" in out and "| encoder |" in out and "| decoder |" in out
    assert "| agreement entropy / ln N |" in out


def test_softmax_over_input_capsules_is_healthy_and_its_entropy_is_over_layers(tiny_data_bin):
    result = health_report(["transformer_dynrouting_small"], str(tiny_data_bin),
                           ["--routing-softmax", "input"])["transformer_dynrouting_small"]
    assert 0.5 <= result["layer_grad_ratio"] <= 2.0, result
    for side in ("encoder", "decoder"):
        out = result["outputs"][side]
        assert out["eps_share"] < 0.01 and out["normalised_std"] > 0.5, (side, out)
        # over L = 6 layers and divided by ln L: within [0, 1] (over N it would exceed 1)
        assert 0.0 < out["agreement_entropy"] <= 1.0 + 1e-6, (side, out)


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("family", ["hc", "mhc"])
def test_residual_streams_start_with_a_composite_gain_of_one(report, family, shape):
    outputs = report[f"transformer_{family}_{shape}"]["outputs"]
    gains = outputs["encoder"]["stream_gain"], outputs["decoder"]["stream_gain"]
    if family == "hc":  # every mixing is I
        assert gains == (1.0, 1.0)
    else:  # every mixing is mHC's start, doubly stochastic: its product's row and column sums 1 to rounding
        assert gains == (pytest.approx(1.0, abs=1e-5), pytest.approx(1.0, abs=1e-5))
    assert "stream_gain" not in report[f"transformer_dwa_{shape}"]["outputs"]["encoder"]


@pytest.mark.parametrize("family", ["hc", "mhc"])
def test_a_trained_checkpoint_reports_its_stream_gain(family, tiny_data_bin, tmp_path, capsys):
    train(tiny_data_bin, tmp_path, f"transformer_{family}_small", "--residual-streams", "2", "--lr", "3e-2")
    checkpoint = str(tmp_path / "checkpoint_last.pt")
    gains = [checkpoint_report(checkpoint, str(tiny_data_bin))[checkpoint]["outputs"][side]["stream_gain"]
             for side in ("encoder", "decoder")]
    assert all(math.isfinite(g) and g > 0 for g in gains)
    if family == "mhc":  # doubly stochastic mixing: the product keeps row and column sums near 1
        assert all(abs(g - 1.0) < 0.05 for g in gains), gains
    assert cli_main(["--data", str(tiny_data_bin), "--path", checkpoint]) == 0
    assert "| stream gain |" in capsys.readouterr().out


@pytest.mark.parametrize("norm", [[], ["--encoder-normalize-before", "--decoder-normalize-before"]],
                         ids=["post-norm", "pre-norm"])
def test_fairseqs_own_transformer_checkpoint_reports_both_sides(norm, tiny_data_bin, tmp_path):
    """The tables' baselines are fairseq's ``transformer``: no aggregation, no streams, both sides reported."""
    train(tiny_data_bin, tmp_path, "transformer", *norm, shape=VANILLA_TINY)
    checkpoint = str(tmp_path / "checkpoint_last.pt")
    result = checkpoint_report(checkpoint, str(tiny_data_bin))[checkpoint]
    assert set(result["outputs"]) == {"encoder", "decoder"}
    for out in result["outputs"].values():
        assert out["aggregate_std"] > 0 and "stream_gain" not in out
        assert math.isnan(out["eps_share"]) == (not norm)  # pre-norm: the final LayerNorm's eps share
    assert math.isfinite(result["loss"]) and result["aggregator_grad_share"] == 0.0


def test_the_step0_tool_starts_every_architecture_from_the_checkpoint(tiny_data_bin, tmp_path, capsys):
    """Each --arch built with the checkpoint's shape and --model-args, loaded from it before any update."""
    from fairseq_capsagg.tools.warm_start_loss import cli_main as step0_main

    train(tiny_data_bin, tmp_path, "transformer", "--encoder-normalize-before", "--decoder-normalize-before",
          shape=VANILLA_TINY)
    common = ["--path", str(tmp_path / "checkpoint_last.pt"), "--data", str(tiny_data_bin)]
    dense, routing = ["transformer_dwa_small", "transformer_mudd_small"], "transformer_emrouting_small"
    assert step0_main([*common, "--arch", *dense, routing]) == 0
    losses = json.loads(capsys.readouterr().out)
    assert list(losses) == ["baseline", *dense, routing]
    assert 0 < losses["baseline"]["nll_loss"] < losses["baseline"]["loss"]
    for arch in dense:  # the dense connections start as the Transformer
        assert losses[arch]["loss"] == pytest.approx(losses["baseline"]["loss"], abs=1e-4), arch
    assert losses[routing]["loss"] != pytest.approx(losses["baseline"]["loss"], abs=1e-4)  # EM routing by default
    assert step0_main([*common, "--arch", routing,
                       "--model-args=--routing-init identity --aggregation-ramp-updates 1"]) == 0
    ramped = json.loads(capsys.readouterr().out)  # the flags reach it: it starts as the Transformer too
    assert ramped[routing]["loss"] == pytest.approx(ramped["baseline"]["loss"], abs=1e-4)


def one_error_line(main, argv, capsys) -> str:
    """The one ``error:`` line ``main(argv)`` stops with (exit status 2)."""
    with pytest.raises(SystemExit) as stop:
        main(argv)
    errors = [line for line in capsys.readouterr().err.splitlines() if "error:" in line]
    assert stop.value.code == 2 and len(errors) == 1, errors
    return errors[0]


def test_health_with_a_missing_file_is_one_line(tiny_data_bin, tmp_path, capsys):
    """Checked before any model loads."""
    checkpoint = tmp_path / "checkpoint_best.pt"
    checkpoint.write_bytes(b"")  # the argument checks only look for the file
    assert "--data " in one_error_line(cli_main, ["--data", str(tmp_path), "--path", str(checkpoint)], capsys)
    missing = ["--data", str(tiny_data_bin), "--path", str(tmp_path / "none.pt")]
    assert "--path " in one_error_line(cli_main, missing, capsys)


def test_the_step0_tool_with_a_missing_file_or_unknown_architecture_is_one_line(tiny_data_bin, tmp_path, capsys):
    from fairseq_capsagg.tools.warm_start_loss import cli_main as step0_main

    checkpoint = tmp_path / "checkpoint_best.pt"
    checkpoint.write_bytes(b"")
    unknown = ["--data", str(tiny_data_bin), "--path", str(checkpoint), "--arch", "transformer_foo_small"]
    assert ("--arch: unknown transformer_foo_small; choose from transformer_depthattn_base"
            in one_error_line(step0_main, unknown, capsys))
    missing = ["--data", str(tiny_data_bin), "--path", str(tmp_path / "none.pt"), "--arch", "transformer_dwa_small"]
    assert "--path " in one_error_line(step0_main, missing, capsys)
