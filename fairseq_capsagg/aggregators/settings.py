"""Settings whose dataclass fields carry their own flag, default, help and allowed values.

Every aggregator declares its settings as one dataclass of :func:`setting` fields. A field's
name is its flag with ``--`` dropped and dashes as underscores (``routing_iters`` is
``--routing-iters``), so one name travels from the command line to the aggregator: the model reads
the settings from its arguments once (``models/aggregating_stack.py``), and an aggregator only ever
receives its own dataclass.
"""

import argparse
import dataclasses
import typing
from typing import Any, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple, Type, TypeVar, Union


class AggregationConfigError(ValueError):
    """A bad aggregation setting; the message names the flag and its allowed values."""


def setting(default: Any, help: str, *, choices: Optional[Sequence[str]] = None,
            metavar: Optional[str] = None) -> Any:
    """A settings field: its default, the ``--help`` text and, for a string, its allowed values."""
    return dataclasses.field(default=default, metadata={"help": help, "choices": tuple(choices or ()),
                                                        "metavar": metavar})


def flag_name(field_name: str) -> str:
    """``routing_iters`` -> ``--routing-iters``."""
    return "--" + field_name.replace("_", "-")


S = TypeVar("S", bound="Settings")


@dataclasses.dataclass
class Settings:
    """Base of every settings dataclass (an aggregator's, or the aggregating stack's)."""

    @classmethod
    def fields(cls) -> Tuple[dataclasses.Field, ...]:
        return dataclasses.fields(cls)

    @classmethod
    def from_values(cls: Type[S], values: Mapping[str, Any]) -> S:
        """Reads this class's fields from a mapping of setting names to values (absent or None: the
        default); other names in it (other aggregators' settings) are not read."""
        kwargs = {f.name: values[f.name] for f in cls.fields() if values.get(f.name) is not None}
        return cls(**kwargs)

    def require(self, name: str, holds: bool, requirement: str) -> None:
        """Raises ``--flag: got VALUE; REQUIREMENT`` for field ``name`` unless ``holds``."""
        if not holds:
            raise AggregationConfigError(f"{flag_name(name)}: got {getattr(self, name)}; {requirement}")

    def check_choices(self) -> None:
        """Raises :class:`AggregationConfigError` for a value outside its field's choices."""
        for f in self.fields():
            choices = f.metadata["choices"]
            value = getattr(self, f.name)
            if choices and value not in choices:
                raise AggregationConfigError(
                    f"{flag_name(f.name)}: got {value!r}; choose one of {', '.join(choices)}")


def distinct_fields(settings_classes: Iterable[Type[Settings]]) -> List[dataclasses.Field]:
    """Every field of the classes once (classes that share a base share its fields).

    Raises:
        ValueError: two classes define the same flag with different defaults, help or choices.
    """
    seen: Dict[str, dataclasses.Field] = {}
    for cls in settings_classes:
        for f in cls.fields():
            other = seen.setdefault(f.name, f)
            if other is not f and (other.default, dict(other.metadata)) != (f.default, dict(f.metadata)):
                raise ValueError(f"{flag_name(f.name)} is defined twice, differently ({cls.__name__})")
    return list(seen.values())


def add_flags(parser: argparse.ArgumentParser, fields: Iterable[dataclasses.Field],
              architecture_values: Optional[Mapping[str, str]] = None) -> None:
    """Adds one flag per field, with no argparse default (fairseq's architectures fill them in); a field some
    architectures set otherwise says so after its default (``architecture_values``: the text by field name)."""
    for f in fields:
        kind = typing.get_args(f.type)[0] if typing.get_origin(f.type) is Union else f.type
        default = f"default: {f.default}" if f.default is not None else ""
        help_text = f.metadata["help"] + (f" ({default})" if default and kind is not bool else "")
        if architecture_values and f.name in architecture_values:
            help_text += f" ({architecture_values[f.name]})"
        if kind is bool:
            parser.add_argument(flag_name(f.name), action="store_true", help=help_text)
        elif f.metadata["choices"]:
            parser.add_argument(flag_name(f.name), choices=f.metadata["choices"], help=help_text)
        else:
            parser.add_argument(flag_name(f.name), type=kind, metavar=f.metadata["metavar"], help=help_text)


def fill_defaults(args: Any, fields: Iterable[dataclasses.Field]) -> None:
    """Sets every field that ``args`` lacks (or holds as None) to its default."""
    for f in fields:
        if getattr(args, f.name, None) is None:
            setattr(args, f.name, f.default)


#: The implementations of ``--connection-kernels``: the fused operators where their Triton kernels run (auto), the
#: fused operators everywhere (on a CPU: the references inside one operator each way), or the eager references.
KERNELS = ("auto", "fused", "eager")


@dataclasses.dataclass
class KernelSettings(Settings):
    """The setting of every family with fused operators."""

    connection_kernels: str = setting(
        "auto", "routing, depth attention, MUDD, hyper-connections, mHC: the routing iterations and each "
                 "connection's weights, read and write as a few fused operators each way, a Triton kernel each "
                 "(auto: on CUDA with Triton, the eager references elsewhere; fused: everywhere, on a CPU the "
                 "references inside the operators) or as the eager references (eager: tens of kernels a "
                 "connection); the same values", choices=KERNELS)
