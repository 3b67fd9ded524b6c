"""EM routing's input activations A^H_l = logistic(H^_l . W^H_l + b_l) (Eq. 11, with the logistic
:class:`.EMRouting` adds), in fp32: the eager reference, and one fused operator each way
(``capsagg::input_activation``: one Triton kernel on CUDA, :mod:`..kernels.input_activation`; the reference and
:func:`reference_backward` inside the operator elsewhere). ``--connection-kernels`` picks; both compute the same
values and gradients. The operator reads the capsules and a bf16 model's W^H and b as they are and upcasts them as it
loads them, so that neither an fp32 copy of the capsules' product nor a cast of the weights runs each way."""

from typing import Tuple

import torch
from torch import Tensor

from .dispatch import runs_fused, triton_kernels


def activation_reference(capsules: Tensor, weight: Tensor, bias: Tensor) -> Tensor:
    """A^H (..., L) in fp32 from the input capsules (..., L, C), W^H (L, C) and b (L): the product promotes the
    capsules as it reads them, so that autograd saves the capsules themselves, not an fp32 copy."""
    return torch.sigmoid((capsules * weight.float()).sum(-1) + bias.float())


def reference_backward(grad: Tensor, act: Tensor, capsules: Tensor, weight: Tensor,
                       bias: Tensor) -> Tuple[Tensor, Tensor, Tensor]:
    """The gradients of the capsules (P, L, C), W^H and b from A^H's (P, L) and A^H, written out (autograd's values,
    without its graph), each in its input's precision."""
    grad_logit = grad * act * (1.0 - act)
    return ((grad_logit.unsqueeze(-1) * weight.float()).to(capsules.dtype),
            torch.einsum("pl,plc->lc", grad_logit, capsules.float()).to(weight.dtype), grad_logit.sum(0).to(bias.dtype))


@torch.library.custom_op("capsagg::input_activation", mutates_args=())
def _fused(capsules: Tensor, weight: Tensor, bias: Tensor) -> Tensor:
    kernels = triton_kernels(__name__, capsules)
    if kernels is not None:
        return kernels.forward(capsules, weight, bias)
    return activation_reference(capsules, weight, bias)


@_fused.register_fake
def _(capsules: Tensor, weight: Tensor, bias: Tensor) -> Tensor:
    return capsules.new_empty(capsules.shape[:2], dtype=torch.float32)


@torch.library.custom_op("capsagg::input_activation_backward", mutates_args=())
def _fused_backward(grad: Tensor, act: Tensor, capsules: Tensor, weight: Tensor,
                    bias: Tensor) -> Tuple[Tensor, Tensor, Tensor]:
    kernels = triton_kernels(__name__, capsules)
    if kernels is not None:
        return kernels.backward(grad, act, capsules, weight, bias)
    return reference_backward(grad, act, capsules, weight, bias)


@_fused_backward.register_fake
def _(grad: Tensor, act: Tensor, capsules: Tensor, weight: Tensor, bias: Tensor) -> Tuple[Tensor, Tensor, Tensor]:
    return torch.empty_like(capsules), torch.empty_like(weight), torch.empty_like(bias)


def _setup_context(ctx, inputs: Tuple[Tensor, Tensor, Tensor], output: Tensor) -> None:
    ctx.save_for_backward(*inputs, output)


def _backward(ctx, grad: Tensor) -> Tuple[Tensor, Tensor, Tensor]:
    capsules, weight, bias, act = ctx.saved_tensors
    return _fused_backward(grad.float().contiguous(), act, capsules, weight, bias)


_fused.register_autograd(_backward, setup_context=_setup_context)


def input_activation(capsules: Tensor, weight: Tensor, bias: Tensor, kernel: str = "auto") -> Tensor:
    """:func:`activation_reference` by the implementation ``kernel`` (:func:`.dispatch.runs_fused`), for capsules
    (..., L, C): A^H (..., L), fp32."""
    if not runs_fused(kernel, capsules):
        return activation_reference(capsules, weight, bias)
    layers, channels = capsules.shape[-2:]
    act = _fused(capsules.reshape(-1, layers, channels).contiguous(), weight.contiguous(), bias)
    return act.view(capsules.shape[:-1])
