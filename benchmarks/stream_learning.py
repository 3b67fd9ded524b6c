#!/usr/bin/env python
"""Whether a stream family's mixing learns from its start: a few hundred Adam steps on a toy task (reverse a random
token sequence), then, per block, how far its residual mixing H_res has moved from the identity and the gradients
its weights received.

A start that is the identity must still learn: a saturated softmax or Sinkhorn has no gradient, and a gate that
closes leaves the block at the identity. This measures both on the model a user trains (``transformer_{family}_small``,
eager kernels, dropout 0.1), the same seed for every family.

    python benchmarks/stream_learning.py --families hc mhc --steps 300
"""

import argparse
import json
import math
import sys
from typing import Dict, List, Sequence

import torch

from fairseq_capsagg.models.build import build_model, joined_dictionary, model_args

#: Symbols of the toy task's vocabulary beyond fairseq's four special ones.
WORDS = 20


def reversal_batch(dictionary, batch: int, length: int, generator: torch.Generator):
    """Sources of ``length`` random words and EOS; targets the words reversed and EOS; previous-output tokens
    EOS and the target shifted right."""
    words = torch.randint(dictionary.nspecial, len(dictionary), (batch, length), generator=generator)
    eos = torch.full((batch, 1), dictionary.eos())
    source = torch.cat([words, eos], 1)
    target = torch.cat([words.flip(1), eos], 1)
    previous = torch.cat([eos, words.flip(1)], 1)
    return source, torch.full((batch,), length + 1), previous, target


def stream_connections(model) -> List:
    """The stream connections of both sides, encoder first."""
    return [c for side in (model.encoder, model.decoder) for c in side.dense_connections.connections]


def record_mixing(connections) -> Dict[int, List[torch.Tensor]]:
    """Wraps each connection's ``weights`` so that every H_res it computes is kept (detached, fp32)."""
    seen: Dict[int, List[torch.Tensor]] = {index: [] for index in range(len(connections))}
    for index, connection in enumerate(connections):
        original = connection.weights

        def weights(streams, original=original, index=index):
            out = original(streams)
            seen[index].append(out[1].detach().float())
            return out

        connection.weights = weights
    return seen


def mixing_report(first: torch.Tensor, last: torch.Tensor) -> Dict[str, float]:
    """H_res (..., n, n) of the last step: its distance from I (mean Frobenius norm over positions), its largest
    off-diagonal entry, and how far its mean over positions moved from the first step's."""
    n = last.size(-1)
    eye = torch.eye(n)
    flat = last.reshape(-1, n, n)
    off = flat * (1 - eye)
    moved = flat.mean(0) - first.reshape(-1, n, n).mean(0)
    return {"distance": (flat - eye).flatten(1).norm(dim=1).mean().item(), "max_off_diagonal": off.abs().max().item(),
            "moved": moved.norm().item()}


def doubly_stochastic_part(grad: torch.Tensor) -> torch.Tensor:
    """The part of an n x n gradient along doubly stochastic matrices: with its row and column means removed (the
    directions in which a matrix keeps its row and column sums)."""
    return grad - grad.mean(0, keepdim=True) - grad.mean(1, keepdim=True) + grad.mean()


def gradient_norms(connection) -> Dict[str, float]:
    """The gradient norm of each of the connection's weights (0 for one without a gradient); for a hyper-connection's
    static H_res also that of its doubly stochastic part (``static_mix (doubly stochastic part)``), the part that
    mHC's H_res can follow."""
    norms = {name: (p.grad.norm().item() if p.grad is not None else 0.0) for name, p in connection.named_parameters()}
    mix = getattr(connection, "static_mix", None)
    if mix is not None and mix.grad is not None:
        norms["static_mix (doubly stochastic part)"] = doubly_stochastic_part(mix.grad).norm().item()
    return norms


def train(family: str, steps: int, lr: float, warmup: int, seed: int, shape: str = "small",
          extra: Sequence[str] = ()) -> Dict[str, object]:
    """``steps`` Adam steps of ``transformer_{family}_{shape}`` (with ``extra`` flags) on the reversal task; per
    block, the gate where the family has one, H_res's distance from I on the last batch and each weight's gradient
    norm averaged over the steps."""
    torch.manual_seed(seed)
    dictionary = joined_dictionary(WORDS + 4)
    args = model_args(f"transformer_{family}_{shape}",
                      ["--connection-kernels", "eager", "--dropout", "0.1", *extra])
    model = build_model(args, dictionary).train()
    connections = stream_connections(model)
    seen = record_mixing(connections)
    optimizer = torch.optim.Adam(model.parameters(), lr=lr, betas=(0.9, 0.98))
    generator = torch.Generator().manual_seed(seed)
    grads = [{} for _ in connections]
    loss = math.nan
    first = {}
    for step in range(1, steps + 1):
        for group in optimizer.param_groups:
            group["lr"] = lr * min(1.0, step / warmup)
        source, lengths, previous, target = reversal_batch(dictionary, 32, 10, generator)
        for records in seen.values():
            records.clear()
        logits, _ = model(source, lengths, previous)
        loss_tensor = torch.nn.functional.cross_entropy(logits.flatten(0, 1), target.flatten())
        optimizer.zero_grad()
        loss_tensor.backward()
        if step == 1:
            first = {index: torch.cat([m.reshape(-1, *m.shape[-2:]) for m in records]) for index, records in seen.items()}
        for index, connection in enumerate(connections):
            for name, value in gradient_norms(connection).items():
                grads[index][name] = grads[index].get(name, 0.0) + value / steps
        optimizer.step()
        loss = loss_tensor.item()
    blocks = []
    for index, connection in enumerate(connections):
        block = {"side": "encoder" if index < len(model.encoder.layers) else "decoder",
                 **mixing_report(first[index], torch.cat([m.reshape(-1, *m.shape[-2:]) for m in seen[index]])),
                 "mean_gradient_norms": grads[index]}
        if hasattr(connection, "gate"):
            block["gate"] = connection.gate.item()
        blocks.append(block)
    return {"family": family, "steps": steps, "loss": loss, "blocks": blocks}


def summary(result: Dict[str, object]) -> str:
    """One line per family: the loss and the ranges over blocks of H_res's distance from I, its largest
    off-diagonal entry, the gate and the H_res weights' gradient norms."""
    blocks = result["blocks"]

    def span(values) -> str:
        values = list(values)
        return f"{min(values):.2g}-{max(values):.2g}"

    line = (f"{result['family']}: loss {result['loss']:.3f} | H_res from I {span(b['distance'] for b in blocks)}, "
            f"largest off-diagonal {span(b['max_off_diagonal'] for b in blocks)}, "
            f"moved {span(b['moved'] for b in blocks)}")
    if "gate" in blocks[0]:
        line += f" | gate {span(b['gate'] for b in blocks)}"
    for name in ("res_logits", "static_mix", "static_mix (doubly stochastic part)", "phi.weight",
                 "dynamic_read_mix.weight"):
        if name in blocks[0]["mean_gradient_norms"]:
            line += f" | grad {name} {span(b['mean_gradient_norms'][name] for b in blocks)}"
    return line


def main(argv: Sequence[str] = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--families", nargs="+", default=["hc", "mhc"])
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--lr", type=float, default=2e-3)
    parser.add_argument("--warmup", type=int, default=50)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--json", help="write every block's figures here")
    args = parser.parse_args(argv)
    results = [train(family, args.steps, args.lr, args.warmup, args.seed) for family in args.families]
    for result in results:
        print(summary(result))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    sys.exit(main())
