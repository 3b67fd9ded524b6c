#!/usr/bin/env python
"""The Triton kernels every fused family's model launches, compiled for real GPUs without one: per kernel and
target, whether it compiles, and its registers, stack frame, spills (local memory) and shared memory.

Collected, not listed: a model of each family (``small`` and ``base``, fp32 and bf16) runs a training step (on a
batch whose positions are a multiple of 16 and one whose are not) and incremental decoding steps (one sentence and
three) on the CPU with its operators' Triton launchers recorded in Triton's interpreter, dry
(:func:`fairseq_capsagg.aggregators.ops.dispatch.kernels_on_cpu`, :func:`recorded_launches`). Each launch is specialised
as Triton's JIT specialises it for a GPU (its own binder: the signature, the constexprs, the integers equal to 1,
the divisibility by 16 of pointers and integers, the launch options): a variant. Each variant is then compiled with ``triton.compile`` for
explicit ``GPUTarget``s in processes without the interpreter (by the ptxas that Triton's wheel ships), and its
resources read from ptxas' own report.

    python benchmarks/compiled_kernels.py                          # sm_80, sm_89, sm_90, sm_100, sm_120: the table
    python benchmarks/compiled_kernels.py --publish docs/results   # docs/results/kernels-compiled.{md,json}
    python benchmarks/compiled_kernels.py --targets 80 90 --shapes small

Exits with 1 when a variant does not compile.
"""

import os

os.environ.setdefault("TRITON_INTERPRET", "1")  # before Triton is imported: the models' launches are interpreted

import argparse  # noqa: E402
import contextlib  # noqa: E402
import functools  # noqa: E402
import importlib  # noqa: E402
import io  # noqa: E402
import json  # noqa: E402
import re  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Dict, Iterator, List, Sequence, Tuple  # noqa: E402

import torch  # noqa: E402

#: The families whose connections run fused operators (one Triton kernel each way and operator).
FUSED_FAMILIES = ("dynrouting", "emrouting", "depthattn", "mudd", "hc", "mhc")
#: GPU architectures compiled for by default: Ampere (A100), Ada (RTX 4090, L40), Hopper (H100, H200), Blackwell
#: (B200) and consumer Blackwell (RTX 5090).
TARGETS = (80, 89, 90, 100, 120)
SHAPES = ("small", "base")
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}
#: Training batches (source lengths; the targets as long) and incremental decoding's: position counts that are a
#: multiple of 16, ragged and 1, as Triton would specialise an integer the kernels did not leave unspecialised.
TRAIN_BATCHES = ([8, 8], [7, 6])
DECODE_BATCHES = ([5], [5, 4, 3])
DECODE_STEPS = 2
#: Where a variant comes from: (family, shape, precision, pass).
Origin = Tuple[str, str, str, str]


def kernel_name(fn) -> str:
    """A kernel as the tables name it: its module within ``aggregators/kernels/`` (its operator's name), and its
    function."""
    return f"{fn.__module__.rsplit('.', 1)[-1]}.{fn.__name__}"


@functools.cache
def _specialiser(kernel):
    """Triton's own binder for the interpreted ``kernel`` (the JIT function a GPU would run, with the kernel's own
    options: which arguments it does not specialise) with an sm_90 backend (an argument's specialisation is the same
    for every CUDA target), and that JIT function, which packs the binder's results."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler.compiler import make_backend
    from triton.runtime.jit import JITFunction, create_function_from_signature

    jit = JITFunction(kernel.fn, **kernel.kwargs)
    backend = make_backend(GPUTarget("cuda", 90, 32))
    return jit, backend, create_function_from_signature(jit.signature, jit.params, backend)


def specialise(kernel, args: Sequence, kwargs: Dict) -> Dict[str, object]:
    """One launch of the interpreted ``kernel`` as the variant Triton's JIT would compile on a GPU (JSON-ready)."""
    jit, backend, binder = _specialiser(kernel)
    bound, specialisation, options = binder(*args, **kwargs)
    _, signature, constexprs, attrs = jit._pack_args(backend, kwargs, bound, specialisation, options)
    fn = kernel.fn
    return {"kernel": kernel_name(fn), "module": fn.__module__, "function": fn.__name__, "signature": signature,
            "constexprs": sorted([list(path), value] for path, value in constexprs.items()),
            "attrs": sorted([list(path), attr] for path, attr in attrs.items()),
            "options": {k: v for k, v in kwargs.items() if k not in jit.arg_names}}


def variant_key(variant: Dict[str, object]) -> str:
    return json.dumps({k: variant[k] for k in ("kernel", "signature", "constexprs", "attrs", "options")},
                      sort_keys=True)


@contextlib.contextmanager
def recorded_launches(variants: Dict[str, Dict[str, object]], origin: Origin, execute: bool = False) -> Iterator[None]:
    """While it lasts, every kernel launched in the interpreter is added to ``variants`` (by :func:`variant_key`),
    with ``origin`` among the places it was launched from; with ``execute`` the interpreter runs it, without it the
    launch only records (a dry run, as Triton's ``warmup``: the kernels' outputs stay as allocated, which changes
    no launch a model makes, as none reads a kernel's values to choose its next launch)."""
    from triton.runtime.interpreter import InterpretedFunction

    interpreted = InterpretedFunction.run

    def run(self, *args, grid, warmup, **kwargs):
        variant = specialise(self, args, kwargs)
        seen = variants.setdefault(variant_key(variant), {**variant, "origins": []})
        if list(origin) not in seen["origins"]:
            seen["origins"].append(list(origin))
        return interpreted(self, *args, grid=grid, warmup=warmup or not execute, **kwargs)

    InterpretedFunction.run = run
    try:
        yield
    finally:
        InterpretedFunction.run = interpreted


def _batch(dictionary, lengths: List[int], seed: int, bos: bool = False) -> torch.Tensor:
    """Right-padded tokens of ``lengths``, ending with EOS (starting with it when ``bos``)."""
    g = torch.Generator().manual_seed(seed)
    tokens = torch.full((len(lengths), max(lengths)), dictionary.pad())
    for i, n in enumerate(lengths):
        body = torch.randint(dictionary.nspecial, len(dictionary), (n - 1,), generator=g)
        end = torch.tensor([dictionary.eos()])
        tokens[i, :n] = torch.cat([end, body]) if bos else torch.cat([body, end])
    return tokens


def model_launches(family: str, shape: str, precision: str, variants: Dict[str, Dict[str, object]]) -> None:
    """Runs ``family``'s model at ``shape`` in ``precision`` through its Triton launchers, dry: a training step on
    each of :data:`TRAIN_BATCHES`, then incremental decoding of each of :data:`DECODE_BATCHES`; adds what it
    launches to ``variants``."""
    from fairseq_capsagg.aggregators.base import gpu_checks_only
    from fairseq_capsagg.aggregators.ops.dispatch import kernels_on_cpu
    from fairseq_capsagg.models.build import build_model, joined_dictionary, model_args

    torch.manual_seed(0)
    dictionary = joined_dictionary(64)
    args = model_args(f"transformer_{family}_{shape}", ["--share-all-embeddings", "--connection-kernels", "fused"])
    model = build_model(args, dictionary).to(DTYPES[precision])
    legacy = [module for module in model.modules() if hasattr(module, "gate_shared")]
    for index, connection in enumerate(legacy):  # mHC: every other block as a checkpoint of its start before runs it
        connection.gate_shared = index % 2 == 1
    with kernels_on_cpu(), gpu_checks_only():  # dry launches leave values no check should read
        with recorded_launches(variants, (family, shape, precision, "train")):
            model.train()
            for seed, lengths in enumerate(TRAIN_BATCHES):
                src = _batch(dictionary, lengths, seed)
                prev = _batch(dictionary, lengths, seed + 10, bos=True)
                model(src, src.ne(dictionary.pad()).sum(1), prev)[0].float().sum().backward()
        with recorded_launches(variants, (family, shape, precision, "decode")), torch.no_grad():
            model.eval()
            for seed, lengths in enumerate(DECODE_BATCHES):
                src = _batch(dictionary, lengths, seed)
                encoder_out = model.encoder(src, src_lengths=src.ne(dictionary.pad()).sum(1))
                state: Dict[str, Dict[str, torch.Tensor]] = {}
                tokens = torch.full((len(lengths), 1), dictionary.eos())
                for _ in range(DECODE_STEPS):
                    model.decoder(tokens, encoder_out=encoder_out, incremental_state=state)
                    tokens = torch.cat([tokens, src[:, :1]], 1)


def collect_variants(families: Sequence[str] = FUSED_FAMILIES, shapes: Sequence[str] = SHAPES,
                     precisions: Sequence[str] = tuple(DTYPES)) -> List[Dict[str, object]]:
    """Every distinct kernel variant the models of ``families`` launch at ``shapes`` in ``precisions``, with where
    each was launched from; sorted by kernel."""
    variants: Dict[str, Dict[str, object]] = {}
    for family in families:
        for shape in shapes:
            for precision in precisions:
                start, before = time.time(), len(variants)
                model_launches(family, shape, precision, variants)
                print(f"[compiled-kernels] {family} {shape} {precision}: {len(variants) - before} new variants "
                      f"({time.time() - start:.0f} s)", file=sys.stderr, flush=True)
    return sorted(variants.values(), key=variant_key)


# compiling (in processes without the interpreter)


PTXAS_REGISTERS = re.compile(r"Used (\d+) registers")
PTXAS_FRAME = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")


def ptxas_resources(log: str) -> Dict[str, int]:
    """Registers per thread, stack frame and spills (bytes) from ptxas' verbose log of one kernel."""
    stack, stores, loads = map(int, PTXAS_FRAME.search(log).groups())
    return {"registers": int(PTXAS_REGISTERS.search(log).group(1)), "stack_bytes": stack,
            "spill_store_bytes": stores, "spill_load_bytes": loads}


def compile_variant(variant: Dict[str, object], capability: int) -> Dict[str, object]:
    """``variant`` compiled for sm_``capability`` (never from Triton's cache: ptxas reports each time): its
    resources as ptxas reports them and its shared memory, or the compiler's error."""
    import triton
    from triton import knobs
    from triton.backends.compiler import GPUTarget
    from triton.compiler.compiler import ASTSource

    jit = getattr(importlib.import_module(variant["module"]), variant["function"])
    source = ASTSource(jit, variant["signature"], {tuple(path): value for path, value in variant["constexprs"]},
                       {tuple(path): attr for path, attr in variant["attrs"]})
    knobs.compilation.always_compile, knobs.nvidia.dump_ptxas_log = True, True
    log = io.StringIO()
    try:
        with contextlib.redirect_stdout(log):  # where Triton prints ptxas' log
            kernel = triton.compile(source, target=GPUTarget("cuda", capability, 32), options=variant["options"])
    except Exception as error:  # the compiler's error, whatever its kind, is the result, with the errors under it
        chain = []
        while error is not None and len(chain) < 8:
            chain.append(f"{type(error).__name__}: {error}".strip())
            error = error.__cause__ or error.__context__
        return {"compiled": False, "error": "\n".join(chain)[-4000:]}
    return {"compiled": True, **ptxas_resources(log.getvalue()), "shared_bytes": kernel.metadata.shared,
            "num_warps": kernel.metadata.num_warps}


def _worker(jobs_file: str, results_file: str) -> None:
    """A compiling process's entry: ``(variant, capability)`` jobs in, results in their order out."""
    jobs = json.loads(Path(jobs_file).read_text())
    Path(results_file).write_text(json.dumps([compile_variant(v, c) for v, c in jobs]))


def compile_all(variants: Sequence[Dict[str, object]], capabilities: Sequence[int],
                workers: int = 2) -> List[Dict[str, object]]:
    """Every variant compiled for every capability by ``workers`` processes without the interpreter: one row per
    (variant, capability), with the Triton version."""
    import triton

    jobs = [(v, c) for v in variants for c in capabilities]
    env = dict(os.environ, TRITON_INTERPRET="0")
    with tempfile.TemporaryDirectory() as tmp:
        procs, files = [], []
        for w in range(workers):
            share = jobs[w::workers]
            jobs_file, results_file = Path(tmp) / f"jobs{w}.json", Path(tmp) / f"results{w}.json"
            jobs_file.write_text(json.dumps(share))
            procs.append(subprocess.Popen([sys.executable, __file__, "--worker", str(jobs_file), str(results_file)],
                                          env=env))
            files.append(results_file)
        for proc in procs:
            if proc.wait() != 0:
                raise RuntimeError(f"a compiling process failed with exit code {proc.returncode}")
        results = [json.loads(f.read_text()) for f in files]
    rows = [None] * len(jobs)
    for w, share in enumerate(results):
        for k, result in enumerate(share):
            rows[w + k * workers] = result
    return [{"kernel": v["kernel"], "target": f"sm_{c}", "triton": triton.__version__, "variant": v, **row}
            for (v, c), row in zip(jobs, rows)]


# the table


def by_kernel_and_shape(rows: Sequence[Dict[str, object]]) -> Dict[Tuple[str, str], Dict[str, List[dict]]]:
    """The compiled rows grouped by (kernel, shape launched at), then by target."""
    groups: Dict[Tuple[str, str], Dict[str, List[dict]]] = {}
    for row in rows:
        for shape in sorted({origin[1] for origin in row["variant"]["origins"]}):
            groups.setdefault((row["kernel"], shape), {}).setdefault(row["target"], []).append(row)
    return dict(sorted(groups.items()))


def _cell(rows: Sequence[Dict[str, object]]) -> str:
    """A (kernel, shape, target)'s worst variant: registers / stack frame / spill stores / shared memory."""
    failed = [r for r in rows if not r["compiled"]]
    if failed:
        return f"**fails** ({len(failed)} of {len(rows)})"
    worst = {k: max(r[k] for r in rows) for k in ("registers", "stack_bytes", "spill_store_bytes", "shared_bytes")}
    return "{registers} / {stack_bytes} / {spill_store_bytes} / {shared_bytes}".format(**worst)


#: Why a kernel that spills is left as it is, by kernel.
SPILL_NOTES: Dict[str, str] = {
    "mhc_read._streams_backward_kernel": "the write-and-read variant in fp32 spills up to 80 B (L1-cached) at 8 "
                                          "warps (in bf16 none): phi's tile and its gradient's stay in registers "
                                          "across the positions; at 16 warps each thread holds 128 registers and it "
                                          "spills more"}


def markdown(rows: Sequence[Dict[str, object]], capabilities: Sequence[int]) -> str:
    targets = [f"sm_{c}" for c in capabilities]
    versions = sorted({r["triton"] for r in rows})
    variants = len({variant_key(r["variant"]) for r in rows})
    lines = [f"Triton kernels of the fused families compiled for each target with Triton {', '.join(versions)} "
             f"(`python benchmarks/compiled_kernels.py`): {variants} variants as the models launch them "
             f"({', '.join(FUSED_FAMILIES)}; small and base; fp32 and bf16; a training step and incremental "
             "decoding), each cell the worst variant of a kernel at a shape: registers per thread / stack frame "
             "(bytes) / spill stores (bytes, local memory) / shared memory (bytes), as ptxas reports them. Compiled "
             "only: not run on these GPUs.",
             "", "| kernel | shape | " + " | ".join(targets) + " | note |",
             "|---|---|" + "---:|" * len(targets) + "---|"]
    for (kernel, shape), by_target in by_kernel_and_shape(rows).items():
        cells = [_cell(by_target.get(t, [])) if by_target.get(t) else "–" for t in targets]
        lines.append(f"| `{kernel}` | {shape} | " + " | ".join(cells) + f" | {SPILL_NOTES.get(kernel, '')} |")
    failures = [r for r in rows if not r["compiled"]]
    for row in failures[:10]:
        lines.append(f"\n`{row['kernel']}` on {row['target']}: {row['error'].splitlines()[0][:300]}")
    return "\n".join(lines) + "\n"


def payload(variants: Sequence[Dict[str, object]], rows: Sequence[Dict[str, object]]) -> Dict[str, object]:
    """The published JSON: every variant once, and each compiled row naming its variant by index."""
    index = {variant_key(v): k for k, v in enumerate(variants)}
    return {"variants": list(variants),
            "rows": [{**{k: v for k, v in r.items() if k != "variant"}, "variant": index[variant_key(r["variant"])]}
                     for r in rows]}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--worker", nargs=2, help=argparse.SUPPRESS)
    p.add_argument("--targets", type=int, nargs="+", default=list(TARGETS),
                   help="compute capabilities to compile for (default: " + " ".join(map(str, TARGETS)) + ")")
    p.add_argument("--families", nargs="+", default=list(FUSED_FAMILIES), choices=FUSED_FAMILIES)
    p.add_argument("--shapes", nargs="+", default=list(SHAPES), choices=SHAPES)
    p.add_argument("--workers", type=int, default=2, help="compiling processes (default 2)")
    p.add_argument("--publish", type=Path, default=None, help="write DIR/kernels-compiled.{md,json}")
    args = p.parse_args(argv)
    if args.worker:
        _worker(*args.worker)
        return 0
    if os.environ.get("TRITON_INTERPRET") != "1":
        p.error("TRITON_INTERPRET must be 1 (or unset) in this process: the models' launches are interpreted")
    torch.set_num_threads(1)
    variants = collect_variants(args.families, args.shapes)
    rows = compile_all(variants, args.targets, args.workers)
    table = markdown(rows, args.targets)
    print(table)
    if args.publish:
        args.publish.mkdir(parents=True, exist_ok=True)
        (args.publish / "kernels-compiled.md").write_text(table)
        (args.publish / "kernels-compiled.json").write_text(json.dumps(payload(variants, rows), indent=1) + "\n")
    return 1 if any(not r["compiled"] for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
