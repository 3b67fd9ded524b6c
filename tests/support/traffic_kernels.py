"""Triton kernels whose traffic is known, for tests/unit/test_traffic.py: a copy with a masked tail, an atomic
accumulation, a tile product, and an operator that writes a full-size partial per program and sums them with torch
(what the traffic meter must report above the operator's ideal)."""

import torch
import triton
import triton.language as tl
from torch import Tensor

#: Elements per program of the copy and the column sums.
BLOCK = 16


@triton.jit
def copy_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(out_ptr + offsets, tl.load(x_ptr + offsets, mask=offsets < n), mask=offsets < n)


@triton.jit
def atomic_sum_kernel(x_ptr, total_ptr, n, BLOCK: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.atomic_add(total_ptr + offsets * 0, tl.load(x_ptr + offsets, mask=offsets < n), mask=offsets < n)


@triton.jit
def dot_kernel(a_ptr, b_ptr, out_ptr, M: tl.constexpr, N: tl.constexpr, K: tl.constexpr):
    m, n, k = tl.arange(0, M), tl.arange(0, N), tl.arange(0, K)
    a = tl.load(a_ptr + m[:, None] * K + k[None, :])
    b = tl.load(b_ptr + k[:, None] * N + n[None, :])
    tl.store(out_ptr + m[:, None] * N + n[None, :], tl.dot(a, b))


@triton.jit
def column_partials_kernel(x_ptr, partials_ptr, rows, COLUMNS: tl.constexpr, BLOCK: tl.constexpr):
    """Each program sums its BLOCK rows of x (rows, COLUMNS) into its own full row of partials."""
    program = tl.program_id(0)
    r = program * BLOCK + tl.arange(0, BLOCK)
    c = tl.arange(0, COLUMNS)
    x = tl.load(x_ptr + r[:, None] * COLUMNS + c[None, :], mask=(r < rows)[:, None], other=0.0)
    tl.store(partials_ptr + program * COLUMNS + c, tl.sum(x, axis=0))


@torch.library.custom_op("capsagg_test::column_sum", mutates_args=())
def column_sum(x: Tensor) -> Tensor:
    """x.sum(0) of contiguous fp32 (rows, columns): per-program partials, then their torch sum."""
    programs = triton.cdiv(x.size(0), BLOCK)
    partials = torch.empty(programs, x.size(1), dtype=x.dtype)
    column_partials_kernel[(programs,)](x, partials, x.size(0), COLUMNS=x.size(1), BLOCK=BLOCK)
    return partials.sum(0)


@column_sum.register_fake
def _(x: Tensor) -> Tensor:
    return x.new_empty(x.size(1))


@torch.library.custom_op("capsagg_test::add_column_sum", mutates_args=("total",))
def add_column_sum(x: Tensor, total: Tensor) -> None:
    """total += x.sum(0): an operator that accumulates into its argument."""
    total.add_(column_sum(x))
