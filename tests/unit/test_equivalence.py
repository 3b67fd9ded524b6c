"""Compute-equivalence: a row's validation loss placed on a Transformer's curve, the ratio and its noise band."""

import pytest

from fairseq_capsagg.pipeline import equivalence
from fairseq_capsagg.pipeline.drivers.table1_rows import equivalence_rows

CURVE = [{"update": u, "loss": loss} for u, loss in ((500, 8.0), (1000, 7.0), (1500, 6.5), (2000, 6.6), (2500, 6.0))]


def test_the_update_that_reaches_a_loss_is_interpolated_between_validations():
    assert equivalence.updates_to_reach(CURVE, 7.0) == 1000  # a validation exactly there
    assert equivalence.updates_to_reach(CURVE, 7.5) == pytest.approx(750)
    assert equivalence.updates_to_reach(CURVE, 6.25) == pytest.approx(2000 + 500 * (6.6 - 6.25) / 0.6)  # first reached
    assert equivalence.updates_to_reach(CURVE, 9.0) == 500  # at or below already at the first validation
    assert equivalence.updates_to_reach(CURVE, 5.0) is None  # never


def test_rows_are_read_at_five_points_on_the_validation_grid():
    assert equivalence.checkpoints(5000, 500) == [1000, 2000, 3000, 4000, 5000]
    assert equivalence.checkpoints(20, 5) == [5, 10, 15, 20]
    assert equivalence.checkpoints(3000, 500) == [500, 1000, 1500, 2000, 2500, 3000]


def test_a_row_is_faster_only_above_the_transformers_band_against_every_run():
    other = [{"update": p["update"], "loss": p["loss"] + 0.1} for p in CURVE]
    references = {"run1": CURVE, "run2": other}
    band = equivalence.noise_band(references, [1000])
    # run 1's 7.0 is reached by run 2 between 1000 (7.1) and 1500 (6.6); run 2's 7.1 by run 1 between 500 and 1000
    assert band[1000] == pytest.approx((0.95, 1.1))
    row = [{"update": 1000, "loss": 6.5}]
    point = equivalence.row_equivalence(row, references, [1000], speed_ratio=0.5)[0]
    # run 2 first reaches 6.5 between 2000 (6.7) and 2500 (6.1), after its 6.6 at 1500 went up again
    assert point["reference_updates"] == {"run1": 1500.0, "run2": pytest.approx(2000 + 500 * 0.2 / 0.6)}
    low, high = point["updates_ratio"]
    assert (low, high) == pytest.approx((1.5, (2000 + 500 / 3) / 1000))
    assert point["seconds_ratio"] == pytest.approx([low * 0.5, high * 0.5])
    assert equivalence.faster(point, band) is True
    assert equivalence.faster(dict(point, updates_ratio=[1.05, 1.5]), band) is False  # one run inside the band
    assert equivalence.faster(dict(point, updates_ratio=None), band) is None
    assert equivalence.slower(point, band) is False
    assert equivalence.slower(dict(point, updates_ratio=[0.5, 0.9]), band) is True  # below 0.95 against both runs
    assert equivalence.slower(dict(point, updates_ratio=[0.5, 1.0]), band) is False  # one run inside the band
    assert equivalence.slower(dict(point, updates_ratio=None), band) is None
    assert equivalence.row_equivalence(row, references, [2000], None)[0]["updates_ratio"] is None  # not validated


def test_the_rows_are_the_transformers_other_seeds_then_each_system_and_the_second_seeds():
    rows = equivalence_rows(["hc", "baseline", "mudd"], second_seed=["mudd"])
    assert [r.name for r in rows] == ["scratch-baseline-s2", "scratch-baseline-s3", "scratch-hc-s1", "scratch-mudd-s1",
                                      "scratch-mudd-s2"]
    assert [r.seed for r in rows] == [2, 3, 1, 1, 2]
    assert {r.protocol for r in rows} == {"converged"} and {r.reference for r in rows} == {"scratch-baseline-s2"}
    assert [r.name for r in equivalence_rows(["hc"])] == ["scratch-hc-s1"]


def _points(*spans):
    """A row's measured points at 1,000 and 2,000 updates with these ratio spans (None: not validated there)."""
    return [{"update": u, "updates_ratio": None if s is None else list(s)} for u, s in zip((1000, 2000), spans)]


def test_the_seed_band_spans_the_transformers_seed_rows_and_the_runs_own_seed_against_every_run():
    measured = {"scratch-baseline-s2": _points((0.97, 1.01), (0.99, 1.02)),
                "scratch-baseline-s3": _points((1.02, 1.04), None), "scratch-hc-s1": _points((1.3, 1.4), (1.2, 1.3))}
    seeds = ["scratch-baseline-s2", "scratch-baseline-s3", "absent"]
    assert equivalence.seed_band(measured, seeds, [1000, 2000], {}) == {1000: (0.97, 1.04), 2000: (0.99, 1.02)}
    runs = {1000: (0.99, 1.00), 2000: (0.98, 1.03)}  # the runs on each other's curves: their own seed
    assert equivalence.seed_band(measured, seeds, [1000, 2000], runs) == {1000: (0.97, 1.04), 2000: (0.98, 1.03)}
    assert equivalence.seed_band(measured, [], [1000, 2000], runs) == {}  # no seed row: no seed band


def test_a_system_saves_updates_only_when_every_seed_is_above_every_transformer_seed():
    band = {1000: (0.97, 1.04), 2000: (0.99, 1.02)}
    measured = {"scratch-hc-s1": _points((1.3, 1.4), (1.2, 1.3)), "scratch-hc-s2": _points((1.0, 1.1), (1.1, 1.2))}
    summary = equivalence.seed_summary(measured, {"scratch-hc-s1": 1, "scratch-hc-s2": 2}, [1000, 2000], band)
    first, last = summary
    assert first["seeds"] == {"1": [1.3, 1.4], "2": [1.0, 1.1]} and first["span"] == [1.0, 1.4]
    assert first["mean"] == pytest.approx((1.35 + 1.05) / 2)
    assert (first["above"], first["below"]) == (False, False)  # seed 2 inside the band against one run
    assert (last["above"], last["below"]) == (True, False) and last["mean"] == pytest.approx(1.2)
    slow = equivalence.seed_summary({"scratch-dwa-s1": _points((0.8, 0.9), None)}, {"scratch-dwa-s1": 1},
                                    [1000, 2000], band)
    assert (slow[0]["above"], slow[0]["below"]) == (False, True)
    assert slow[1]["mean"] is None and slow[1]["above"] is None  # not validated there
    assert equivalence.seed_summary(measured, {"scratch-hc-s1": 1}, [1000, 2000], {})[1]["above"] is None  # no band


def test_the_table_reads_each_system_over_its_seeds_beside_the_transformers_seeds():
    from fairseq_capsagg.pipeline.reports import equivalence_report

    references = {"run1": CURVE, "run2": [{"update": p["update"], "loss": p["loss"] + 0.1} for p in CURVE]}
    rows = equivalence_rows(["baseline", "hc"], second_seed=["hc"])
    losses = {"scratch-baseline-s2": 7.05, "scratch-baseline-s3": 6.95, "scratch-hc-s1": 6.5, "scratch-hc-s2": 6.55}
    bleus = {"scratch-baseline-s2": 20.0, "scratch-baseline-s3": 20.4, "scratch-hc-s1": 21.0, "scratch-hc-s2": 20.6}
    results = {name: {"curve": [{"update": 1000, "loss": loss}], "bleu": bleus[name], "average": {"bleu": bleus[name] + 0.1},
                      "stopped_at": 1000, "best_loss": loss, "chrf": 50.0, "length_ratio": 1.0}
               for name, loss in losses.items()}
    table = equivalence_report.compute(rows, results, references, [1000], {})
    band = table["seed_band"]["1000"]
    transformer = [table["rows"][f"scratch-baseline-s{seed}"][0]["updates_ratio"] for seed in (2, 3)]
    transformer.append(table["noise_band"]["1000"])
    assert band == [min(t[0] for t in transformer), max(t[1] for t in transformer)]
    (hc,) = table["systems"]["hc"]
    assert set(hc["seeds"]) == {"1", "2"} and hc["above"] is True and hc["span"][0] > band[1]
    text = equivalence_report.format_body(rows, results, table)
    assert "| Transformer (seed band) | the runs, 2, 3 | " in text and "| 20.20 (20.00-20.40) | 20.30 (20.10-20.50) |" in text
    assert f"| + Hyper-connections | 1, 2 | {hc['mean']:.2f} (" in text
    assert "| saves updates | 20.80 (20.60-21.00) | 20.90 (20.70-21.10) |" in text
