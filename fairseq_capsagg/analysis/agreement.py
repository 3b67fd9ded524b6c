"""``analysis agreement``: agreement heatmaps, entropy and diversity over a data split."""

import json
from pathlib import Path
from typing import Dict, List

import torch

from ..aggregators import CapsuleRouting, EMRouting
from .statistics import agreement_diversity, agreement_entropy


#: Output capsule lengths |Omega_n| (squash keeps them below 1) counted as dead or saturated.
DEAD_CAPSULE, SATURATED_CAPSULE = 0.05, 0.9


class AgreementAccumulator:
    """Sums per-iteration agreement statistics of one routing module over real positions."""

    def __init__(self):
        self.positions = 0
        self.mean_agreement: List[torch.Tensor] = []
        self.entropy: List[float] = []
        self.diversity: List[float] = []
        self.output_activation: List[float] = []
        self.entropy_over = "output capsules"
        self.entropy_choices = 0  # the size of that axis: ln of it is the entropy of uniform agreement
        #: dynamic routing: summed |Omega_n| and the counts of dead (< 0.05) and saturated (> 0.9) capsules
        self.capsule_length = {"sum": 0.0, "dead": 0.0, "saturated": 0.0, "count": 0}

    def add(self, module: CapsuleRouting) -> None:
        self.entropy_over = f"{module.routing_softmax} capsules"
        real = None
        if module.captured_padding_mask is not None:
            real = ~module.captured_padding_mask.transpose(0, 1)  # (T, B)
        count = 0
        for it, c in enumerate(module.agreement):
            c = c if real is None else c[real]
            c = c.reshape(-1, *c.shape[-2:])
            count = c.shape[0]
            if len(self.mean_agreement) <= it:
                self.mean_agreement.append(torch.zeros(c.shape[-2:], dtype=torch.double))
                self.entropy.append(0.0)
                self.diversity.append(0.0)
            self.mean_agreement[it] += c.double().sum(0)
            # entropy over the axis C sums to 1 over: output capsules (the paper's), or input capsules
            self.entropy[it] += agreement_entropy(c.transpose(module.agreement_dim, -1)).sum().item()
            self.entropy_choices = c.shape[module.agreement_dim]
            self.diversity[it] += agreement_diversity(c).sum().item()
        lengths = getattr(module, "capsule_lengths", None)
        if lengths is not None and lengths.numel():
            lengths = (lengths if real is None else lengths[real]).double()
            self.capsule_length["sum"] += lengths.sum().item()
            self.capsule_length["dead"] += (lengths < DEAD_CAPSULE).sum().item()
            self.capsule_length["saturated"] += (lengths > SATURATED_CAPSULE).sum().item()
            self.capsule_length["count"] += lengths.numel()
        if isinstance(module, EMRouting):
            for it, a in enumerate(module.output_activations):
                a = a if real is None else a[real]
                if len(self.output_activation) <= it:
                    self.output_activation.append(0.0)
                self.output_activation[it] += a.double().mean(-1).sum().item()
        self.positions += count

    def summary(self) -> Dict[str, object]:
        n = max(self.positions, 1)
        out = {"positions": self.positions, "entropy": [e / n for e in self.entropy], "entropy_over": self.entropy_over,
               "diversity": [d / n for d in self.diversity]}
        if self.output_activation:
            out["mean_output_activation"] = [a / n for a in self.output_activation]
        count = self.capsule_length["count"]
        if count:
            lengths = self.capsule_length
            out["output_capsule_length"] = {"mean": lengths["sum"] / count,
                                            f"share_below_{DEAD_CAPSULE}": lengths["dead"] / count,
                                            f"share_above_{SATURATED_CAPSULE}": lengths["saturated"] / count}
        return out


def routing_modules(model) -> Dict[str, CapsuleRouting]:
    """The routing aggregator of each side of ``model`` that routes (``encoder``, ``decoder``)."""
    return {side: getattr(model, side).aggregator for side in ("encoder", "decoder")
            if isinstance(getattr(getattr(model, side), "aggregator", None), CapsuleRouting)}


@torch.no_grad()
def collect_agreement(model, task, subset: str, max_tokens: int = 4000,
                      max_sentences: int = 0) -> Dict[str, AgreementAccumulator]:
    """Teacher-forced passes over ``subset`` with agreement capture on."""
    modules = routing_modules(model)
    if not modules:
        raise ValueError("the model has no routing aggregator (dynamic-routing or em-routing) to analyse")
    accumulators = {side: AgreementAccumulator() for side in modules}
    for module in modules.values():
        module.capture_agreement = True
    task.load_dataset(subset)
    iterator = task.get_batch_iterator(dataset=task.dataset(subset), max_tokens=max_tokens,
                                       max_positions=None, ignore_invalid_inputs=True,
                                       ).next_epoch_itr(shuffle=False)
    seen = 0
    try:
        for sample in iterator:
            model(**sample["net_input"])
            for side, module in modules.items():
                accumulators[side].add(module)
            seen += sample["nsentences"]
            if max_sentences and seen >= max_sentences:
                break
    finally:
        for module in modules.values():
            module.capture_agreement = False
    return accumulators


def run(args) -> Dict[str, object]:
    from fairseq import checkpoint_utils

    from ..user_dir import USER_DIR
    from .plotting import plot_heatmaps  # matplotlib is the experiments' extra: capsagg-health reads routing without it

    models, _cfg, task = checkpoint_utils.load_model_ensemble_and_task(
        [str(args.path)], arg_overrides={"data": str(args.data), "user_dir": USER_DIR})
    model = models[0].eval()
    accumulators = collect_agreement(model, task, args.subset, args.max_tokens, args.max_sentences)
    out_dir = Path(args.output_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    result = {side: acc.summary() for side, acc in accumulators.items()}
    (out_dir / "agreement.json").write_text(json.dumps(result, indent=2))
    for side, acc in accumulators.items():
        n = max(acc.positions, 1)
        plot_heatmaps([m / n for m in acc.mean_agreement], out_dir / f"agreement-{side}.png",
                      title=f"{side} agreement C (mean over {acc.positions} {args.subset} positions)",
                      stats=result[side])
    return result
