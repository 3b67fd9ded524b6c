#!/usr/bin/env python
"""The bytes each fused operator's Triton kernels load and store, and the FLOPs they compute, against what the
operator must move: counted in Triton's interpreter, without a GPU.

On a GPU these operators are memory-bound, so the bytes their kernels move decide their time; counting each
operator's inputs and outputs once (``kernels.py``) hides a kernel that re-reads its streams, re-reads a weight in
every program or writes a weight's gradient once per program. Here every load and store a kernel issues is counted
as Triton's interpreter runs it: each unmasked lane once, its element's size (an atomic read-modify-write as a read
and a write), attributed to the registered operator (``capsagg::*``) that launched it, forward and backward apart.
The torch operations an operator runs around its kernels (allocations aside: a sum of partials, a cast) count as
``kernels.py`` counts them: each reads its arguments and writes its outputs once. An operator's *ideal* is its
distinct inputs read once and its outputs written once, an argument it accumulates into read and written. FLOPs:
``tl.dot``'s 2 M N K (the tensor cores') apart from the rest (float additions, products, divisions, exponentials and
the like, and the elements a reduction sums).

A model of each fused family runs one training step in the given shape and precision, with its operators' kernels
in the interpreter (:func:`~fairseq_capsagg.aggregators.ops.dispatch.kernels_on_cpu`), at a few batch sizes whose
positions are multiples of every kernel's positions per program; every byte count is then linear in the positions of
a side, so each is fitted as a line, checked at the batch sizes, and given at ``--positions`` (16,384 a side by
default: a 16k-token batch).

    python benchmarks/traffic.py                                   # base, bf16, every fused family
    python benchmarks/traffic.py --families mhc --batches 8 16     # sentences of 8 tokens per batch
    python benchmarks/traffic.py --publish docs/results            # docs/results/kernels-traffic.{md,json}
"""

import os

os.environ.setdefault("TRITON_INTERPRET", "1")  # before Triton is imported: the kernels run in its interpreter

import argparse  # noqa: E402
import collections  # noqa: E402
import contextlib  # noqa: E402
import dataclasses  # noqa: E402
import json  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Dict, Iterator, List, Optional, Sequence, Tuple  # noqa: E402

import numpy as np  # noqa: E402
import torch  # noqa: E402
from torch.utils._python_dispatch import TorchDispatchMode, _disable_current_modes  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from kernels import FILLS, KernelCounter, _distinct, launches_kernel  # noqa: E402

from fairseq_capsagg.pipeline.provenance import code_commit  # noqa: E402
from torch.utils.flop_counter import flop_registry  # noqa: E402

#: The families whose connections run fused operators; ``baseline``, the Transformer, for the step's time beside them.
FUSED_FAMILIES = ("dynrouting", "emrouting", "depthattn", "mudd", "hc", "mhc")
SYSTEMS = ("baseline", *FUSED_FAMILIES)
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}
#: Interpreter operations counted as FLOPs other than ``tl.dot``'s, and what each element costs.
FLOAT_OPS = {"create_fadd": 1, "create_fsub": 1, "create_fmul": 1, "create_fdiv": 1, "create_precise_divf": 1,
             "create_approx_divf": 1, "create_frem": 1, "create_fma": 2, "create_exp": 1, "create_exp2": 1,
             "create_log": 1, "create_log2": 1, "create_sqrt": 1, "create_precise_sqrt": 1, "create_rsqrt": 1,
             "create_erf": 1, "create_cos": 1, "create_sin": 1}
#: The counts of one operator and pass; bytes and FLOPs.
FIELDS = ("kernel_loads", "kernel_stores", "torch_bytes", "ideal", "dot_flops", "other_flops", "launches", "calls")
#: The counts linear in the positions (every lane a kernel loads or stores is a position's); FLOPs are counted on
#: every lane, a program's padding included, so they are fitted but not exactly linear at small batches.
BYTE_FIELDS = ("kernel_loads", "kernel_stores", "torch_bytes", "ideal")


@dataclasses.dataclass
class Counts:
    """What one operator's calls moved and computed: its kernels' loads and stores, the torch operations around
    them, its ideal, ``tl.dot``'s FLOPs and the rest, its kernel launches and its calls."""

    kernel_loads: float = 0
    kernel_stores: float = 0
    torch_bytes: float = 0
    ideal: float = 0
    dot_flops: float = 0
    other_flops: float = 0
    launches: float = 0
    calls: float = 0

    @property
    def moved(self) -> float:
        """Every byte the operator moves: its kernels' and its torch operations'."""
        return self.kernel_loads + self.kernel_stores + self.torch_bytes

    @property
    def over_ideal(self) -> float:
        return self.moved / self.ideal if self.ideal else float("nan")


def _element_bytes(handle) -> int:
    return handle.get_element_ty().primitive_bitwidth // 8


def _lanes(mask, shape) -> int:
    return int(np.broadcast_to(np.asarray(mask.data, dtype=bool), shape).sum())


class InterpreterTraffic:
    """While active, every load, store, atomic, ``tl.dot`` and float operation Triton's interpreter runs is added to
    ``counts[label]`` for the ``label`` set last (:meth:`attributed`); with none set, to ``counts[None]``."""

    def __init__(self):
        self.counts: Dict[Optional[str], Counts] = collections.defaultdict(Counts)
        self._labels: List[Optional[str]] = [None]
        self._saved: Dict[str, object] = {}

    @contextlib.contextmanager
    def attributed(self, label: str) -> Iterator[Counts]:
        self._labels.append(label)
        try:
            yield self.counts[label]
        finally:
            self._labels.pop()

    @property
    def current(self) -> Counts:
        return self.counts[self._labels[-1]]

    def __enter__(self) -> "InterpreterTraffic":
        from triton.runtime import interpreter

        builder = interpreter.InterpreterBuilder
        meter = self

        def masked_load(self, ptrs, mask, other, cache_policy, is_volatile):
            meter.current.kernel_loads += _lanes(mask, ptrs.data.shape) * _element_bytes(ptrs)
            return meter._saved["create_masked_load"](self, ptrs, mask, other, cache_policy, is_volatile)

        def masked_store(self, ptrs, value, mask, cache_policy):
            meter.current.kernel_stores += _lanes(mask, ptrs.data.shape) * _element_bytes(ptrs)
            return meter._saved["create_masked_store"](self, ptrs, value, mask, cache_policy)

        def atomic_rmw(self, op, ptr, val, mask, sem, scope):
            moved = _lanes(mask, ptr.data.shape) * _element_bytes(ptr)
            meter.current.kernel_loads += moved
            meter.current.kernel_stores += moved
            return meter._saved["create_atomic_rmw"](self, op, ptr, val, mask, sem, scope)

        def atomic_cas(self, ptr, cmp, val, sem, scope):
            moved = int(np.asarray(ptr.data).size) * _element_bytes(ptr)
            meter.current.kernel_loads += moved
            meter.current.kernel_stores += moved
            return meter._saved["create_atomic_cas"](self, ptr, cmp, val, sem, scope)

        def dot(self, a, b, d, input_precision, max_num_imprecise_acc):
            out = meter._saved["create_dot"](self, a, b, d, input_precision, max_num_imprecise_acc)
            meter.current.dot_flops += 2 * out.data.size * a.data.shape[-1]
            return out

        def float_op(name, cost):
            def counted(self, *args):
                out = meter._saved[name](self, *args)
                if out.dtype.is_floating():
                    meter.current.other_flops += cost * out.data.size
                return out
            return counted

        patches = {"create_masked_load": masked_load, "create_masked_store": masked_store,
                   "create_atomic_rmw": atomic_rmw, "create_atomic_cas": atomic_cas, "create_dot": dot,
                   **{name: float_op(name, cost) for name, cost in FLOAT_OPS.items()}}
        for name, patch in patches.items():
            self._saved[name] = getattr(builder, name)
            setattr(builder, name, patch)
        reduce_ops = interpreter.ReduceOps
        self._saved["sum"] = reduce_ops.sum

        def summed(ops, input):
            meter.current.other_flops += input.handle.data.size
            return meter._saved["sum"](ops, input)

        reduce_ops.sum = summed
        grid = interpreter.GridExecutor.__call__
        self._saved["__call__"] = grid

        def launched(executor, *args, **kwargs):
            meter.current.launches += 1
            # the interpreter copies the kernel's tensors to and from its host arrays with torch operations, which a
            # GPU does not run: out of sight of the counters of torch operations
            with _disable_current_modes():
                return grid(executor, *args, **kwargs)

        interpreter.GridExecutor.__call__ = launched
        return self

    def __exit__(self, *exc) -> None:
        from triton.runtime import interpreter

        interpreter.ReduceOps.sum = self._saved.pop("sum")
        interpreter.GridExecutor.__call__ = self._saved.pop("__call__")
        for name, original in self._saved.items():
            setattr(interpreter.InterpreterBuilder, name, original)
        self._saved.clear()


def operator_label(func, namespace: str = "capsagg") -> Optional[Tuple[str, str]]:
    """(operator, pass) of an operator registered in ``namespace`` (``capsagg::mhc_read_backward`` -> ``mhc_read``,
    ``backward``); None for any other operator."""
    space, _, name = func.overloadpacket._qualified_op_name.partition("::")
    if space != namespace:
        return None
    return (name[:-len("_backward")], "backward") if name.endswith("_backward") else (name, "forward")


class OperatorTraffic(TorchDispatchMode):
    """Counts, per fused operator (of ``namespace``) and pass, what its kernels move (:class:`InterpreterTraffic`), the
    torch operations it runs around them (:class:`~kernels.KernelCounter`), its ideal bytes (its distinct tensor
    inputs and its outputs, once each) and its calls. With ``every_call``, also keeps each call in order, every other
    kernel-launching operator of the step among them (its bytes counted as :class:`~kernels.KernelCounter` counts
    them, its tensor-core FLOPs as torch's FLOP counter does): the step's kernels, for :func:`predicted_step`."""

    def __init__(self, interpreter: InterpreterTraffic, namespace: str = "capsagg", every_call: bool = False):
        super().__init__()
        self.interpreter = interpreter
        self.namespace = namespace
        self.calls: Optional[List[Tuple[str, Counts]]] = [] if every_call else None

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        label = operator_label(func, self.namespace)
        if label is None:
            out = func(*args, **(kwargs or {}))
            if self.calls is not None and launches_kernel(func):
                self.calls.append((str(func.overloadpacket), _aten_counts(func, args, kwargs or {}, out)))
            return out
        # the operator's own function, called directly under a counter of its own: dispatched, the counter would see
        # the operator itself and none of the torch operations inside it
        implementation = torch._library.custom_ops._maybe_get_opdef(func)._init_fn
        with self.interpreter.attributed("/".join(label)) as counts, KernelCounter() as inner:
            before = dataclasses.replace(counts)
            out = implementation(*args, **(kwargs or {}))
        # its distinct inputs read once and outputs written once, an argument it writes into read and written
        ideal = sum(t.numel() * t.element_size() for t in {**_distinct(out), **_distinct((args, kwargs))}.values())
        ideal += sum(t.numel() * t.element_size() for t in _distinct(_mutated(func, args, kwargs)).values())
        counts.torch_bytes += inner.bytes_moved
        counts.launches += inner.total
        counts.ideal += ideal
        counts.calls += 1
        if self.calls is not None:
            self.calls.append(("/".join(label),
                               Counts(**{field: getattr(counts, field) - getattr(before, field) for field in FIELDS})))
        return out


def _mutated(func, args, kwargs) -> List[torch.Tensor]:
    """The arguments an operator writes into (its schema's mutable ones): read and written, twice in its ideal."""
    values = {**dict(zip((a.name for a in func._schema.arguments), args)), **(kwargs or {})}
    return [values[a.name] for a in func._schema.arguments
            if a.alias_info is not None and a.alias_info.is_write and isinstance(values.get(a.name), torch.Tensor)]


def _aten_counts(func, args, kwargs, out) -> Counts:
    """One torch operator's kernel: the bytes it reads and writes (:class:`~kernels.KernelCounter`'s rule) and, for a
    matrix product or attention, its FLOPs (torch's FLOP counter), on the tensor cores."""
    read = () if func.overloadpacket._qualified_op_name in FILLS else (args, kwargs)
    moved = sum(t.numel() * t.element_size() for t in {**_distinct(out), **_distinct(read)}.values())
    flops = flop_registry[func.overloadpacket](*args, **kwargs, out_val=out) if func.overloadpacket in flop_registry \
        else 0
    return Counts(torch_bytes=moved, ideal=moved, dot_flops=flops, launches=1, calls=1)


#: An NVIDIA H100 SXM (its data sheet's dense peaks): HBM3 bandwidth; tensor-core FLOPs in bf16 and in TF32 (the
#: fused operators' tile products in a half-precision model), fp32 FLOPs on the CUDA cores; and the cost of a kernel
#: in a stream of back-to-back launches (the GPU's gap between kernels, a few microseconds).
H100 = {"bandwidth": 3.35e12, "bf16": 989e12, "tf32": 494e12, "fp32": 67e12, "launch": 4e-6}


@dataclasses.dataclass
class Step:
    """What one training step ran: per fused operator and pass its summed counts, and every kernel-launching call in
    order (the fused operators' and torch's)."""

    operators: Dict[str, Counts]
    calls: List[Tuple[str, Counts]]


def training_step_traffic(family: str, shape: str, dtype: torch.dtype, sentences: int, length: int = 8,
                          vocab: int = 64) -> Step:
    """One training step of ``transformer_{family}_{shape}`` (``baseline``: the Transformer of that shape) on
    ``sentences`` source and target sentences of ``length`` tokens (``sentences * length`` positions a side) and a
    joined vocabulary of ``vocab`` symbols, with its fused operators' kernels in Triton's interpreter."""
    from fairseq_capsagg.aggregators.base import gpu_checks_only
    from fairseq_capsagg.aggregators.ops.dispatch import kernels_on_cpu
    from fairseq_capsagg.models.build import build_model, joined_dictionary, model_args

    torch.manual_seed(0)
    dictionary = joined_dictionary(vocab)
    vanilla = ["--encoder-aggregation", "none", "--decoder-aggregation", "none"] if family == "baseline" else []
    arch = f"transformer_{'linagg' if family == 'baseline' else family}_{shape}"
    model = build_model(model_args(arch, ["--share-all-embeddings", "--connection-kernels", "fused", *vanilla]),
                        dictionary).to(dtype).train()
    generator = torch.Generator().manual_seed(sentences)
    words = torch.randint(dictionary.nspecial, len(dictionary), (sentences, length - 1), generator=generator)
    eos = torch.full((sentences, 1), dictionary.eos())
    src, prev, target = (torch.cat([words, eos], 1), torch.cat([eos, words.flip(1)], 1),
                         torch.cat([words.flip(1), eos], 1))
    meter = InterpreterTraffic()
    counter = OperatorTraffic(meter, every_call=True)
    with kernels_on_cpu(), gpu_checks_only(), meter, counter:
        logits, _ = model(src, torch.full((sentences,), length), prev)
        torch.nn.functional.cross_entropy(logits.float().flatten(0, 1), target.flatten()).backward()
    return Step({label: counts for label, counts in meter.counts.items() if label is not None}, counter.calls)


def _line(xs: np.ndarray, ys: np.ndarray, at: int) -> Tuple[float, float]:
    """The least-squares line through (xs, ys) at ``at``, and the largest deviation of a point from it relative to the
    largest |y| (at least 1)."""
    slope, intercept = np.polyfit(xs, ys, 1)
    return slope * at + intercept, float(np.abs(slope * xs + intercept - ys).max() / max(np.abs(ys).max(), 1.0))


def _fitted_counts(points: Sequence[Counts], xs: np.ndarray, positions: int) -> Tuple[Counts, float]:
    values, worst = {}, 0.0
    for field in FIELDS:
        ys = np.array([getattr(c, field) for c in points], dtype=float)
        if field in ("launches", "calls"):  # per step, whatever the batch
            values[field] = ys[-1]
        else:
            values[field], deviation = _line(xs, ys, positions)
            if field in BYTE_FIELDS:
                worst = max(worst, deviation)
    return Counts(**values), worst


def fitted(points: Dict[int, Dict[str, Counts]], positions: int) -> Tuple[Dict[str, Counts], float]:
    """Each count as a line in the positions of a side, fitted by least squares to ``points`` (positions -> counts per
    label), evaluated at ``positions``; and the largest deviation of a measured byte count from its line, relative to
    the count (0 when the bytes are linear in the positions, as they should be)."""
    xs = np.array(sorted(points), dtype=float)
    out, worst = {}, 0.0
    for label in sorted({label for counts in points.values() for label in counts}):
        out[label], deviation = _fitted_counts([points[int(x)].get(label, Counts()) for x in xs], xs, positions)
        worst = max(worst, deviation)
    return out, worst


def fitted_calls(points: Dict[int, List[Tuple[str, Counts]]], positions: int) -> List[Tuple[str, Counts]]:
    """Each call of the step fitted as :func:`fitted` fits an operator's counts: the steps at every batch size run the
    same calls in the same order.

    Raises:
        ValueError: the steps ran different calls.
    """
    xs = np.array(sorted(points), dtype=float)
    sequences = [points[int(x)] for x in xs]
    if len({tuple(label for label, _ in sequence) for sequence in sequences}) != 1:
        raise ValueError("the training steps at the batch sizes ran different kernels; cannot fit them call by call")
    return [(label, _fitted_counts([sequence[k][1] for sequence in sequences], xs, positions)[0])
            for k, (label, _) in enumerate(sequences[0])]


def predicted_seconds(calls: Sequence[Tuple[str, Counts]], precision: str, device: Dict[str, float] = H100) -> float:
    """A model of the step's time on ``device``: each call's bytes over the bandwidth or its FLOPs over their units'
    peaks, whichever is larger, plus its launches. Torch's matrix products and attention run on the tensor cores in
    the model's precision (bf16; fp32 on the CUDA cores), the fused operators' tile products in TF32 in a half-precision
    model (exact fp32 on the CUDA cores otherwise), their other arithmetic on the CUDA cores."""
    half = precision != "fp32"
    total = 0.0
    for label, c in calls:
        if label.startswith("aten."):
            compute = c.dot_flops / device["bf16" if half else "fp32"]
        else:
            compute = c.dot_flops / device["tf32" if half else "fp32"] + c.other_flops / device["fp32"]
        total += max(c.moved / device["bandwidth"], compute) + c.launches * device["launch"]
    return total


def family_traffic(family: str, shape: str, precision: str, batches: Sequence[int], length: int, positions: int,
                   vocab: int) -> Dict[str, object]:
    """One family's counts at each batch, fitted and given at ``positions`` a side; and the step's predicted time."""
    operators, calls = {}, {}
    for sentences in batches:
        start = time.time()
        step = training_step_traffic(family, shape, DTYPES[precision], sentences, length, vocab)
        operators[sentences * length], calls[sentences * length] = step.operators, step.calls
        print(f"[traffic] {family} {shape} {precision} {sentences * length} positions: {time.time() - start:.0f} s",
              file=sys.stderr, flush=True)
    at, deviation = fitted(operators, positions)
    step_calls = fitted_calls(calls, positions)
    fused = [c for label, c in step_calls if not label.startswith("aten.")]
    return {"family": family, "operators": {label: dataclasses.asdict(c) for label, c in at.items()},
            "measured": {str(p): {label: dataclasses.asdict(c) for label, c in counts.items()}
                         for p, counts in operators.items()},
            "linearity_deviation": deviation,
            "step": {"kernels": sum(c.launches for _, c in step_calls),
                     "bytes": sum(c.moved for _, c in step_calls),
                     "fused_bytes": sum(c.moved for c in fused), "fused_ideal": sum(c.ideal for c in fused),
                     "predicted_seconds": predicted_seconds(step_calls, precision)}}


def _gb(value: float) -> str:
    return f"{value / 1e9:.3f}"


def markdown(result: Dict[str, object]) -> str:
    """Per family and fused operator: forward and backward bytes against the ideal, and the operators summed; then per
    family the whole step and its predicted time beside the Transformer's."""
    setup = result["setup"]
    device = setup["device"]
    measured = ", ".join(str(b * setup["length"]) for b in setup["batches"])
    code = f", code `{setup['code']}`" if "code" in setup else ""
    lines = [f"Bytes the fused operators' Triton kernels move in one training step of `{setup['shape']}` in "
             f"{setup['precision']}, at {setup['positions']:,} positions a side, counted in Triton's interpreter "
             f"(`python benchmarks/traffic.py`{code}; fitted from {measured} positions a side, linear within the "
             "deviation given per family). kernels: every unmasked lane of every load and store (atomics twice); "
             "torch: the operations the operator runs around its kernels; ideal: its distinct inputs read once and its "
             "outputs written once, an argument it accumulates into read and written. GB = 1e9 bytes.", "",
             "| family | operator | pass | calls | kernels GB | torch GB | ideal GB | × ideal | dot GFLOP | "
             "other GFLOP |", "|---|---|---|---:|---:|---:|---:|---:|---:|---:|"]
    for family in result["families"]:
        if not family["operators"]:
            continue
        for label, c in sorted(family["operators"].items()):
            counts = Counts(**c)
            operator, _, way = label.partition("/")
            lines.append(f"| {family['family']} | `{operator}` | {way} | {counts.calls:.0f} | "
                         f"{_gb(counts.kernel_loads + counts.kernel_stores)} | {_gb(counts.torch_bytes)} | "
                         f"{_gb(counts.ideal)} | {counts.over_ideal:.2f} | {counts.dot_flops / 1e9:.1f} | "
                         f"{counts.other_flops / 1e9:.1f} |")
        step = family["step"]
        lines.append(f"| {family['family']} | **all** | both | | **{_gb(step['fused_bytes'])}** | | "
                     f"**{_gb(step['fused_ideal'])}** | **{step['fused_bytes'] / step['fused_ideal']:.2f}** | | |")
    lines += ["", "Linearity: the largest deviation of a measured byte count from its fitted line, relative to the "
              "count (FLOPs are counted on every lane, a program's padding included, and fitted alike): "
              + ", ".join(f"{f['family']} {f['linearity_deviation']:.1e}" for f in result["families"]) + ".", ""]
    baseline = next((f["step"] for f in result["families"] if f["family"] == "baseline"), None)
    lines += [f"**A model, not a measurement**: the step's time on an H100 SXM predicted from these counts, each "
              f"kernel its bytes over {device['bandwidth'] / 1e12:.2f} TB/s or its FLOPs over its units' peak "
              f"(torch's matrix products {device['bf16'] / 1e12:.0f} TFLOP/s in bf16; the fused tile products "
              f"{device['tf32'] / 1e12:.0f} in TF32, the rest {device['fp32'] / 1e12:.0f} in fp32), whichever is "
              f"larger, plus {device['launch'] * 1e6:.0f} µs a launch; the Transformer's kernels counted once each "
              f"(every tensor an operator reads and writes, no tile re-read), a {setup['vocab']:,}-symbol vocabulary. "
              "No kernel reaches its peak: read the ratio, not the milliseconds.", "",
              "| system | kernels | step GB | fused GB (× ideal) | predicted ms | × the Transformer's |",
              "|---|---:|---:|---:|---:|---:|"]
    for family in result["families"]:
        step = family["step"]
        fused = (f"{_gb(step['fused_bytes'])} ({step['fused_bytes'] / step['fused_ideal']:.2f})"
                 if step["fused_ideal"] else "–")
        ratio = f"{step['predicted_seconds'] / baseline['predicted_seconds']:.2f}" if baseline else "–"
        lines.append(f"| {family['family']} | {step['kernels']:.0f} | {_gb(step['bytes'])} | {fused} | "
                     f"{step['predicted_seconds'] * 1e3:.1f} | {ratio} |")
    return "\n".join(lines) + "\n"


def comparison(before: Dict[str, object], after: Dict[str, object]) -> str:
    """Per system, two published runs of the meter side by side (docs/results.md's table): the fused operators' bytes
    against their ideal and the modelled step against the Transformer's, before and after; and after, the operator
    and pass farthest above its ideal."""
    def by_family(result):
        return {f["family"]: f for f in result["families"]}

    old, new = by_family(before), by_family(after)
    base_old, base_new = old["baseline"]["step"]["predicted_seconds"], new["baseline"]["step"]["predicted_seconds"]
    lines = [f"| system | code {before['setup']['code']}: fused GB (× ideal) | modelled step | "
             f"code {after['setup']['code']}: fused GB (× ideal) | farthest operator (× ideal) | modelled step |",
             "|---|---:|---:|---:|---|---:|"]
    for family, result in new.items():
        step, previous = result["step"], old[family]["step"]
        if not step["fused_ideal"]:
            lines.append(f"| {family} | – | 1.00 ({base_old * 1e3:.1f} ms) | – | – | "
                         f"1.00 ({base_new * 1e3:.1f} ms) |")
            continue
        farthest, counts = max(((label, Counts(**c)) for label, c in result["operators"].items()),
                               key=lambda item: item[1].over_ideal)
        operator, _, way = farthest.partition("/")
        lines.append(f"| {family} | {_gb(previous['fused_bytes'])} "
                     f"({previous['fused_bytes'] / previous['fused_ideal']:.2f}) | "
                     f"{previous['predicted_seconds'] / base_old:.2f} | {_gb(step['fused_bytes'])} "
                     f"({step['fused_bytes'] / step['fused_ideal']:.2f}) | `{operator}` {way} "
                     f"({counts.over_ideal:.2f}) | {step['predicted_seconds'] / base_new:.2f} |")
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--families", nargs="+", default=list(SYSTEMS), choices=SYSTEMS)
    parser.add_argument("--shape", default="base", choices=("small", "base", "big"))
    parser.add_argument("--precision", default="bf16", choices=tuple(DTYPES))
    parser.add_argument("--batches", nargs="+", type=int, default=[8, 16, 24],
                        help="sentences per training batch, each measured (at least two); with sentences of 8 tokens "
                             "the defaults are multiples of 64 positions, of every kernel's positions per program, so "
                             "that what a program reads once (a weight) scales with the positions as at 16k")
    parser.add_argument("--length", type=int, default=8, help="tokens per sentence, both sides")
    parser.add_argument("--positions", type=int, default=16384, help="positions a side the counts are given at")
    parser.add_argument("--vocab", type=int, default=32768, help="the joined vocabulary (its output layer's size)")
    parser.add_argument("--publish", help="write kernels-traffic.md and .json into this directory")
    args = parser.parse_args(argv)
    if len(set(args.batches)) < 2:
        parser.error("--batches: give at least two different batch sizes to fit a line")
    result = {"setup": {"shape": args.shape, "precision": args.precision, "batches": args.batches,
                        "length": args.length, "positions": args.positions, "vocab": args.vocab, "device": H100,
                        "code": code_commit()},
              "families": [family_traffic(f, args.shape, args.precision, args.batches, args.length, args.positions,
                                          args.vocab) for f in args.families]}
    text = markdown(result)
    print(text)
    if args.publish:
        out = Path(args.publish)
        out.mkdir(parents=True, exist_ok=True)
        (out / "kernels-traffic.md").write_text(text)
        (out / "kernels-traffic.json").write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
