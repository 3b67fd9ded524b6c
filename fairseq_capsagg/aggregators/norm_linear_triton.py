"""act(RMSNorm(x) W^T) in one Triton kernel each way (:mod:`.norm_linear`): the streams' dynamic weights.

Every row x (D) of a program's ``BLOCK_R`` rows is read once for its RMS and once for its K projections, in
chunks of ``BLOCK_D``; K (a few tens at most) is padded to the next power of two with zero weights. The
backward writes the rows' gradients and, per program, its share of W's gradient (summed over the programs
afterwards), so that no two programs add into the same memory.

Imported only where Triton is (CUDA machines; the tests run it on the CPU with ``TRITON_INTERPRET=1``).
"""

import torch
import triton
import triton.language as tl

BLOCK_R = 16
BLOCK_D = 64


@triton.jit
def _rows(rows, width, BLOCK_R: tl.constexpr):
    r = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    return r, r < rows


@triton.jit
def _inverse_rms(x_ptr, r, live, width, eps, BLOCK_R: tl.constexpr, BLOCK_D: tl.constexpr):
    total = tl.zeros((BLOCK_R,), dtype=tl.float32)
    for start in range(0, width, BLOCK_D):
        d = start + tl.arange(0, BLOCK_D)
        x = tl.load(x_ptr + r[:, None] * width + d[None, :], mask=live[:, None] & (d[None, :] < width),
                    other=0.0).to(tl.float32)
        total += tl.sum(x * x, axis=1)
    return 1.0 / tl.sqrt(total / width + eps)


@triton.jit
def _forward_kernel(x_ptr, w_ptr, out_ptr, rows, width, outputs, eps, TANH: tl.constexpr, K: tl.constexpr,
                    BLOCK_R: tl.constexpr, BLOCK_D: tl.constexpr):
    r, live = _rows(rows, width, BLOCK_R)
    k = tl.arange(0, K)
    inverse_rms = _inverse_rms(x_ptr, r, live, width, eps, BLOCK_R, BLOCK_D)
    acc = tl.zeros((BLOCK_R, K), dtype=tl.float32)
    for start in range(0, width, BLOCK_D):
        d = start + tl.arange(0, BLOCK_D)
        x = tl.load(x_ptr + r[:, None] * width + d[None, :], mask=live[:, None] & (d[None, :] < width),
                    other=0.0).to(tl.float32)
        w = tl.load(w_ptr + k[:, None] * width + d[None, :], mask=(k[:, None] < outputs) & (d[None, :] < width),
                    other=0.0).to(tl.float32)
        acc += tl.sum(x[:, None, :] * w[None, :, :], axis=2)
    pre = acc * inverse_rms[:, None]
    if TANH:
        pre = 2.0 / (1.0 + tl.exp(-2.0 * pre)) - 1.0
    tl.store(out_ptr + r[:, None] * outputs + k[None, :], pre, mask=live[:, None] & (k[None, :] < outputs))


@triton.jit
def _backward_kernel(grad_ptr, x_ptr, w_ptr, out_ptr, grad_x_ptr, grad_w_ptr, rows, width, outputs, eps,
                     TANH: tl.constexpr, K: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_D: tl.constexpr):
    r, live = _rows(rows, width, BLOCK_R)
    k = tl.arange(0, K)
    rk_live = live[:, None] & (k[None, :] < outputs)
    grad = tl.load(grad_ptr + r[:, None] * outputs + k[None, :], mask=rk_live, other=0.0).to(tl.float32)
    if TANH:  # through tanh: 1 - out^2
        out = tl.load(out_ptr + r[:, None] * outputs + k[None, :], mask=rk_live, other=0.0).to(tl.float32)
        grad = grad * (1.0 - out * out)
    inverse_rms = _inverse_rms(x_ptr, r, live, width, eps, BLOCK_R, BLOCK_D)
    # the normalised row's gradient g = grad W; RMSNorm's backward needs mean(g * normed) over the row first
    projected = tl.zeros((BLOCK_R,), dtype=tl.float32)
    for start in range(0, width, BLOCK_D):
        d = start + tl.arange(0, BLOCK_D)
        rd_live = live[:, None] & (d[None, :] < width)
        x = tl.load(x_ptr + r[:, None] * width + d[None, :], mask=rd_live, other=0.0).to(tl.float32)
        w = tl.load(w_ptr + k[:, None] * width + d[None, :], mask=(k[:, None] < outputs) & (d[None, :] < width),
                    other=0.0).to(tl.float32)
        g = tl.sum(grad[:, :, None] * w[None, :, :], axis=1)
        projected += tl.sum(g * x, axis=1)
    projected = projected * inverse_rms / width  # mean(g * normed)
    program = tl.program_id(0)
    for start in range(0, width, BLOCK_D):
        d = start + tl.arange(0, BLOCK_D)
        rd_live = live[:, None] & (d[None, :] < width)
        x = tl.load(x_ptr + r[:, None] * width + d[None, :], mask=rd_live, other=0.0).to(tl.float32)
        kd_live = (k[:, None] < outputs) & (d[None, :] < width)
        w = tl.load(w_ptr + k[:, None] * width + d[None, :], mask=kd_live, other=0.0).to(tl.float32)
        g = tl.sum(grad[:, :, None] * w[None, :, :], axis=1)
        normed = x * inverse_rms[:, None]
        grad_x = inverse_rms[:, None] * (g - normed * projected[:, None])
        tl.store(grad_x_ptr + r[:, None] * width + d[None, :], grad_x.to(grad_x_ptr.dtype.element_ty), mask=rd_live)
        grad_w = tl.sum(grad[:, :, None] * normed[:, None, :], axis=0)  # this program's share, (K, BLOCK_D)
        tl.store(grad_w_ptr + program * outputs * width + k[:, None] * width + d[None, :], grad_w, mask=kd_live)


def _meta(rows: int, outputs: int):
    return (triton.cdiv(rows, BLOCK_R),), triton.next_power_of_2(outputs)


def forward(x: torch.Tensor, weight: torch.Tensor, eps: float, tanh: bool) -> torch.Tensor:
    """act(RMSNorm(x) W^T), (R, K) fp32, from contiguous x (R, D) and fp32 W (K, D)."""
    rows, width = x.shape
    outputs = weight.size(0)
    out = torch.empty(rows, outputs, dtype=torch.float32, device=x.device)
    grid, k = _meta(rows, outputs)
    _forward_kernel[grid](x, weight, out, rows, width, outputs, eps, TANH=tanh, K=k, BLOCK_R=BLOCK_R, BLOCK_D=BLOCK_D)
    return out


def backward(grad: torch.Tensor, x: torch.Tensor, weight: torch.Tensor, out: torch.Tensor, eps: float, tanh: bool):
    """The gradients of x and W given ``grad`` of the forward's ``out``."""
    rows, width = x.shape
    outputs = weight.size(0)
    grid, k = _meta(rows, outputs)
    grad_x = torch.empty_like(x)
    shares = torch.empty(grid[0], outputs, width, dtype=torch.float32, device=x.device)
    _backward_kernel[grid](grad, x, weight, out, grad_x, shares, rows, width, outputs, eps, TANH=tanh, K=k,
                           BLOCK_R=BLOCK_R, BLOCK_D=BLOCK_D)
    return grad_x, shares.sum(0)
