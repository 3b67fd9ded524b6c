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


def test_the_rows_are_one_per_system_from_scratch():
    rows = equivalence_rows(["hc", "baseline", "mudd"])
    assert [r.name for r in rows] == ["scratch-baseline-s1", "scratch-hc-s1", "scratch-mudd-s1"]
    assert {r.protocol for r in rows} == {"converged"} and {r.reference for r in rows} == {"scratch-baseline-s1"}
