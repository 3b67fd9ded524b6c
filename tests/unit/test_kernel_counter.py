"""benchmarks/kernels.py counts what a GPU would launch: every kernel-launching operator once, no view, no bare
allocation, and a training step without the CPU's own finite checks."""

import pytest
import torch
from kernels import KernelCounter  # benchmarks/, on the path from tests/conftest.py

from fairseq_capsagg.aggregators import build_aggregator
from fairseq_capsagg.aggregators.base import checks_finite, gpu_checks_only


def test_views_and_allocations_launch_nothing_and_arithmetic_counts_once_per_operator():
    x = torch.randn(4, 6)
    with KernelCounter() as counter:
        y = x.view(2, 12).t().unsqueeze(0).expand(3, 12, 2)  # views only
        torch.empty(5)
        z = (x * 2).sum(0)  # two kernels
    assert y.shape == (3, 12, 2) and z.shape == (6,)
    assert dict(counter.counts) == {"aten.mul": 1, "aten.sum": 1} and counter.total == 2


def test_under_gpu_checks_only_the_cpu_skips_the_finite_check_a_gpu_skips():
    assert checks_finite(torch.zeros(1))
    with gpu_checks_only():
        assert not checks_finite(torch.zeros(1))
        with torch.autograd.set_detect_anomaly(True):
            assert checks_finite(torch.zeros(1))  # anomaly detection checks everywhere, as on a GPU
    assert checks_finite(torch.zeros(1))


@pytest.mark.parametrize("checks", ["cpu", "gpu"])
def test_a_training_aggregate_costs_its_finite_check_only_on_the_cpu(checks):
    aggregator = build_aggregator("dwa", 8, 3).train()
    layers = [torch.randn(4, 2, 8) for _ in range(3)]
    with (gpu_checks_only() if checks == "gpu" else torch.enable_grad()):
        with KernelCounter() as counter:
            aggregator(layers)
    assert ("aten._local_scalar_dense" in counter.counts) == (checks == "cpu")  # the check reads its result back


def test_the_bytes_moved_are_what_each_operator_reads_and_writes():
    x = torch.randn(4, 6)
    w = torch.randn(6, 3, dtype=torch.float64)
    with KernelCounter() as counter:
        x.view(24).t()  # a view moves nothing
        y = x * 2  # reads x, writes y: 2 x 24 floats
    assert counter.bytes_moved == 2 * 24 * 4
    with KernelCounter() as counter:
        y.add_(x)  # in place: reads y and x, writes y, counted once
        x.to(torch.bfloat16)  # reads 24 floats, writes 24 bf16
        x.double() @ w  # the cast (24 floats in, 24 doubles out), then 24 + 18 doubles in and 12 out
        torch.zeros_like(w)  # a fill reads nothing: 18 doubles out
        x.new_ones(5)  # 5 floats out
    assert counter.bytes_moved == 2 * 24 * 4 + (24 * 4 + 24 * 2) + (24 * 4 + 24 * 8) + (24 + 18 + 12) * 8 \
        + 18 * 8 + 5 * 4
