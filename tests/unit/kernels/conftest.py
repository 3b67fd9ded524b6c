"""The kernel tests' fixtures: the backwards that split the positions into ranges (their weights' gradients one
share a range) run with two ranges here, which Triton's interpreter runs in a fraction of the time of the 32 a GPU
gets; the shares are summed the same way at any count (the launched models, tests/integration, run 32)."""

import pytest


@pytest.fixture(autouse=True)
def two_ranges_of_positions(monkeypatch):
    pytest.importorskip("triton")
    from fairseq_capsagg.aggregators.kernels import hyper_read, mhc_read, mudd_aggregate

    for kernels in (hyper_read, mhc_read, mudd_aggregate):
        monkeypatch.setattr(kernels, "SPLITS", 2)
