"""Initialisation health of every architecture, on a real batch, before any training.

    capsagg-health --data DATA-BIN                         # every family at every shape
    capsagg-health --data DATA-BIN --shapes small --model-args "--routing-init identity"
    capsagg-health --data DATA-BIN --path checkpoints/checkpoint_best.pt   # a trained model, as it is

For each architecture the model is built at its defaults with the Transformer weights of the
vanilla model of the same shape and seed (the aggregators freshly initialised), and one batch of
the ``valid`` split goes forward and backward (dropout off). Reported per architecture:

* ``aggregate_std`` and ``normalised_std``: the std of each side's output before and after its
  final LayerNorm (post-norm sides: the LayerNorm of a routed aggregate; linear and dynamic
  combination and the dense connections have none there, and their aggregate is the output; a
  post-norm Transformer side has none either, and its top layer's output is reported), and ``eps_share``,
  eps / (var + eps) of that LayerNorm's denominator: near 1, the aggregate is swamped by eps
  and the side's output is nearly constant;
* ``layer_grad_ratio``: the gradient norm that reaches the Transformer layers (every parameter
  of ``encoder.layers`` and ``decoder.layers``) divided by the vanilla model's on the same batch;
* ``aggregator_grad_share``: the aggregation modules' share of the squared gradient norm of the
  whole model, and ``grad_norm``, the whole model's gradient norm (``--clip-norm`` clips above it);
* ``agreement_entropy`` (routing families): the entropy of the agreement C_{l->n} of the last
  routing iteration over the N output capsules, averaged over the real positions and divided by
  ln N: 1 is uniform routing, 0 sends every input capsule to a single output capsule (with
  ``--routing-softmax input``: over the L input capsules, divided by ln L);
* ``stream_gain`` (hyper-connections, mHC): the composite signal gain over depth of a side's residual
  streams, the largest absolute row or column sum of the product of its blocks' stream-mixing
  matrices, the largest over the batch's real positions: 1 for a Transformer's single stream and at
  the start; mHC keeps it near 1 by construction, hyper-connections' can grow with training;
* ``loss``: label-smoothed cross-entropy per target token in bits (ln |V| / ln 2 is uniform).

With ``--path`` the same batch goes through a trained checkpoint as it is (no vanilla comparison),
this plugin's or fairseq's own ``transformer`` (the tables' baselines).
"""

import argparse
import json
import math
from typing import Dict, Iterable, List, Optional, Sequence, Tuple

import torch
from fairseq import tasks

from ..aggregators import families
from ..models import SHAPES, CapsAggTransformerModel
from ..models.aggregating_stack import AGGREGATION_MODULES
from ..models.build import model_args
from ..models.dense_connections import ResidualStreams
from ..tools.arguments import check_checkpoint, check_data_bin
from .agreement import AgreementAccumulator, routing_modules


def parse_model_args(arch: str, data: str, extra: Sequence[str] = (), vanilla: bool = False) -> argparse.Namespace:
    """The training arguments of ``arch``; with ``vanilla``, of the same shape with both sides
    unaggregated (and so without a ramp or per-layer norms)."""
    args = model_args(arch, ["--criterion", "label_smoothed_cross_entropy", "--label-smoothing", "0.1", *extra],
                      data=data)
    if vanilla:
        args.encoder_aggregation = args.decoder_aggregation = "none"
        args.encoder_dense_connections = args.decoder_dense_connections = "none"
        args.aggregation_ramp_updates, args.aggregation_layer_norm = 0, "off"
    return args


def first_batch(task, max_tokens: int) -> Dict:
    """The first batch of the validation split, unshuffled (the same for every model checked)."""
    task.load_dataset("valid")
    iterator = task.get_batch_iterator(dataset=task.dataset("valid"), max_tokens=max_tokens,
                                       ignore_invalid_inputs=True, seed=1)
    return next(iter(iterator.next_epoch_itr(shuffle=False)))


def _norm(grads: Iterable[torch.Tensor]) -> float:
    return math.sqrt(sum(float(g.double().pow(2).sum()) for g in grads))


def capture_stream_mixing(model) -> Tuple[Dict[str, List[torch.Tensor]], List[object]]:
    """Hooks that record every block's stream-mixing matrices (T, B, n, n) on sides with residual streams."""
    captured: Dict[str, List[torch.Tensor]] = {}
    hooks = []
    for side, stack in (("encoder", model.encoder), ("decoder", model.decoder)):
        streams = getattr(stack, "dense_connections", None)  # fairseq's own Transformer has none
        if isinstance(streams, ResidualStreams):
            captured[side] = []

            def record(block, args, kwargs, side=side, streams=streams):  # after the streams' own pre-hook
                positions, n = streams.streams.shape[:2], streams.streams.shape[2]
                mix = streams.weights[0]  # (r, b) of the block's write
                captured[side].append(mix.detach().float().expand(*positions, n, n))

            hooks += [layer.register_forward_pre_hook(record, with_kwargs=True) for layer in stack.layers]
    return captured, hooks


def composite_gain(mixing: List[torch.Tensor], real: torch.Tensor) -> float:
    """The largest absolute row or column sum of the blocks' mixing matrices multiplied over depth, the
    largest over the real positions ``real`` (T, B)."""
    composite = mixing[0]
    for mix in mixing[1:]:
        composite = composite @ mix
    rows, columns = composite.abs().sum(-1).amax(-1), composite.abs().sum(-2).amax(-1)
    return float(torch.maximum(rows, columns)[real].max())


def watch_output(side: str, stack, outputs: Dict[str, Dict[str, float]]):
    """A forward hook on what ``stack`` (one side of the model) hands on, writing into ``outputs[side]`` its
    standard deviation and, through the LayerNorm that ends the side if there is one, the normalised one and
    the share of that norm's variance that is its epsilon. Returns the hook's handle."""
    # pre-norm: the final LayerNorm; post-norm: the routed aggregate's LayerNorm, if any
    norm = stack.layer_norm if stack.layer_norm is not None else getattr(stack, "aggregate_norm", None)

    def after_norm(module, inputs, output):
        aggregate = inputs[0].detach().float()
        var = aggregate.var(dim=-1, unbiased=False).mean()
        outputs[side] = {"aggregate_std": float(aggregate.std()),
                         "normalised_std": float(output.detach().float().std()),
                         "eps_share": float(module.eps / (var + module.eps))}

    def without_norm(module, inputs, output):
        output = output[0] if isinstance(output, tuple) else output  # a decoder layer's (x, attn, state)
        outputs[side] = {"aggregate_std": float(output.detach().float().std()), "normalised_std": float("nan"),
                         "eps_share": float("nan")}

    if norm is not None:
        return norm.register_forward_hook(after_norm)
    if getattr(stack, "aggregates", False):
        return stack.aggregator.register_forward_hook(without_norm)
    if getattr(stack, "dense_connections", None) is not None:
        return stack.dense_connections.connections[-1].register_forward_hook(without_norm)
    # a post-norm Transformer side (ours or fairseq's own): its output is its top layer's
    return stack.layers[-1].register_forward_hook(without_norm)


def agreement_entropies(routing: Dict[str, torch.nn.Module], outputs: Dict[str, Dict[str, float]]) -> None:
    """The routing's agreement entropy of the last iteration on each side, over its maximum (log of the number of
    capsules to choose from), into ``outputs[side]``; the captured agreement is cleared."""
    for side, module in routing.items():
        accumulator = AgreementAccumulator()
        accumulator.add(module)
        module.agreement = []
        if accumulator.entropy_choices > 1:  # one capsule to choose from: nothing to route
            outputs[side]["agreement_entropy"] = (accumulator.summary()["entropy"][-1]
                                                  / math.log(accumulator.entropy_choices))


def forward_backward(model, criterion, sample) -> Dict[str, object]:
    """One forward and backward pass; returns the output statistics and gradient norms."""
    outputs: Dict[str, Dict[str, float]] = {}
    hooks = [watch_output("encoder", model.encoder, outputs), watch_output("decoder", model.decoder, outputs)]
    mixing, mixing_hooks = capture_stream_mixing(model)
    hooks += mixing_hooks
    routing = routing_modules(model)
    model.eval()
    model.zero_grad()
    for module in routing.values():
        module.capture_agreement = True
    try:
        loss, sample_size, _ = criterion(model, sample)
    finally:
        for module in routing.values():
            module.capture_agreement = False
        for hook in hooks:
            hook.remove()
    agreement_entropies(routing, outputs)
    pad = model.encoder.padding_idx
    positions = {"encoder": sample["net_input"]["src_tokens"], "decoder": sample["net_input"]["prev_output_tokens"]}
    for side, mixes in mixing.items():
        outputs[side]["stream_gain"] = composite_gain(mixes, positions[side].ne(pad).t())
    (loss / sample_size).backward()
    named = [(name, p.grad) for name, p in model.named_parameters() if p.grad is not None]
    layers = [g for name, g in named if name.split(".")[1:2] == ["layers"]]
    aggregation = [g for name, g in named if name.split(".")[1:2][0] in AGGREGATION_MODULES]
    total = _norm(g for _, g in named)
    return {"loss": loss.item() / sample_size / math.log(2), "outputs": outputs, "grad_norm": total,
            "layer_grad_norm": _norm(layers),
            "aggregator_grad_share": (_norm(aggregation) / total) ** 2 if total else 0.0}


def health_report(archs: List[str], data: str, extra: Sequence[str] = (), seed: int = 1,
                  max_tokens: int = 2048) -> Dict[str, Dict[str, object]]:
    """The report of every architecture in ``archs`` (and of its vanilla counterpart)."""
    report: Dict[str, Dict[str, object]] = {}
    task = sample = criterion = None
    vanilla: Dict[str, Dict[str, object]] = {}
    for arch in archs:
        args = parse_model_args(arch, data, extra)
        if task is None:
            task = tasks.setup_task(args)
            criterion = task.build_criterion(args)
            sample = first_batch(task, max_tokens)
        torch.manual_seed(seed)
        base_args = parse_model_args(arch, data, extra, vanilla=True)
        base_key = json.dumps({k: v for k, v in sorted(vars(base_args).items()) if k != "arch"}, default=str)
        base_model = CapsAggTransformerModel.build_model(base_args, task)
        if base_key not in vanilla:
            vanilla[base_key] = forward_backward(base_model, criterion, sample)
        torch.manual_seed(seed)
        model = CapsAggTransformerModel.build_model(args, task)
        model.load_state_dict(base_model.state_dict(), strict=True)  # fills the aggregation modules' keys
        result = forward_backward(model, criterion, sample)
        result["layer_grad_ratio"] = result["layer_grad_norm"] / vanilla[base_key]["layer_grad_norm"]
        result["vanilla_loss"] = vanilla[base_key]["loss"]
        report[arch] = result
    return report


def checkpoint_report(path: str, data: str, max_tokens: int = 2048) -> Dict[str, Dict[str, object]]:
    """The report of a trained checkpoint as it is, on the first batch of ``data``'s valid split."""
    from fairseq import checkpoint_utils

    from ..user_dir import USER_DIR

    models, cfg, task = checkpoint_utils.load_model_ensemble_and_task(
        [path], arg_overrides={"data": data, "user_dir": USER_DIR})
    criterion = task.build_criterion(cfg.criterion)
    return {path: forward_backward(models[0], criterion, first_batch(task, max_tokens))}


def format_report(report: Dict[str, Dict[str, object]]) -> str:
    """The health report in Markdown: one line per architecture and aggregating side."""
    lines = ["| architecture | loss (bits) | side | aggregate std | after LayerNorm | eps share "
             "| agreement entropy / ln N | stream gain | layer grad / vanilla | aggregator grad share | grad norm |",
             "|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for arch, r in report.items():
        vanilla = f" (vanilla {r['vanilla_loss']:.3f})" if "vanilla_loss" in r else ""
        ratio = f"{r['layer_grad_ratio']:.2f}" if "layer_grad_ratio" in r else "–"
        for side, out in r["outputs"].items():
            entropy = f"{out['agreement_entropy']:.2f}" if "agreement_entropy" in out else "–"
            gain = f"{out['stream_gain']:.3g}" if "stream_gain" in out else "–"
            lines.append(f"| {arch} | {r['loss']:.3f}{vanilla} | {side} "
                         f"| {out['aggregate_std']:.3g} | {out['normalised_std']:.3g} | {out['eps_share']:.2g} "
                         f"| {entropy} | {gain} "
                         f"| {ratio} | {r['aggregator_grad_share']:.2f} | {r['grad_norm']:.2f} |")
    return "\n".join(lines)


def cli_main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="capsagg-health", description=__doc__.splitlines()[0])
    parser.add_argument("--data", required=True, help="a fairseq data-bin with a valid split")
    parser.add_argument("--shapes", nargs="+", choices=tuple(SHAPES), default=list(SHAPES),
                        help="the shapes of every family (default all)")
    parser.add_argument("--families", nargs="+", choices=tuple(families()), default=list(families()),
                        help="the families (default all)")
    parser.add_argument("--model-args", default="", help="extra model flags for every architecture")
    parser.add_argument("--seed", type=int, default=1, help="the seed every model is built with (default 1)")
    parser.add_argument("--max-tokens", type=int, default=2048, help="tokens of the one batch (default 2048)")
    parser.add_argument("--path", default=None, help="a trained checkpoint: its report as it is, instead of "
                                                     "every architecture at init")
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    args = parser.parse_args(argv)
    check_data_bin(parser, args.data)
    if args.path:
        check_checkpoint(parser, args.path)
        report = checkpoint_report(args.path, args.data, args.max_tokens)
    else:
        archs = [f"transformer_{family}_{shape}" for shape in args.shapes for family in args.families]
        report = health_report(archs, args.data, args.model_args.split(), args.seed, args.max_tokens)
    print(json.dumps(report, indent=2) if args.json else format_report(report))
    return 0


if __name__ == "__main__":
    raise SystemExit(cli_main())
