"""Results at a glance and the converged runs' table, read from published tables written here."""

import json

import pytest

from fairseq_capsagg.pipeline.reports.summary import cli_main, converged_runs_table, glance_table
from fairseq_capsagg.tools.markdown_block import read_block

ONE_EPOCH = {"max_update": 900, "warm_updates": 600}
CONVERGED = {"warm_updates": 3000}


def row(name, system, protocol, seed, reference, flags=()):
    return {"name": name, "system": system, "protocol": protocol, "seed": seed, "reference": reference,
            "flags": list(flags), "max_update": 0}


def scored(bleu, delta=None, p=None, average=None, **extra):
    result = {"bleu": bleu, **extra}
    if delta is not None:
        result.update(delta_bleu=delta, bootstrap_p=p)
    if average is not None:
        result["average"] = average
    return result


def publish(path, payload):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(payload))
    return path


def averaged(bleu, delta=None, p=None, updates=(1000, 3000)):
    return scored(bleu, delta, p, updates=list(updates))


@pytest.fixture
def published(tmp_path):
    one_epoch = publish(tmp_path / "table1-cpu.json", {"config": ONE_EPOCH, "rows": [
        row("scratch-baseline-s1", "baseline", "scratch", 1, "scratch-baseline-s1"),
        row("scratch-dyncomb-s1", "dyncomb", "scratch", 1, "scratch-baseline-s1"),
        row("scratch-dyncomb-s2", "dyncomb", "scratch", 2, "scratch-baseline-s1"),
        row("scratch-emrouting-iter1-s1", "emrouting", "scratch", 1, "scratch-baseline-s1", ("--routing-iters", "1")),
        row("scratch-emrouting-encoder-s1", "emrouting", "scratch", 1, "scratch-baseline-s1",
            ("--decoder-aggregation", "none")),
        row("scratch-baseline-s2", "baseline", "scratch", 2, "scratch-baseline-s1"),
    ], "results": {"scratch-baseline-s1": scored(7.42), "scratch-dyncomb-s1": scored(10.38, 2.96, 0.001),
                   "scratch-dyncomb-s2": scored(10.53, 3.11, 0.03), "scratch-emrouting-iter1-s1": scored(6.3, -1.1, 0.001),
                   "scratch-emrouting-encoder-s1": scored(7.25, -0.17, 0.127),
                   "scratch-baseline-s2": scored(7.36, -0.06, 0.273)}})
    streams = publish(tmp_path / "streams" / "peers-cpu.json", {"config": ONE_EPOCH, "rows": [
        row("scratch-baseline-s1", "baseline", "scratch", 1, "scratch-baseline-s1"),
        row("scratch-hc-s1", "hc", "scratch", 1, "scratch-baseline-s1"),
    ], "results": {"scratch-baseline-s1": scored(7.44), "scratch-hc-s1": scored(10.46, 3.02, 0.001)}})
    reference = dict(best_loss=4.565, average=averaged(28.98, updates=(29000, 30000)), converged=False,
                     stopped_at=30000)
    run1 = publish(tmp_path / "converged-cpu.json", {"config": CONVERGED, "rows": [
        row("converged-baseline-s1", "baseline", "converged", 1, "converged-baseline-s1"),
        row("continued-baseline", "baseline", "continued", 1, "converged-baseline-s1"),
        row("continued-dyncomb", "dyncomb", "continued", 1, "continued-baseline"),
        row("continued-emrouting-encoder", "emrouting", "continued", 1, "continued-baseline",
            ("--decoder-aggregation", "none")),
        row("continued-hc", "hc", "continued", 1, "continued-baseline"),
        row("continued-baseline-s2", "baseline", "continued", 2, "continued-baseline"),
    ], "results": {
        "converged-baseline-s1": scored(29.0, **reference),
        "continued-baseline": scored(28.93, -0.07, 0.28, best_loss=4.542, average=averaged(29.40, 0.42, 0.012)),
        "continued-dyncomb": scored(29.10, 0.17, 0.102, best_loss=4.528, average=averaged(29.64, 0.24, 0.021)),
        "continued-emrouting-encoder": scored(29.11, 0.18, 0.108, best_loss=4.543, average=averaged(29.43, 0.03, 0.3)),
        "continued-baseline-s2": scored(29.02, 0.09, 0.248, best_loss=4.539, average=averaged(29.13, -0.27, 0.06))}})
    run2 = publish(tmp_path / "run2" / "converged-cpu.json", {"config": CONVERGED, "rows": [
        row("converged-baseline-s1", "baseline", "converged", 1, "converged-baseline-s1"),
        row("continued-baseline", "baseline", "continued", 1, "converged-baseline-s1"),
        row("continued-hc", "hc", "continued", 1, "continued-baseline"),
    ], "results": {"converged-baseline-s1": scored(28.5, best_loss=4.573, average=averaged(29.2), converged=False,
                                                   stopped_at=30000),
                   "continued-baseline": scored(29.11, 0.61, 0.003, best_loss=4.552, average=averaged(29.41, 0.21, 0.1)),
                   "continued-hc": scored(29.3, 0.19, 0.2, best_loss=4.55, average=averaged(29.35, -0.06, 0.3))}})
    points = [{"update": 1000, "loss": 7.0, "reference_updates": {}, "updates_ratio": [1.2, 1.3]},
              {"update": 2000, "loss": 6.0, "reference_updates": {}, "updates_ratio": [1.10, 1.12]}]
    equivalence = publish(tmp_path / "compute-equivalence.json", {"config": {"update_cap": 2000}, "rows": [
        row("scratch-hc-s1", "hc", "converged", 1, "scratch-baseline-s1"),
        row("scratch-dyncomb-s1", "dyncomb", "converged", 1, "scratch-baseline-s1")],
        "compute_equivalence": {"noise_band": {"1000": [0.95, 1.05], "2000": [0.97, 1.02]},
                                "rows": {"scratch-hc-s1": points}}})
    return [one_epoch, streams], [run1, run2], equivalence


def cells(text):
    lines = [line for line in text.splitlines() if line.startswith("| ") and not line.startswith("| method")]
    return {c[0]: c[1:] for c in ([x.strip() for x in line.strip("|").split("|")] for line in lines)}


def test_each_method_has_its_one_epoch_converged_and_equivalence_cells(published):
    one_epoch, converged, equivalence = published
    table = cells(glance_table(one_epoch, converged, equivalence))
    assert table["Transformer: BLEU"] == ["7.42", "29.40", "1"]
    assert table["Dynamic Combination"] == ["+2.96† / +3.11*", "+0.24* (0.021)", "not measured"]
    # measured in other runs, against those runs' Transformers: their BLEU beside the cell
    assert table["Hyper-connections"] == ["+3.02† vs 7.44", "−0.06 (0.300) vs 29.41", "1.10-1.12, above"]
    # an ablation continued from the converged Transformer is a method; the other ablations are not
    assert table["EM Routing, encoder only"] == ["−0.17", "+0.03 (0.300)", "not measured"]
    assert not any("iter" in name for name in table)
    assert list(table) == ["Transformer: BLEU", "Dynamic Combination", "EM Routing, encoder only", "Hyper-connections"]


def test_the_noise_line_reads_the_second_seeds_and_the_converged_runs(published):
    text = glance_table(*published)
    assert ("Noise: the Transformer's second seed −0.06 (0.273) after one epoch; −0.27 (0.060) continued (last 5 "
            "averaged); two trainings of the long-trained Transformer score 29.00 and 28.50 BLEU (last 5 averaged: "
            "28.98 and 29.20).") in text
    # a Transformer stopped by the update cap is not called converged
    assert "+3,000 updates from the Transformer trained 30,000 updates (not converged)" in text


@pytest.mark.parametrize("ratio,cell", [([0.99, 1.01], "0.99-1.01, within"), ([0.38, 0.39], "0.38-0.39, below")])
def test_a_ratio_within_or_below_the_transformers_band_is_said_so(published, ratio, cell):
    """Within the Transformer's own band is noise; below it, the method needs more updates than the Transformer."""
    one_epoch, converged, equivalence = published
    payload = json.loads(equivalence.read_text())
    payload["compute_equivalence"]["rows"]["scratch-hc-s1"][-1]["updates_ratio"] = ratio
    publish(equivalence, payload)
    assert cells(glance_table(one_epoch, converged, equivalence))["Hyper-connections"][2] == cell


def test_the_converged_runs_table_lists_every_scored_row_against_its_own_run(published):
    _, converged, _ = published
    table = converged_runs_table(converged).splitlines()
    assert table[0].startswith("| run | row | best valid loss")
    run2 = [line for line in table if "run2" in line]
    assert [line.split("|")[2].strip() for line in run2] == ["converged-baseline-s1", "continued-baseline",
                                                              "continued-hc"]
    assert "| 29.11 | +0.61† (0.003) | 1,000, 3,000 | 29.41 | +0.21 (0.100) |" in run2[1]


def test_the_cli_writes_its_block_and_names_a_missing_flag(published, tmp_path, capsys):
    one_epoch, converged, equivalence = published
    page = tmp_path / "README.md"
    page.write_text("intro\n<!-- glance:begin -->\nold\n<!-- glance:end -->\nafter\n")
    cli_main(["glance", "--one-epoch", *map(str, one_epoch), "--converged", *map(str, converged),
              "--equivalence", str(equivalence), "--write", str(page)])
    assert read_block(page, "glance") == glance_table(one_epoch, converged, equivalence)
    assert page.read_text().startswith("intro\n") and page.read_text().endswith("after\n")
    with pytest.raises(SystemExit):
        cli_main(["glance", "--converged", str(converged[0])])
    assert "--one-epoch: required" in capsys.readouterr().err


def test_with_the_transformers_seeds_the_cell_is_the_mean_over_seeds_against_the_seed_band(published):
    one_epoch, converged, equivalence = published
    payload = json.loads(equivalence.read_text())
    last = {"update": 2000, "seeds": {"1": [1.10, 1.12], "2": [1.05, 1.09]}, "mean": 1.09, "span": [1.05, 1.12],
            "above": True, "below": False}
    payload["compute_equivalence"].update(seed_band={"2000": [0.96, 1.03]},
                                          systems={"hc": [dict(last, update=1000), last]})
    publish(equivalence, payload)
    assert cells(glance_table(one_epoch, converged, equivalence))["Hyper-connections"][2] == \
        "1.09 (1.05-1.12, 2 seeds), above"
    payload["compute_equivalence"]["systems"]["hc"][-1].update(above=False, seeds={"1": [1.10, 1.12]})
    publish(equivalence, payload)
    assert cells(glance_table(one_epoch, converged, equivalence))["Hyper-connections"][2] == \
        "1.09 (1.05-1.12, 1 seed), within"
    payload["compute_equivalence"]["systems"]["hc"][-1].update(mean=1.231, span=[1.228, 1.234])
    publish(equivalence, payload)
    assert cells(glance_table(one_epoch, converged, equivalence))["Hyper-connections"][2] == \
        "1.23 (1 seed), within"


def test_the_noise_line_names_the_transformers_seed_band_from_scratch(published):
    """The Transformer's own seeds trained in the compute-equivalence table: where they lie on the curves the methods
    are read on, beside the other protocols' noise."""
    one_epoch, converged, equivalence = published
    assert "seed band" not in glance_table(one_epoch, converged, equivalence)
    payload = json.loads(equivalence.read_text())
    payload["rows"].append(row("scratch-baseline-s2", "baseline", "converged", 2, "scratch-baseline-s2"))
    payload["compute_equivalence"]["rows"]["scratch-baseline-s2"] = []
    payload["compute_equivalence"].update(seed_band={"1000": [0.88, 0.88], "2000": [0.904, 0.912]}, systems={})
    publish(equivalence, payload)
    assert ("; from scratch, its seed 2 and the runs' own lie at 0.90-0.91x on those runs' curves at 2,000 updates "
            "(compute-equivalence's seed band).") in glance_table(one_epoch, converged, equivalence)


def test_a_row_naming_the_architectures_defaults_stands_for_the_method_over_one_trained_without_flags(
        published, tmp_path, monkeypatch):
    """Dynamic routing's rows without flags ran the capsule count of their day (N = d); once its architectures
    use N = 4, the capsule table's row that names N = 4 is the method's cell, and the other widths stay ablations."""
    from fairseq_capsagg.aggregators import AGGREGATORS

    one_epoch, converged, equivalence = published
    payload = json.loads(one_epoch[0].read_text())
    payload["rows"].append(row("scratch-dynrouting-s1", "dynrouting", "scratch", 1, "scratch-baseline-s1"))
    payload["results"]["scratch-dynrouting-s1"] = scored(0.0, -7.42, 0.001)
    publish(one_epoch[0], payload)
    capsules = publish(tmp_path / "dynrouting-capsules-cpu.json", {"config": ONE_EPOCH, "rows": [
        row("scratch-baseline-s1", "baseline", "scratch", 1, "scratch-baseline-s1"),
        *(row(f"scratch-dynrouting-n{n}-s1", "dynrouting", "scratch", 1, "scratch-baseline-s1",
              ("--output-capsules", str(n), "--routing-softmax", "output")) for n in (4, 8))],
        "results": {"scratch-baseline-s1": scored(7.44), "scratch-dynrouting-n4-s1": scored(3.0, -4.44, 0.001),
                    "scratch-dynrouting-n8-s1": scored(2.04, -5.40, 0.001)}})
    sources = [*one_epoch, capsules]
    assert cells(glance_table(sources, converged, equivalence))["Dynamic Routing"][0] == "−7.42†"
    monkeypatch.setattr(AGGREGATORS["dynamic-routing"], "architecture_settings", {"output_capsules": 4})
    assert cells(glance_table(sources, converged, equivalence))["Dynamic Routing"][0] == "−4.44† vs 7.44"
