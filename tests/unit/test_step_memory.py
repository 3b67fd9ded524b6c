"""benchmarks/memory.py counts what a step's tensors hold: each storage once from its allocation until it is
freed, views nothing, the peak of what was held at once."""

import torch
from memory import PeakMemory, training_step_peak_memory  # benchmarks/, on the path from tests/conftest.py

from helpers import build_tiny_model, random_tokens


def test_each_storage_counts_from_its_allocation_until_it_is_freed_and_views_count_nothing():
    with PeakMemory() as memory:
        a = torch.ones(1000)  # 4,000 bytes
        view = a.view(10, 100).t()
        b = a * 2
        assert memory.live == 8000
        del a, b
        assert memory.live == 4000  # the view keeps a's storage
        del view
        c = torch.zeros(500, dtype=torch.float64)
    assert (memory.live, memory.peak) == (4000, 8000) and c.numel() == 500


def test_tensors_autograd_saves_are_held_until_the_backward_frees_them():
    x = torch.randn(1000, requires_grad=True)
    with PeakMemory() as memory:
        y = x * 2
        z = y.sin()  # sin saves its input y
        del y
        forward = memory.live
        z.sum().backward()
        del z
    assert forward == 8000 and memory.live == 4000  # y held by autograd until the backward; x.grad stays
    assert memory.peak >= 12000  # y, z and the backward's gradients


def test_a_training_step_peak_is_deterministic_and_grows_with_the_batch():
    model, dictionary = build_tiny_model("transformer_dwa_base")
    peaks = []
    for sentences in (2, 2, 4):
        src = random_tokens(dictionary, [6] * sentences, seed=1)
        prev = random_tokens(dictionary, [6] * sentences, seed=2, bos=True)
        peaks.append(training_step_peak_memory(model, src, src.ne(dictionary.pad()).sum(1), prev, prev))
    assert peaks[0] == peaks[1] and peaks[2] > 1.5 * peaks[0]
