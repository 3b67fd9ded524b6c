"""The initialisation health report: every family's output and gradients at init, on a real batch."""

import math

import pytest

from fairseq_capsagg.health import cli_main, health_report
from fairseq_capsagg.models import FAMILIES


@pytest.fixture(scope="module")
def small_report(tiny_data_bin):
    archs = [f"transformer_{family}_small" for family in FAMILIES]
    return health_report(archs, str(tiny_data_bin), ["--output-capsules", "128"])


@pytest.mark.parametrize("family", FAMILIES)
def test_no_aggregate_is_swamped_by_the_layer_norm_eps(small_report, family):
    report = small_report[f"transformer_{family}_small"]
    for side in ("encoder", "decoder"):
        out = report["outputs"][side]
        # eps / (var + eps) of the final LayerNorm: the aggregate's variance is >= 99x eps
        assert out["eps_share"] < 0.01, (side, out)
        assert out["normalised_std"] > 0.5


@pytest.mark.parametrize("family", FAMILIES)
def test_transformer_layers_get_a_gradient_like_the_vanilla_models(small_report, family):
    report = small_report[f"transformer_{family}_small"]
    assert 0.5 <= report["layer_grad_ratio"] <= 2.0, report
    assert 0.0 <= report["aggregator_grad_share"] < 0.9
    assert math.isfinite(report["grad_norm"]) and report["grad_norm"] > 0


def test_identity_preserving_aggregators_start_at_the_vanilla_loss(small_report):
    for family in ("linagg", "dyncomb"):
        report = small_report[f"transformer_{family}_small"]
        assert report["loss"] == pytest.approx(report["vanilla_loss"], abs=1e-3)
        assert report["layer_grad_ratio"] == pytest.approx(1.0, abs=1e-3)


def test_health_command_prints_every_side(tiny_data_bin, capsys):
    assert cli_main(["--data", str(tiny_data_bin), "--shapes", "small", "--families", "emrouting",
                     "--model-args=--routing-init identity"]) == 0
    out = capsys.readouterr().out
    assert "| transformer_emrouting_small |" in out and "| encoder |" in out and "| decoder |" in out
