"""Slow references of fairseq's encoder blocks and of the connections' stacks, and randomised parameters, for the
connection tests."""

from typing import List, Sequence

import torch

from fairseq_capsagg.aggregators.layer_history import LayerHistory


def randomise(module: torch.nn.Module, seed: int = 0) -> None:
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(0.5 * torch.randn(p.shape, generator=g))


def reference_block(layer, streams, padding_mask):
    """A fairseq encoder block fed separate query, key, value and residual inputs, as MUDDFormer's blocks."""
    query, key, value, residual = streams
    if layer.normalize_before:
        query, key, value = (layer.self_attn_layer_norm(x) for x in (query, key, value))
    attended = layer.self_attn.forward(query=query, key=key, value=value, key_padding_mask=padding_mask,
                                       need_weights=False)[0]
    h = residual + attended
    if not layer.normalize_before:
        h = layer.self_attn_layer_norm(h)
    y = layer.final_layer_norm(h) if layer.normalize_before else h
    out = h + layer.fc2(layer.activation_fn(layer.fc1(y)))
    return out if layer.normalize_before else layer.final_layer_norm(out)


def encoder_and_embedding(encoder, dictionary, lengths=(6, 3)):
    """A batch through ``encoder``: its output, its embedding output (T, B, C) with padding zeroed, as the
    first block reads it, and the padding mask (B, T)."""
    from helpers import random_tokens

    src = random_tokens(dictionary, list(lengths), seed=1)
    padding_mask = src.eq(dictionary.pad())
    with torch.no_grad():
        got = encoder(src, src_lengths=(~padding_mask).sum(1))["encoder_out"][0]
        x, _ = encoder.forward_embedding(src)
    return got, (x * (1 - padding_mask.unsqueeze(-1).type_as(x))).transpose(0, 1), padding_mask


class StackPerConnection(LayerHistory):
    """The reference: each connection stacks every layer given so far (a copy per connection), autograd adds up
    each layer's gradients."""

    def __init__(self, depth: int):
        super().__init__(depth)
        self.layers: List[torch.Tensor] = []

    def extend(self, layers: Sequence[torch.Tensor]) -> torch.Tensor:
        self.layers += layers
        return torch.stack(self.layers)
