"""Parameter counts of every architecture next to the paper's Tables 1 and 2.

Run ``capsagg-params`` (or ``python -m fairseq_capsagg.tools.param_count``). Models
are built on torch's ``meta`` device, so even the big shape costs no memory.
"""

import argparse
from pathlib import Path
from typing import Dict, List, Optional

import torch

from ..aggregators import families
from ..models import SHAPES
from ..models.build import build_model, joined_dictionary, model_args

#: Added parameters reported by Dou et al. (2019), Table 1 (Transformer-Base, WMT14 En-De).
PAPER_TABLE1_DELTA_M = {"linagg": 14.7, "dyncomb": 25.2, "dynrouting": 37.8, "emrouting": 56.8}
#: Table 2: Transformer-Base 88M -> +EM routing 123M; Big 264M -> 490M (En-De).
PAPER_TABLE2_M = {"base": (88.0, 123.0), "big": (264.0, 490.0)}

#: The embeddings fairseq ties (``--share-all-embeddings``; the decoder's two under
#: ``--share-decoder-input-output-embed``).
TIED_EMBEDDINGS = ("encoder.embed_tokens.weight", "decoder.embed_tokens.weight", "decoder.output_projection.weight")


def count_checkpoint_parameters(checkpoint: Path) -> int:
    """Trainable tensors in a checkpoint, each shared (tied) tensor counted once: tensors that share storage,
    and tied embeddings saved as equal copies. fairseq moves each tensor to the CPU on its own before saving
    (``utils.move_to_cpu``), so a checkpoint saved on a GPU, or from half precision, holds every tied
    embedding as a copy of its own."""
    state = torch.load(checkpoint, map_location="cpu")
    model = state["model"]
    tied = next((model[name] for name in TIED_EMBEDDINGS if name in model), None)
    seen, total = set(), 0
    for name, tensor in model.items():
        if name.endswith((".version", "._float_tensor")) or not tensor.is_floating_point():
            continue
        key = (tensor.untyped_storage().data_ptr(), tensor.storage_offset(), tensor.numel())
        if name in TIED_EMBEDDINGS and tensor.shape == tied.shape and torch.equal(tensor, tied):
            key = TIED_EMBEDDINGS
        if key not in seen:
            seen.add(key)
            total += tensor.numel()
    return total


GAPS = """\
Why the added parameters differ from the paper's:
- The paper does not give the shapes of F_l, FFN_l or W_{l->n}. Here every F_l
  (Eq. 9) is one linear map of the concatenated layers, L*d -> d, so input
  capsules cost L*L*d^2 per side; votes cost L*d^2 per side; the rest is small.
  Non-linear F_l with hidden layers would add more.
- Linear combination uses W_l in R^d (Eq. 3 as printed), a few thousand
  parameters; --linear-combination-weights matrix gives L*d^2 per side. The
  paper's +14.7M matches neither: Dou et al. (2018) count more machinery.
- The paper's own totals disagree: Table 1 gives EM routing +56.8M at base,
  Table 2 gives 88M -> 123M (+35M). Our EM routing adds ~22M at base, like
  dynamic routing: its activations W^H_l and betas add only L*d + L + 2N per side.
- Vanilla totals depend on the vocabulary and on embedding sharing, which the
  paper does not state; the deltas above do not."""


def count_parameters(arch: str, vocab_size: int, extra: Optional[List[str]] = None) -> int:
    """Parameters of ``arch`` built with a joined dictionary of ``vocab_size`` symbols."""
    with torch.device("meta"):
        model = build_model(model_args(arch, extra or []), joined_dictionary(vocab_size))
    return sum(p.numel() for p in model.parameters())


def parameter_table(vocab_size: int, share: str) -> List[Dict[str, object]]:
    """Parameters of the Transformer and of every family at every shape, and what each family adds, with the
    embeddings shared as ``share`` says (``none``, ``decoder``, ``all``)."""
    share_flags = {"none": [], "decoder": ["--share-decoder-input-output-embed"],
                   "all": ["--share-all-embeddings"]}[share]
    rows = []
    for shape in SHAPES:
        baseline_flags = share_flags + ["--encoder-aggregation", "none", "--decoder-aggregation", "none"]
        baseline = count_parameters(f"transformer_linagg_{shape}", vocab_size, baseline_flags)
        rows.append({"shape": shape, "family": "baseline", "params": baseline, "delta": 0})
        for family in families():
            total = count_parameters(f"transformer_{family}_{shape}", vocab_size, share_flags)
            rows.append({"shape": shape, "family": family, "params": total, "delta": total - baseline})
    return rows


def format_table(rows: List[Dict[str, object]]) -> str:
    """:func:`parameter_table` in Markdown, next to what the paper's Tables 1 and 2 report."""
    lines = ["| shape | model | params | added | paper added (Table 1, base) | paper total (Table 2) |",
             "|---|---|---:|---:|---:|---:|"]
    for row in rows:
        family, shape = row["family"], row["shape"]
        in_paper = shape == "base" and family in PAPER_TABLE1_DELTA_M
        paper_delta = f"+{PAPER_TABLE1_DELTA_M[family]:.1f}M" if in_paper else ""
        paper_total = ""
        if shape in PAPER_TABLE2_M and family in ("baseline", "emrouting"):
            paper_total = f"{PAPER_TABLE2_M[shape][0 if family == 'baseline' else 1]:.0f}M"
        added = "" if family == "baseline" else f"+{row['delta'] / 1e6:.2f}M"
        lines.append(f"| {shape} | {family} | {row['params'] / 1e6:.2f}M | {added} | {paper_delta} | {paper_total} |")
    return "\n".join(lines)


def cli_main(argv: Optional[List[str]] = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--vocab-size", type=int, default=32000,
                        help="joined dictionary size (default 32000, the paper's 32K BPE)")
    parser.add_argument("--share", choices=("none", "decoder", "all"), default="none",
                        help="embedding sharing of every model (default none)")
    args = parser.parse_args(argv)
    print(format_table(parameter_table(args.vocab_size, args.share)))
    print()
    print(GAPS)


if __name__ == "__main__":
    cli_main()
