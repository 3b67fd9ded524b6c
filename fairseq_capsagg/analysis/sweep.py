"""``analysis sweep``: BLEU against output capsules, routing iterations or an ablation.

Each value is one run of the main job (:mod:`fairseq_capsagg.pipeline.drivers.main_job`) in its own
work directory, with the value passed to the aggregator system through
``--model-args``; finished runs are collected, not retrained.
"""

import json
import subprocess
import sys
from pathlib import Path
from typing import Dict, List

from .plotting import plot_series

#: How each swept parameter becomes fairseq-train flags.
SWEEPS = {
    "output-capsules": lambda v: ["--output-capsules", v],
    "routing-iters": lambda v: ["--routing-iters", v],
    "capsule-input": lambda v: ["--capsule-input", v],
    "side": lambda v: {"encoder": ["--decoder-aggregation", "none"],
                       "decoder": ["--encoder-aggregation", "none"], "both": []}[v],
}


def model_args(param: str, value: str) -> List[str]:
    try:
        return SWEEPS[param](value)
    except KeyError:
        raise ValueError(f"--values: {value!r} is not a value of {param} (side takes encoder, decoder, both)") from None


def run(args) -> Dict[str, object]:
    workdir = Path(args.workdir)
    results: Dict[str, float] = {}
    for value in args.values:
        run_dir = workdir / f"{args.param}-{value}"
        results_file = run_dir / "results.json"
        if not results_file.exists():
            if args.collect_only:
                raise FileNotFoundError(f"{results_file} does not exist (rerun without --collect-only)")
            flags = " ".join(model_args(args.param, value))
            cmd = [sys.executable, "-m", "fairseq_capsagg.pipeline.drivers.main_job", "--workdir", str(run_dir),
                   "--systems", args.system, "--no-equal-time", "--model-args", flags, *args.main_job_args]
            print(f"[sweep] {args.param}={value}: {' '.join(cmd)}", flush=True)
            subprocess.run(cmd, check=True)
        rows = json.loads(results_file.read_text())["rows"]
        results[value] = rows[-1]["bleu"]
    out = Path(args.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    summary = {"param": args.param, "system": args.system, "bleu": results}
    (out / f"sweep-{args.param}.json").write_text(json.dumps(summary, indent=2))
    plot_series(list(results), {args.system: list(results.values())}, out / f"sweep-{args.param}.png",
                f"BLEU against {args.param}", args.param)
    return summary
