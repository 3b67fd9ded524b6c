"""A Triton kernel that Triton's interpreter runs and its compiler refuses (it reads a module global that is not a
constexpr): tests/integration/test_compiled_kernels.py checks that the compile check catches it."""

import triton
import triton.language as tl

_SCALE = 0.5


@triton.jit
def global_scale_kernel(x_ptr, n, BLOCK: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offsets, mask=offsets < n)
    tl.store(x_ptr + offsets, x * _SCALE, mask=offsets < n)
