"""python -m fairseq_capsagg.analysis {agreement,depth-weights,length,sweep} ..."""

import argparse
import json
import sys

from ..aggregators import families
from ..tools.extras import require_extra

require_extra("python -m fairseq_capsagg.analysis")
from . import agreement, depth_weights, length, sweep  # noqa: E402 (after the check: they plot with matplotlib)


def add_model_on_split_args(p: argparse.ArgumentParser, checkpoint_help: str) -> None:
    """The flags of an analysis that runs a checkpoint over a data split."""
    p.add_argument("--path", required=True, help=checkpoint_help)
    p.add_argument("--data", required=True, help="fairseq data-bin directory")
    p.add_argument("--subset", default="test")
    p.add_argument("--max-tokens", type=int, default=4000)
    p.add_argument("--max-sentences", type=int, default=0, help="stop after this many (0: all)")
    p.add_argument("--output-dir", default="analysis")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m fairseq_capsagg.analysis",
                                     description="the analyses of Dou et al. (2019) for trained models")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("agreement", help="agreement heatmaps, entropy and diversity per routing iteration")
    add_model_on_split_args(p, "checkpoint of a routing model")
    p.set_defaults(run=agreement.run)

    p = sub.add_parser("depth-weights", help="mean weight of each earlier layer in every dense connection that "
                                             "weighs layers (dwa, depth-attention, mudd, dlcl)")
    add_model_on_split_args(p, "checkpoint of a model with dense connections or a peer aggregator")
    p.set_defaults(run=depth_weights.run)

    p = sub.add_parser("length", help="BLEU by source-sentence length")
    p.add_argument("--source", required=True, help="raw source sentences, one per line")
    p.add_argument("--reference", required=True, help="raw reference translations, one per line")
    p.add_argument("--system", action="append", required=True,
                   help="NAME=PATH of fairseq-generate output or plain text; repeat per system")
    p.add_argument("--edges", nargs="+", default=["0", "10", "20", "30", "40", "50"],
                   help="bucket lower edges in source words (the last bucket is open)")
    p.add_argument("--output-dir", default="analysis")
    p.set_defaults(run=length.run)

    p = sub.add_parser("sweep", help="run or collect a sweep and plot BLEU against the swept value")
    p.add_argument("--param", required=True, choices=sorted(sweep.SWEEPS))
    p.add_argument("--values", nargs="+", required=True)
    p.add_argument("--system", default="emrouting", choices=list(families()))
    p.add_argument("--workdir", default="runs/sweep")
    p.add_argument("--collect-only", action="store_true", help="only read finished runs")
    p.add_argument("--output-dir", default="analysis")
    p.add_argument("main_job_args", nargs=argparse.REMAINDER,
                   help="after --: more flags for the main job (e.g. -- --quick)")
    p.set_defaults(run=sweep.run)
    return parser


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    if getattr(args, "main_job_args", None) and args.main_job_args[0] == "--":
        args.main_job_args = args.main_job_args[1:]
    try:
        result = args.run(args)
    except (ValueError, OSError) as e:  # fairseq's "Model file not found" is an OSError, not FileNotFoundError
        print(f"analysis {args.command}: error: {e}", file=sys.stderr)
        return 2
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
