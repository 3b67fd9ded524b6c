#!/usr/bin/env python
"""Training and decoding speed, peak memory, and the kernels and memory of one step of every aggregator against the
baseline.

Each (shape, system) runs in its own process, so peak memory is its own.
Ratios are to the baseline measured in the same run, next to the FLOP bound
(baseline FLOPs / (baseline + aggregator FLOPs)) and the kernels launched
per training step and per decoding step (counted on any device; ``kernels.py``) and the peak memory of a training
step's tensors (counted on any device; ``memory.py``). With ``--repeats N`` every system runs N times round-robin;
each ratio is the median of the N ratios to the baseline of the same round,
with their range.

    python benchmarks/speed.py                   # small and base shapes on CPU
    python benchmarks/speed.py --device cuda     # on a GPU
    python benchmarks/speed.py --count-only      # kernels and step memory only: seconds, on any machine
"""

import argparse
import json
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Dict, List, Tuple

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from flops import Shape, aggregator_macs, flop_bound, transformer_macs  # noqa: E402
from kernels import decoding_step_kernels, training_step_kernels  # noqa: E402
from memory import training_step_peak_memory  # noqa: E402

from fairseq_capsagg.aggregators import families  # noqa: E402
from fairseq_capsagg.pipeline.provenance import device_name  # noqa: E402

#: system -> aggregation: the baseline and every aggregator family
SYSTEMS = {"baseline": "none", **families()}
SHAPES = {"small": dict(d=128, ffn=512), "base": dict(d=512, ffn=2048)}
#: The measurements reported as ratios to the baseline (the operator counts also with ``--count-only``).
RATIOS = ("train_tokens_per_s", "decode_sentences_per_s", "peak_memory_bytes", "train_kernels", "decode_kernels",
          "train_step_peak_bytes", "train_bytes_moved")


def measure(args) -> dict:
    """Runs inside the child process: times one (shape, system)."""
    from fairseq.sequence_generator import SequenceGenerator

    from fairseq_capsagg.models.build import build_model, joined_dictionary, model_args

    torch.manual_seed(0)
    device = torch.device(args.device)
    if device.type == "cpu":
        torch.set_num_threads(args.threads)
    family = "linagg" if args.system == "baseline" else args.system  # each family's own placement
    vanilla = ["--encoder-aggregation", "none", "--decoder-aggregation", "none"] if args.system == "baseline" else []
    flags = [*vanilla, "--capsule-rank", str(args.capsule_rank), *args.model_args.split()]
    parsed = model_args(f"transformer_{family}_{args.shape}", ["--share-all-embeddings", "--dropout", "0.1", *flags])
    dictionary = joined_dictionary(args.vocab)
    model = build_model(parsed, dictionary).to(device)
    params = sum(p.numel() for p in model.parameters())

    g = torch.Generator().manual_seed(1)
    bsz = max(1, args.tokens // args.length)
    src = torch.randint(dictionary.nspecial, len(dictionary), (bsz, args.length), generator=g).to(device)
    src[:, -1] = dictionary.eos()
    tgt = torch.randint(dictionary.nspecial, len(dictionary), (bsz, args.length), generator=g).to(device)
    prev = torch.cat([torch.full((bsz, 1), dictionary.eos(), device=device), tgt[:, :-1]], 1)
    lengths = torch.full((bsz,), args.length, device=device)
    # decoding in fp32 (fairseq-generate's under --bf16), training as fairseq's --bf16 trains: the model cast
    decode_kernels = decoding_step_kernels(model, src[:args.decode_sentences], lengths[:args.decode_sentences],
                                           dictionary.eos()).total
    if args.bf16:
        model = model.to(torch.bfloat16)
    train = training_step_kernels(model, src, lengths, prev, tgt)
    kernels = {"train_kernels": train.total, "train_bytes_moved": train.bytes_moved, "decode_kernels": decode_kernels,
               "train_step_peak_bytes": training_step_peak_memory(model, src, lengths, prev, tgt)}
    if args.count_only:
        return {"params": params, **kernels}
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-4)

    def sync():
        if device.type == "cuda":
            torch.cuda.synchronize()

    def train_step():
        optimizer.zero_grad(set_to_none=True)
        logits, _ = model(src, lengths, prev)
        loss = torch.nn.functional.cross_entropy(logits.float().view(-1, logits.size(-1)), tgt.view(-1))
        loss.backward()
        optimizer.step()

    model.train()
    for _ in range(args.warmup):
        train_step()
    sync()
    start = time.perf_counter()
    for _ in range(args.steps):
        train_step()
    sync()
    train_seconds = (time.perf_counter() - start) / args.steps

    model.eval().float()  # fairseq-generate decodes in fp32 under --bf16 (it casts only for --fp16)
    generator = SequenceGenerator([model], dictionary, beam_size=args.beam, max_len_a=0, max_len_b=args.length)
    dec_src = src[: args.decode_sentences]
    sample = {"net_input": {"src_tokens": dec_src, "src_lengths": lengths[: args.decode_sentences]}}
    with torch.no_grad():
        generator.forward(sample)  # warm-up
        sync()
        start = time.perf_counter()
        generator.forward(sample)
        sync()
        decode_seconds = time.perf_counter() - start
    if device.type == "cuda":
        peak = torch.cuda.max_memory_allocated()
    else:
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    return {"params": params, **kernels, "train_steps_per_s": 1 / train_seconds,
            "train_tokens_per_s": bsz * args.length / train_seconds,
            "decode_sentences_per_s": dec_src.size(0) / decode_seconds, "peak_memory_bytes": peak}


def write_tables(args, runs: Dict[Tuple[str, str], List[dict]]) -> None:
    """``speed.{json,md}`` in ``--output-dir`` for every (shape, system) measured so far, ratios paired
    with the reference (the first of ``--systems``) of the same round; the systems not yet measured
    are listed as pending, so a run stopped by a time limit still says what it measured."""
    rows, pending = [], []
    for shape in args.shapes:
        s = SHAPES[shape]
        arch = Shape(d=s["d"], ffn=s["ffn"], layers=6, vocab=args.vocab, src_len=args.length, tgt_len=args.length)
        reference = runs[(shape, args.systems[0])]
        for system in args.systems:
            measured = runs[(shape, system)][: len(reference)]  # only rounds whose reference was measured
            if len(measured) < args.repeats:
                pending.append(f"{shape} {system} ({len(measured)} of {args.repeats} rounds)")
            if not measured:
                continue
            result = {key: statistics.median(r[key] for r in measured) for key in measured[0]}
            agg = aggregator_macs(SYSTEMS[system], s["d"], 6, s["d"], rank=args.capsule_rank)
            result.update(shape=shape, system=system, repeats=len(measured),
                          aggregator_flop_share=2 * agg / (transformer_macs(arch) + 2 * agg),
                          flop_bound=flop_bound(transformer_macs(arch), 2 * agg))
            for key in [k for k in RATIOS if k in measured[0]]:
                # paired: each repeat against the reference measured in the same round
                ratios = [r[key] / b[key] for r, b in zip(measured, reference)]
                result[key + "_ratio"] = statistics.median(ratios)
                result[key + "_ratio_range"] = [min(ratios), max(ratios)]
            rows.append(result)
    out_dir = Path(args.output_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    # the device as the tables' captions name it, so a table trained on this machine finds these ratios by it
    device = device_name(gpu=args.device.startswith("cuda"))
    (out_dir / f"{args.name}.json").write_text(json.dumps({"device": device, "args": vars(args), "rows": rows,
                                                           "pending": pending}, indent=2))
    threads = "" if args.device.startswith("cuda") else f", {args.threads} threads"
    rank = f"; input capsules factorised at rank {args.capsule_rank}" if args.capsule_rank else ""
    spread = (f"; median of {args.repeats} round-robin repeats, ratios paired within a round (range in brackets)"
              if args.repeats > 1 else "")
    half = "; bf16 training (the model cast, as fairseq's --bf16), fp32 decoding (as fairseq-generate)" \
        if args.bf16 else ""
    flags = f"; model flags `{args.model_args}`" if args.model_args else ""
    lines = [f"Device: {device}{threads}; batch {args.tokens} target tokens of length {args.length}; "
             f"beam {args.beam}{half}{rank}{flags}{spread}. Kernels: the kernel-launching ATen operators dispatched per training step "
             "(forward and backward) and per incremental decoding step (benchmarks/kernels.py); traffic: the bytes "
             "they read and write per training step (each operator's arguments and outputs, no re-reads within "
             "one). Step memory: the "
             "most memory a training step's tensors hold at once, the activations saved for the backward and the "
             "backward's own (benchmarks/memory.py).", ""]

    def ratio(r: dict, key: str) -> str:
        low, high = r[key + "_ratio_range"]
        return f"{r[key + '_ratio']:.2f}" + (f" ({low:.2f}-{high:.2f})" if r["repeats"] > 1 else "")

    kernels = ("| kernels per train step | ratio | kernels per decode step | ratio | traffic per train step | ratio |",
               lambda r: f"| {r['train_kernels']} | {ratio(r, 'train_kernels')} | {r['decode_kernels']} "
                         f"| {ratio(r, 'decode_kernels')} | {r['train_bytes_moved'] / 2**30:.2f} GiB "
                         f"| {ratio(r, 'train_bytes_moved')} |")
    if args.count_only:
        lines += ["| shape | system | params | FLOP bound " + kernels[0] + " step memory | ratio |",
                  "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
        lines += [f"| {r['shape']} | {r['system']} | {r['params'] / 1e6:.1f}M | {r['flop_bound']:.2f} "
                  + kernels[1](r) + f" {r['train_step_peak_bytes'] / 2**20:.1f} MiB "
                  f"| {ratio(r, 'train_step_peak_bytes')} |" for r in rows]
    else:
        lines += ["| shape | system | params | train tok/s | ratio | FLOP bound | aggregator FLOP share "
                  "| decode sent/s | ratio | peak memory | ratio " + kernels[0],
                  "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
        lines += [f"| {r['shape']} | {r['system']} | {r['params'] / 1e6:.1f}M | {r['train_tokens_per_s']:.0f} "
                  f"| {ratio(r, 'train_tokens_per_s')} | {r['flop_bound']:.2f} | {r['aggregator_flop_share']:.1%} "
                  f"| {r['decode_sentences_per_s']:.2f} | {ratio(r, 'decode_sentences_per_s')} "
                  f"| {r['peak_memory_bytes'] / 2**20:.0f} MiB | {ratio(r, 'peak_memory_bytes')} " + kernels[1](r)
                  for r in rows]
    if pending:
        lines += ["", "Pending (not measured yet, or fewer rounds than asked): " + "; ".join(pending) + "."]
    (out_dir / f"{args.name}.md").write_text("\n".join(lines) + "\n")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shapes", nargs="+", default=["small", "base"], choices=list(SHAPES))
    p.add_argument("--systems", nargs="+", default=list(SYSTEMS), choices=list(SYSTEMS))
    p.add_argument("--device", default="cpu")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--vocab", type=int, default=8000)
    p.add_argument("--tokens", type=int, default=2048, help="target tokens per training batch")
    p.add_argument("--length", type=int, default=32, help="source = target length of the synthetic batch")
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--repeats", type=int, default=1, help="round-robin repeats of every system; medians are reported")
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--beam", type=int, default=4)
    p.add_argument("--decode-sentences", type=int, default=16)
    p.add_argument("--bf16", action="store_true",
                   help="train with the model cast to bf16, as fairseq's --bf16 does (decoding stays fp32, as "
                        "fairseq-generate's with --bf16)")
    p.add_argument("--capsule-rank", type=int, default=0, help="factorised input capsules (routing systems)")
    p.add_argument("--model-args", default="", help="extra model flags for every system")
    p.add_argument("--output-dir", default="benchmarks/results")
    p.add_argument("--name", default="speed", help="the tables' file name stem in --output-dir (NAME.md, NAME.json)")
    p.add_argument("--count-only", action="store_true",
                   help="kernels per training and decoding step and the step's memory only, no timing "
                        "(any machine, seconds)")
    p.add_argument("--child", nargs=2, metavar=("SHAPE", "SYSTEM"), help=argparse.SUPPRESS)
    return p


def main(argv=None) -> int:
    p = build_parser()
    args = p.parse_args(argv)
    if args.repeats < 1:
        p.error(f"--repeats: got {args.repeats}; it must be >= 1")
    if args.child:
        args.shape, args.system = args.child
        print(json.dumps(measure(args)))
        return 0

    runs: Dict[Tuple[str, str], List[dict]] = {(shape, system): [] for shape in args.shapes for system in args.systems}
    for repeat in range(args.repeats):  # round-robin, so slow drifts of the machine hit every system alike
        for shape in args.shapes:
            for system in args.systems:
                cmd = [sys.executable, __file__, "--child", shape, system, *[a for a in (argv or sys.argv[1:])]]
                out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout.strip().splitlines()[-1]
                runs[(shape, system)].append(json.loads(out))
                done = runs[(shape, system)][-1]
                speed = "" if args.count_only else f"train {done['train_tokens_per_s']:8.0f} tok/s, "
                print(f"[repeat {repeat + 1}/{args.repeats}] {shape:5s} {system:10s} {speed}"
                      f"{done['train_kernels']} kernels per train step", flush=True)
                write_tables(args, runs)  # after every measurement: a run cut short by a time limit keeps it
    print((Path(args.output_dir) / f"{args.name}.md").read_text(), end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
