"""Agreement statistics, BLEU by length, the sweep collector and the peers' depth weights."""

import json
import math
import pytest
import torch
from fairseq_capsagg.analysis import agreement_diversity, agreement_entropy, scoring
from fairseq_capsagg.analysis.__main__ import main as analysis_main
from fairseq_capsagg.analysis.agreement import AgreementAccumulator
from fairseq_capsagg.analysis.length import bleu_by_length, length_buckets
from fairseq_capsagg.aggregators import build_aggregator


def test_uniform_agreement_reproduces_the_papers_first_iteration():
    """N = 512 uniform: entropy ln 512 = 6.24 and diversity 0.00, as reported."""
    c = torch.full((6, 512), 1 / 512)
    assert agreement_entropy(c).item() == pytest.approx(math.log(512))
    assert round(agreement_entropy(c).item(), 2) == 6.24
    assert agreement_diversity(c).item() == pytest.approx(0.0, abs=1e-9)


def test_one_hot_agreement_limits():
    c = torch.eye(6)  # input capsule l routed to output capsule l only
    assert agreement_entropy(c).item() == pytest.approx(0.0, abs=1e-9)
    assert agreement_diversity(c).item() == pytest.approx(1.0)
    # more output capsules than inputs: unused (all-zero) columns have cosine 0 with every column
    c = torch.zeros(3, 5)
    c[0, 0] = c[1, 0] = c[2, 1] = 1.0
    # columns: (1,1,0) and (0,0,1) are orthogonal, three zero columns -> every pair has cosine 0
    assert agreement_diversity(c).item() == pytest.approx(1.0)


def test_statistics_against_hand_computed_case():
    c = torch.tensor([[0.5, 0.5], [0.9, 0.1]])
    entropy = (-(0.5 * math.log(0.5)) * 2 + -(0.9 * math.log(0.9) + 0.1 * math.log(0.1))) / 2
    assert agreement_entropy(c).item() == pytest.approx(entropy)
    col0, col1 = torch.tensor([0.5, 0.9]), torch.tensor([0.5, 0.1])
    cos = (col0 @ col1 / (col0.norm() * col1.norm())).item()
    assert agreement_diversity(c).item() == pytest.approx(1 - cos)
    batched = torch.stack([c, torch.full((2, 2), 0.5)])
    assert agreement_diversity(batched).tolist() == pytest.approx([1 - cos, 0.0])


def test_accumulator_skips_padded_positions():
    torch.manual_seed(0)
    agg = build_aggregator("em-routing", 8, 3, {"output_capsules": 4, "routing_iters": 2})
    agg.capture_agreement = True
    layers = [torch.randn(4, 2, 8) for _ in range(3)]
    mask = torch.tensor([[False] * 4, [False, True, True, True]])
    agg(layers, mask)
    acc = AgreementAccumulator()
    acc.add(agg)
    assert acc.positions == 5
    summary = acc.summary()
    assert summary["entropy"][0] == pytest.approx(math.log(4))
    assert summary["diversity"][0] == pytest.approx(0.0, abs=1e-9)
    assert len(summary["mean_output_activation"]) == 2
    real = agg.agreement[1].transpose(0, 1)[~mask]
    assert summary["entropy"][1] == pytest.approx(agreement_entropy(real).mean().item())


def test_accumulator_takes_the_entropy_over_the_axis_the_agreement_sums_over():
    torch.manual_seed(0)
    agg = build_aggregator("dynamic-routing", 8, 3, {"output_capsules": 4, "routing_iters": 2,
                                                     "routing_softmax": "input"})
    agg.capture_agreement = True
    agg([torch.randn(4, 2, 8) for _ in range(3)], None)
    acc = AgreementAccumulator()
    acc.add(agg)
    summary = acc.summary()
    assert summary["entropy_over"] == "input capsules"
    assert summary["entropy"][0] == pytest.approx(math.log(3))  # uniform over L = 3, not N = 4
    per_output_capsule = agreement_entropy(agg.agreement[1].reshape(-1, 3, 4).transpose(-1, -2))
    assert summary["entropy"][1] == pytest.approx(per_output_capsule.mean().item())


@pytest.mark.parametrize("scale,dead,saturated", [(1e-3, 1.0, 0.0), (1e3, 0.0, 1.0)])
def test_accumulator_counts_dead_and_saturated_scalar_capsules(scale, dead, saturated):
    """Scalar capsules (N = d): squash leaves ~0 for tiny sums and only the sign for large ones."""
    torch.manual_seed(0)
    agg = build_aggregator("dynamic-routing", 8, 3, {"output_capsules": 8, "routing_iters": 2,
                                                     "routing_softmax": "input"})
    agg.capture_agreement = True
    mask = torch.tensor([[False] * 4, [False, False, True, True]])
    agg([scale * torch.randn(4, 2, 8) for _ in range(3)], mask)
    acc = AgreementAccumulator()
    acc.add(agg)
    lengths = acc.summary()["output_capsule_length"]
    assert lengths["share_below_0.05"] == pytest.approx(dead, abs=0.05)
    assert lengths["share_above_0.9"] == pytest.approx(saturated, abs=0.05)
    assert 0.0 <= lengths["mean"] < 1.0
    assert acc.capsule_length["count"] == 6 * 8  # real positions only


def test_length_buckets_boundaries():
    sources = ["a " * n for n in (1, 9, 10, 19, 20, 55)]
    buckets = dict(length_buckets(sources, [0, 10, 20, math.inf]))
    assert buckets == {"0-9": [0, 1], "10-19": [2, 3], "20+": [4, 5]}


def test_bleu_by_length_scores_each_bucket():
    sources = ["one two", "one two three four five six seven eight nine ten eleven"]
    refs = ["das ist ein guter Satz", "das ist ein langer guter Satz hier"]
    result = bleu_by_length(sources, refs, {"perfect": refs, "empty": ["", ""]}, [0, 10, math.inf])
    assert [r["bucket"] for r in result["rows"]] == ["0-9", "10+"]
    assert all(r["perfect"] == 100.0 and r["empty"] == 0.0 for r in result["rows"])


def test_length_command_writes_table_and_plot(tmp_path):
    (tmp_path / "src").write_text("a b\nc d e f g h i j k l m\nx\n")
    (tmp_path / "ref").write_text("eins zwei\ndrei vier fünf\nsechs\n")
    (tmp_path / "gen").write_text("D-2\t-0.1\tsechs\nD-0\t-0.2\teins zwei\nD-1\t-0.3\tdrei\n")
    (tmp_path / "plain").write_text("eins\ndrei vier fünf\nsechs\n")
    code = analysis_main(["length", "--source", str(tmp_path / "src"), "--reference", str(tmp_path / "ref"),
                          "--system", f"a={tmp_path / 'gen'}", "--system", f"b={tmp_path / 'plain'}",
                          "--edges", "0", "5", "--output-dir", str(tmp_path / "out")])
    assert code == 0
    result = json.loads((tmp_path / "out" / "bleu_by_length.json").read_text())
    assert [r["sentences"] for r in result["rows"]] == [2, 1]
    assert (tmp_path / "out" / "bleu_by_length.png").stat().st_size > 10_000
    assert "| 0-4 | 2 |" in (tmp_path / "out" / "bleu_by_length.md").read_text()


def test_sweep_collects_finished_runs(tmp_path):
    for value, bleu in (("1", 10.0), ("2", 12.5), ("3", 11.0)):
        run = tmp_path / "runs" / f"routing-iters-{value}"
        run.mkdir(parents=True)
        (run / "results.json").write_text(json.dumps({"rows": [{"bleu": bleu}]}))
    code = analysis_main(["sweep", "--param", "routing-iters", "--values", "1", "2", "3", "--collect-only",
                          "--workdir", str(tmp_path / "runs"), "--output-dir", str(tmp_path / "out")])
    assert code == 0
    summary = json.loads((tmp_path / "out" / "sweep-routing-iters.json").read_text())
    assert summary["bleu"] == {"1": 10.0, "2": 12.5, "3": 11.0}
    assert (tmp_path / "out" / "sweep-routing-iters.png").stat().st_size > 10_000


def test_sweep_reports_missing_runs_in_one_line(tmp_path, capsys):
    code = analysis_main(["sweep", "--param", "side", "--values", "encoder", "--collect-only",
                          "--workdir", str(tmp_path), "--output-dir", str(tmp_path / "out")])
    assert code == 2
    assert "analysis sweep: error:" in capsys.readouterr().err


REFERENCES = [f"the file number {i} was saved to the disk" for i in range(30)]


def test_the_paired_bootstrap_finds_a_real_difference_and_none_in_equal_bleu():
    """sacrebleu's own p for a clearly better system; p = 1 where the BLEU is the same: identical
    translations, and two systems at BLEU 0 (where sacrebleu would return its smallest p)."""
    good = list(REFERENCES)
    poor = [f"a file {i}" for i in range(30)]
    reworded = [f"one file {i}" for i in range(30)]
    p = scoring.paired_bootstrap(poor, {"good": good, "same": list(poor), "reworded": reworded}, REFERENCES, samples=200)
    assert p["good"] < 0.01
    assert p["same"] == 1.0 and p["reworded"] == 1.0  # identical output; both at BLEU 0
    assert scoring.corpus_scores(poor, REFERENCES)["bleu"] == 0.0
