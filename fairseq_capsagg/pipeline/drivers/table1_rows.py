"""The rows of the paper's Table 1 and of its peers table, in the order they train.

Each :class:`~.rows.Row` names its system, protocol, seed and the row it is compared against; the converged
comparison's rows are :func:`.converged.converged_rows`.
"""

import json
from pathlib import Path
from typing import Dict, List, Sequence

from .. import fairseq_runs
from ..rows import Row


def table_rows(systems: List[str], second_seed: List[str]) -> List[Row]:
    """Every row, in the order they are trained: the baseline and the warm-start protocol first."""
    rows = [Row("scratch-baseline-s1", "baseline", "scratch", 1, "scratch-baseline-s1"),
            Row("warm-baseline", "baseline", "warm", 1, "warm-baseline")]
    aggregators = [s for s in systems if s != "baseline"]
    order = sorted(aggregators, key=lambda s: (s != "emrouting", not fairseq_runs.warm_start_flags(s)))
    for system in order:
        rows.append(Row(f"warm-{system}", system, "warm", 1, "warm-baseline"))
        rows.append(Row(f"scratch-{system}-s1", system, "scratch", 1, "scratch-baseline-s1"))
    for system in second_seed:
        rows.append(Row(f"scratch-{system}-s2", system, "scratch", 2, "scratch-baseline-s1"))
    if "emrouting" in aggregators:
        # the measurement behind the default --aggregation-layer-norm on (pre-norm shapes)
        rows.append(Row("scratch-emrouting-rawlayers-s1", "emrouting", "scratch", 1, "scratch-baseline-s1",
                        ("--aggregation-layer-norm", "off")))
        # the identity start from scratch: input capsules and votes that carry H^L, as in the warm rows
        rows.append(Row("scratch-emrouting-identity-s1", "emrouting", "scratch", 1, "scratch-baseline-s1",
                        tuple(fairseq_runs.warm_start_flags("emrouting"))))
        # one M-step and no E-step: the same votes, activations and parameters without routing-by-agreement
        rows.append(Row("scratch-emrouting-iter1-s1", "emrouting", "scratch", 1, "scratch-baseline-s1",
                        ("--routing-iters", "1")))
        # the paper's Table 5 ablation: routing on the encoder only, the decoder the Transformer's; under
        # both protocols
        rows.append(Row("scratch-emrouting-encoder-s1", "emrouting", "scratch", 1, "scratch-baseline-s1",
                        ("--decoder-aggregation", "none")))
        rows.append(Row("warm-emrouting-encoder", "emrouting", "warm", 1, "warm-baseline",
                        ("--decoder-aggregation", "none")))
    if "dynrouting" in aggregators:
        # the softmax of Eq. 10 over the input capsules: with the paper's, dynamic routing does not learn at N = d
        rows.append(Row("scratch-dynrouting-inputsoftmax-s1", "dynrouting", "scratch", 1, "scratch-baseline-s1",
                        ("--routing-softmax", "input")))
    return rows


#: The output capsules N of the capsule-width table at ``small`` (d 128: capsules of width 128 down to 2). At N = 1
#: the paper's softmax over output capsules is 1 whatever the agreement (no routing: the squashed sum of the
#: votes), the row that tells what routing adds.
SWEEP_CAPSULES = (1, 2, 4, 8, 16, 32, 64)


def capsule_rows() -> List[Row]:
    """The capsule-width table (``--table capsules``): dynamic routing from scratch at each of
    :data:`SWEEP_CAPSULES` output capsules, with the paper's routing softmax over the output capsules and with
    ``--routing-softmax input``, against the Transformer of Table 1: which capsule width learns (the measurement
    behind the architectures' default ``--output-capsules``)."""
    rows = [Row("scratch-baseline-s1", "baseline", "scratch", 1, "scratch-baseline-s1")]
    for n in SWEEP_CAPSULES:
        for softmax in ("output", "input"):
            suffix = "" if softmax == "output" else "-inputsoftmax"
            rows.append(Row(f"scratch-dynrouting-n{n}{suffix}-s1", "dynrouting", "scratch", 1, "scratch-baseline-s1",
                            ("--output-capsules", str(n), "--routing-softmax", softmax)))
    return rows


def peer_rows(systems: List[str], second_seed: List[str], max_update: int,
              speed_ratios: Dict[str, float]) -> List[Row]:
    """The peers table: every system from scratch at equal updates, then at equal wall-clock."""
    rows = [Row("scratch-baseline-s1", "baseline", "scratch", 1, "scratch-baseline-s1")]
    aggregators = [s for s in systems if s != "baseline"]
    rows += [Row(f"scratch-{system}-s1", system, "scratch", 1, "scratch-baseline-s1") for system in aggregators]
    rows += [Row(f"scratch-{system}-s2", system, "scratch", 2, "scratch-baseline-s1") for system in second_seed]
    for system in aggregators:
        updates = max(1, round(max_update * speed_ratios[system]))
        rows.append(Row(f"time-{system}-s1", system, "time", 1, "scratch-baseline-s1", max_update=updates))
    return rows


#: The compute-equivalence table's systems, in this order: the Transformer (its seed rows), the one-epoch winners
#: (hyper-connections, the dynamic combination, MUDD), then the paper's EM routing, then the rest of the dense peers.
EQUIVALENCE_SYSTEMS = ("baseline", "hc", "dyncomb", "mudd", "emrouting", "dwa", "dlcl")


#: The seeds of the Transformer's rows in the compute-equivalence table: other than the converged runs' (seed 1),
#: whose curves every row is placed on, so that the Transformer's own ratios are its seed band.
EQUIVALENCE_TRANSFORMER_SEEDS = (2, 3)


def equivalence_rows(systems: Sequence[str], second_seed: Sequence[str] = ()) -> List[Row]:
    """The compute-equivalence table, rows from scratch (``protocol`` "converged": trained by the stop rule, there
    a fixed budget): the Transformer at :data:`EQUIVALENCE_TRANSFORMER_SEEDS` first where it is asked for, then
    seed 1 of every other system, then seed 2 of those in ``second_seed``; every row's test scores read against
    the Transformer's first seed here."""
    reference = f"scratch-baseline-s{EQUIVALENCE_TRANSFORMER_SEEDS[0]}"
    seeds = [("baseline", seed) for seed in EQUIVALENCE_TRANSFORMER_SEEDS if "baseline" in systems]
    others = [s for s in systems if s != "baseline"]
    seeds += [(s, 1) for s in others] + [(s, 2) for s in others if s in second_seed]
    return [Row(f"scratch-{s}-s{seed}", s, "converged", seed, reference) for s, seed in seeds]


def measured_speed_ratios(path: Path, shape: str) -> Dict[str, float]:
    """The training-speed ratio to the baseline at ``shape`` of every system ``path`` (``benchmarks/speed.py``'s
    JSON) measured; none without the file."""
    if not path.is_file():
        return {}
    return {r["system"]: r["train_tokens_per_s_ratio"] for r in json.loads(path.read_text())["rows"]
            if r["shape"] == shape}


def read_speed_ratios(path: Path, shape: str, systems: List[str]) -> Dict[str, float]:
    """:func:`measured_speed_ratios` of ``systems``, every one of them required.

    Raises:
        ValueError: the file is missing or lacks a system.
    """
    if not path.is_file():
        raise ValueError(f"--speed-json: {path} does not exist; run python benchmarks/speed.py --shapes {shape}")
    ratios = measured_speed_ratios(path, shape)
    missing = [s for s in systems if s not in ratios]
    if missing:
        raise ValueError(f"--speed-json: {path} has no {shape} row for {', '.join(missing)}; run python "
                         f"benchmarks/speed.py --shapes {shape} --systems baseline {' '.join(missing)}")
    return {s: ratios[s] for s in systems}


def speed_ratios_by_device(paths: Sequence[Path], shape: str) -> Dict[str, Dict[str, object]]:
    """The training-speed ratios at ``shape`` of each ``benchmarks/speed.py`` JSON in ``paths``, by the device it
    names (as :func:`~..provenance.device_name` does, so a row finds the ratios of the machine it trained on:
    the aggregators' share of a step differs between CPUs): ``{device: {"source": path, "ratios": {...}}}``.
    Files that do not exist are left out (none: no seconds).

    Raises:
        ValueError: naming ``--speed-json`` when two files name one device.
    """
    out: Dict[str, Dict[str, object]] = {}
    for path in (p for p in paths if p.is_file()):
        device = json.loads(path.read_text())["device"]
        if device in out:
            raise ValueError(f"--speed-json: {out[device]['source']} and {path} were both measured on {device}; "
                             "give one file per device")
        out[device] = {"source": str(path), "ratios": measured_speed_ratios(path, shape)}
    return out
