"""benchmarks/traffic.py counts what Triton kernels load and store, lane by lane, and what an operator moves against
its ideal: exact on kernels whose traffic is known, a masked tail not counted, atomics read and written, tl.dot's
FLOPs, per-program partials reported above the ideal, and the counts extrapolated along a line."""

import pytest
import torch

pytest.importorskip("triton")

import traffic  # noqa: E402  (benchmarks/, on the path from tests/conftest.py)
import traffic_kernels as known  # noqa: E402  (tests/support/)


def test_a_copy_moves_twice_its_tensor_and_its_masked_tail_nothing():
    x, out = torch.randn(37), torch.empty(37)
    with traffic.InterpreterTraffic() as meter, meter.attributed("copy") as counts:
        known.copy_kernel[(3,)](x, out, 37, BLOCK=known.BLOCK)  # 48 lanes, 11 masked
    assert torch.equal(out, x)
    assert counts.kernel_loads == 37 * 4 and counts.kernel_stores == 37 * 4 and counts.launches == 1
    assert counts.dot_flops == 0 and counts.other_flops == 0


def test_the_element_size_is_the_pointers():
    x = torch.randn(20).to(torch.bfloat16)
    with traffic.InterpreterTraffic() as meter, meter.attributed("copy") as counts:
        known.copy_kernel[(2,)](x, torch.empty_like(x), 20, BLOCK=known.BLOCK)
    assert counts.kernel_loads == 20 * 2 and counts.kernel_stores == 20 * 2


def test_an_atomic_is_read_and_written_and_outside_a_label_counts_apart():
    x, total = torch.ones(21), torch.zeros(1)
    with traffic.InterpreterTraffic() as meter:
        known.atomic_sum_kernel[(2,)](x, total, 21, BLOCK=known.BLOCK)
    assert total.item() == 21
    counts = meter.counts[None]
    assert counts.kernel_loads == 21 * 4 + 21 * 4 and counts.kernel_stores == 21 * 4  # the x loads, the atomics


def test_a_tile_product_counts_its_flops_as_the_tensor_cores_and_its_tiles_once():
    a, b, out = torch.randn(16, 32), torch.randn(32, 16), torch.empty(16, 16)
    with traffic.InterpreterTraffic() as meter, meter.attributed("dot") as counts:
        known.dot_kernel[(1,)](a, b, out, M=16, N=16, K=32)
    torch.testing.assert_close(out, a @ b)
    assert counts.dot_flops == 2 * 16 * 16 * 32
    assert counts.kernel_loads == (16 * 32 + 32 * 16) * 4 and counts.kernel_stores == 16 * 16 * 4


def test_per_program_partials_are_reported_above_the_ideal():
    """64 rows of 8 columns: the kernels read x and write 4 partial rows, torch sums those; the ideal reads x and
    writes the sums."""
    x = torch.randn(64, 8)
    meter = traffic.InterpreterTraffic()
    with meter, traffic.OperatorTraffic(meter, namespace="capsagg_test"):
        got = known.column_sum(x)
    torch.testing.assert_close(got, x.sum(0))
    counts = meter.counts["column_sum/forward"]
    assert counts.kernel_loads == 64 * 8 * 4 and counts.kernel_stores == 4 * 8 * 4
    assert counts.torch_bytes == 4 * 8 * 4 + 8 * 4  # the sum reads the partials and writes the result
    assert counts.ideal == 64 * 8 * 4 + 8 * 4 and counts.calls == 1
    assert counts.over_ideal == pytest.approx((64 * 8 * 4 + 2 * 4 * 8 * 4 + 8 * 4) / (64 * 8 * 4 + 8 * 4))


def test_counts_are_fitted_along_a_line_and_a_bend_is_reported():
    line = {p: {"op/forward": traffic.Counts(kernel_loads=100 + 3 * p, ideal=2 * p, calls=2)} for p in (16, 32, 48)}
    at, deviation = traffic.fitted(line, 1000)
    assert at["op/forward"].kernel_loads == pytest.approx(3100) and at["op/forward"].ideal == pytest.approx(2000)
    assert at["op/forward"].calls == 2 and deviation < 1e-9
    line[48]["op/forward"].kernel_loads += 50
    assert traffic.fitted(line, 1000)[1] > 0.03


def test_an_argument_the_operator_writes_into_is_read_and_written_in_its_ideal():
    x, total = torch.randn(64, 8), torch.randn(8)
    meter = traffic.InterpreterTraffic()
    with meter, traffic.OperatorTraffic(meter, namespace="capsagg_test"):
        known.add_column_sum(x, total)
    counts = meter.counts["add_column_sum/forward"]
    assert counts.ideal == 64 * 8 * 4 + 2 * 8 * 4


@pytest.mark.parametrize("name", ["kernels-traffic", "kernels-traffic-before"])
def test_the_published_traffic_tables_are_what_the_meter_writes_from_their_json(name):
    published = traffic.Path(__file__).resolve().parents[2] / "docs" / "results"
    result = traffic.json.loads((published / f"{name}.json").read_text())
    assert traffic.markdown(result) == (published / f"{name}.md").read_text()


def test_results_md_compares_the_published_runs_as_the_meter_does():
    root = traffic.Path(__file__).resolve().parents[2]
    before, after = (traffic.json.loads((root / "docs" / "results" / f"{name}.json").read_text())
                     for name in ("kernels-traffic-before", "kernels-traffic"))
    assert traffic.comparison(before, after) in (root / "docs" / "results.md").read_text()
