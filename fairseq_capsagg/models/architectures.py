"""Every architecture of the plugin, registered in one place.

Names follow ``transformer_{family}_{shape}``, one family per registered aggregator that
declares one (:func:`fairseq_capsagg.aggregators.families`), with that aggregator on both sides:

=============  ==========================================  ====================================
family         on both sides                               paper
=============  ==========================================  ====================================
linagg         ``--*-aggregation linear``                  Eq. 3, Table 1 row 2
dyncomb        ``--*-aggregation dynamic``                 Eq. 4, Table 1 row 3
dynrouting     ``--*-aggregation dynamic-routing``         Algorithm 1, Table 1 row 4
emrouting      ``--*-aggregation em-routing``              Algorithm 2, Table 1 row 5
dwa            ``--*-dense-connections dwa``               DenseFormer (2024)
depthattn      ``--*-dense-connections depth-attention``   attention residuals (2026)
mudd           ``--*-dense-connections mudd``              MUDDFormer (2025)
dlcl           ``--*-dense-connections dlcl``              DLCL (Wang et al. 2019)
hc             ``--*-dense-connections hyper-connections`` hyper-connections (2025); pre-norm
mhc            ``--*-dense-connections mhc``               mHC (2025); pre-norm
=============  ==========================================  ====================================

=====  ============================================================================
shape  settings
=====  ============================================================================
base   Transformer-Base, as fairseq's ``transformer_wmt_en_de`` (d=512, ffn 2048,
       8 heads, 6+6 layers, post-norm)
big    Transformer-Big, as ``transformer_vaswani_wmt_en_de_big`` (d=1024, ffn 4096,
       16 heads, 6+6 layers, dropout 0.3, post-norm)
small  CPU-sized: d=128, ffn 512, 4 heads, 6+6 layers kept (so L is the paper's),
       pre-norm and tied decoder input/output embeddings; at this size post-norm
       with a short warm-up does not leave the uniform distribution within a CPU
       budget, while pre-norm learns (see docs/design.md)
=====  ============================================================================

Any flag given on the command line overrides the architecture's value, e.g.
``--arch transformer_emrouting_base --decoder-aggregation none`` for the
encoder-only ablation.
"""

from typing import Callable, Dict, List

from fairseq.models import register_model_architecture
from fairseq.models.transformer import (
    base_architecture,
    transformer_vaswani_wmt_en_de_big,
    transformer_wmt_en_de,
)

from ..aggregators import families, family_class
from .capsagg_transformer import capsagg_base_architecture

MODEL_NAME = "capsagg_transformer"


#: The CPU-sized shape; also given as flags to fairseq's plain ``transformer`` for baselines.
SMALL_SHAPE: Dict[str, object] = {
    "encoder_embed_dim": 128,
    "encoder_ffn_embed_dim": 512,
    "encoder_attention_heads": 4,
    "encoder_layers": 6,
    "encoder_normalize_before": True,
    "decoder_embed_dim": 128,
    "decoder_ffn_embed_dim": 512,
    "decoder_attention_heads": 4,
    "decoder_layers": 6,
    "decoder_normalize_before": True,
    "share_decoder_input_output_embed": True,
}


def small_shape(args) -> None:
    """The CPU-sized shape (see the module docstring)."""
    for key, value in SMALL_SHAPE.items():
        setattr(args, key, getattr(args, key, value))
    base_architecture(args)


def shape_flags(shape: Dict[str, object]) -> List[str]:
    """Command-line flags that give fairseq's ``transformer`` the same shape."""
    flags: List[str] = []
    for key, value in shape.items():
        flag = "--" + key.replace("_", "-")
        if value is True:
            flags.append(flag)
        elif value is not False:
            flags += [flag, str(value)]
    return flags


SHAPES: Dict[str, Callable] = {
    "base": transformer_wmt_en_de,
    "big": transformer_vaswani_wmt_en_de_big,
    "small": small_shape,
}


def _make_architecture(family: str, shape: Callable) -> Callable:
    cls = family_class(family)
    flag = "dense_connections" if cls.architecture_placement == "between-blocks" else "aggregation"
    pre_norm = getattr(cls, "needs_pre_norm", False)  # residual streams: every shape is pre-norm

    def architecture(args) -> None:
        for key, value in cls.architecture_settings.items():
            if getattr(args, key, None) is None:
                setattr(args, key, value)
        for side in ("encoder", "decoder"):
            setattr(args, f"{side}_{flag}", getattr(args, f"{side}_{flag}", cls.name))
            if pre_norm:
                setattr(args, f"{side}_normalize_before", getattr(args, f"{side}_normalize_before", True))
        shape(args)
        capsagg_base_architecture(args)

    return architecture


ARCHITECTURES: Dict[str, Callable] = {}
for _family in families():
    for _shape_name, _shape in SHAPES.items():
        _name = f"transformer_{_family}_{_shape_name}"
        ARCHITECTURES[_name] = register_model_architecture(MODEL_NAME, _name)(
            _make_architecture(_family, _shape)
        )
