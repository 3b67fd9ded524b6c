"""``analysis depth-weights``: which earlier layers the peers' connections read, over a data split.

For every connection of a dense-connection side (one after each block) and for a peer used as the
stack's output aggregator, the mean over real positions of the effective weight of each earlier
layer in each output stream: DenseFormer's alpha matrix, attention over depth's
g * alpha + (1 - g) on the newest layer, MUDD's dynamic weights, DLCL's W_l.
"""

import json
from pathlib import Path
from typing import Dict, List, Tuple

import torch
from torch import Tensor

from ..aggregators import MULTIWAY_STREAMS, LayerAggregator
from .plotting import plot_depth_weights

#: The names of a connection's output streams, by their number.
STREAM_NAMES = {1: ("output",), len(MULTIWAY_STREAMS): MULTIWAY_STREAMS}

#: ``"{side} between blocks"`` / ``"{side} output"`` -> the connections read there.
Connections = Dict[str, List[LayerAggregator]]


def peer_connections(model) -> Connections:
    """``"{side} between blocks"`` and ``"{side} output"`` -> the modules whose weights are read."""
    found: Connections = {}
    for side in ("encoder", "decoder"):
        stack = getattr(model, side)
        if getattr(stack, "dense_connections", None) is not None:
            found[f"{side} between blocks"] = list(stack.dense_connections.connections)
        if hasattr(getattr(stack, "aggregator", None), "effective_weights"):
            found[f"{side} output"] = [stack.aggregator]
    return found


class DepthWeightAccumulator:
    """Sums each connection's (S, L) effective weights over the real positions it aggregates."""

    def __init__(self, connections: List[LayerAggregator]):
        self.sums = [torch.zeros(c.streams, c.num_layers, dtype=torch.double) for c in connections]
        self.positions = 0

    def add(self, index: int, weights: Tensor, real: Tensor) -> None:
        """weights: (T, B, S, L); real: (T, B), True at positions that are not padding."""
        self.sums[index] += weights[real].double().sum(0)
        if index == 0:
            self.positions += int(real.sum())

    def summary(self, connections: List[LayerAggregator]) -> List[Dict[str, object]]:
        n = max(self.positions, 1)
        return [{"inputs": c.num_layers, "streams": {name: (total[s] / n).tolist()
                                                     for s, name in enumerate(STREAM_NAMES[c.streams])}}
                for c, total in zip(connections, self.sums)]


@torch.no_grad()
def collect_depth_weights(model, task, subset: str, max_tokens: int = 4000,
                          max_sentences: int = 0) -> Tuple[Connections, Dict[str, DepthWeightAccumulator]]:
    """Teacher-forced passes over ``subset``, reading every connection's weights through a hook."""
    found = peer_connections(model)
    if not found:
        raise ValueError("the model has no dense connections and no dwa, depth-attention or mudd aggregator")
    accumulators = {place: DepthWeightAccumulator(connections) for place, connections in found.items()}
    real: Dict[str, Tensor] = {}

    def reader(place: str, index: int):
        def hook(module, args, output):
            weights = module.effective_weights(module.stack(args[0]))
            accumulators[place].add(index, weights, real[place.split()[0]])
        return hook

    handles = [connection.register_forward_hook(reader(place, index))
               for place, connections in found.items() for index, connection in enumerate(connections)]
    task.load_dataset(subset)
    iterator = task.get_batch_iterator(dataset=task.dataset(subset), max_tokens=max_tokens, max_positions=None,
                                       ignore_invalid_inputs=True).next_epoch_itr(shuffle=False)
    pad = task.source_dictionary.pad()
    seen = 0
    try:
        for sample in iterator:
            net_input = sample["net_input"]
            real["encoder"] = net_input["src_tokens"].ne(pad).t()
            real["decoder"] = net_input["prev_output_tokens"].ne(task.target_dictionary.pad()).t()
            model(**net_input)
            seen += sample["nsentences"]
            if max_sentences and seen >= max_sentences:
                break
    finally:
        for handle in handles:
            handle.remove()
    return found, accumulators


def run(args) -> Dict[str, object]:
    from fairseq import checkpoint_utils

    from ..user_dir import USER_DIR

    models, _cfg, task = checkpoint_utils.load_model_ensemble_and_task(
        [str(args.path)], arg_overrides={"data": str(args.data), "user_dir": USER_DIR})
    model = models[0].eval()
    found, accumulators = collect_depth_weights(model, task, args.subset, args.max_tokens, args.max_sentences)
    result = {place: {"positions": accumulators[place].positions,
                      "connections": accumulators[place].summary(connections)}
              for place, connections in found.items()}
    out_dir = Path(args.output_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "depth-weights.json").write_text(json.dumps(result, indent=2))
    for place, summary in result.items():
        plot_depth_weights(summary["connections"], out_dir / f"depth-weights-{place.replace(' ', '-')}.png",
                           title=f"{place}: mean weight of each input (over {summary['positions']} "
                                 f"{args.subset} positions)")
    return result
