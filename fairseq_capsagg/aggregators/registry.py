"""The aggregators by name: what flags, architectures, tools and tests are derived from."""

from typing import Any, Dict, List, Mapping, Optional, Type, TypeVar, Union

from .base import LayerAggregator
from .settings import AggregationConfigError, Settings, distinct_fields

#: Every registered aggregator class by its :attr:`~LayerAggregator.name`, in registration order.
AGGREGATORS: Dict[str, Type[LayerAggregator]] = {}

A = TypeVar("A", bound=Type[LayerAggregator])


def register_aggregator(cls: A) -> A:
    """Class decorator: makes ``cls`` a value of ``--{encoder,decoder}-aggregation``.

    Raises:
        ValueError: the name or family is taken, its settings redefine another's flag, or its architectures set
            a setting it does not have.
    """
    if cls.name in AGGREGATORS:
        raise ValueError(f"aggregator name {cls.name!r} is registered twice")
    if cls.family and cls.family in families():
        raise ValueError(f"aggregator family {cls.family!r} is registered twice")
    distinct_fields([*settings_classes(), cls.Settings])  # same flag, same meaning
    unknown = set(cls.architecture_settings) - {f.name for f in cls.Settings.fields()}
    if unknown:
        raise ValueError(f"{cls.__name__}.architecture_settings: {sorted(unknown)} are not its settings")
    AGGREGATORS[cls.name] = cls
    return cls


def aggregation_choices() -> List[str]:
    """The values of ``--encoder-aggregation`` / ``--decoder-aggregation``: every aggregator that can run at
    a stack's output."""
    return [name for name, cls in AGGREGATORS.items() if "output" in cls.placements]


def dense_connection_choices() -> List[str]:
    """The values of ``--encoder-dense-connections`` / ``--decoder-dense-connections``: ``none`` and
    every aggregator that can run between blocks."""
    return ["none", *(name for name, cls in AGGREGATORS.items() if "between-blocks" in cls.placements)]


def families() -> Dict[str, str]:
    """``transformer_{family}_{shape}`` family -> aggregator name, for every aggregator that has one."""
    return {cls.family: name for name, cls in AGGREGATORS.items() if cls.family}


def aggregator_class(name: str) -> Type[LayerAggregator]:
    """The class registered as ``name``; an unknown name gets the allowed values."""
    if name not in aggregation_choices():
        raise AggregationConfigError(f"unknown aggregation {name!r}; choose one of {', '.join(aggregation_choices())}")
    return AGGREGATORS[name]


def dense_connection_class(name: str) -> Type[LayerAggregator]:
    """The class of a between-blocks connection; any other name gets the allowed values."""
    choices = dense_connection_choices()
    if name not in choices[1:]:
        raise AggregationConfigError(f"{name!r} cannot connect blocks; choose one of {', '.join(choices)}")
    return AGGREGATORS[name]


def family_class(family: str) -> Type[LayerAggregator]:
    """The class whose architectures are ``transformer_{family}_{shape}``."""
    return AGGREGATORS[families()[family]]


def architecture_defaults(family: str) -> Dict[str, Any]:
    """Every setting of ``family``'s aggregator as its ``transformer_{family}_{shape}`` architectures set it: the
    flags' defaults, but where the class's ``architecture_settings`` say otherwise."""
    cls = family_class(family)
    return {f.name: cls.architecture_settings.get(f.name, f.default) for f in cls.Settings.fields()}


def settings_classes() -> List[Type[Settings]]:
    """Each registered aggregator's settings class, once."""
    return list(dict.fromkeys(cls.Settings for cls in AGGREGATORS.values()))


def validated_settings(cls: Type[LayerAggregator], values: Optional[Union[Settings, Mapping[str, Any]]],
                       embed_dim: int) -> Settings:
    """The settings of aggregator ``cls`` at width d, checked: its own dataclass, or a mapping of setting
    names to values (defaults for the rest; None: all defaults).

    Raises:
        AggregationConfigError: a name no aggregator has, or a value ``cls`` cannot work with.
    """
    if values is None or isinstance(values, Mapping):
        values = values or {}
        known = {f.name for f in distinct_fields(settings_classes())}
        unknown = sorted(set(values) - known)
        if unknown:
            raise AggregationConfigError(f"unknown aggregation settings {unknown}; known: {', '.join(sorted(known))}")
        values = cls.Settings.from_values(values)
    cls.validate(values, embed_dim)
    return values


def make_aggregator(cls: Type[LayerAggregator], embed_dim: int, num_layers: int, settings: Settings,
                    side: str = "") -> LayerAggregator:
    """Aggregator ``cls`` over L = ``num_layers`` outputs of width d, from settings already validated;
    ``side`` (``encoder`` or ``decoder``) names it in fault messages."""
    cls.check_num_layers(num_layers)
    aggregator = cls.from_settings(embed_dim, num_layers, settings)
    aggregator.side = side
    return aggregator


def make_dense_connections(cls: Type[LayerAggregator], embed_dim: int, num_blocks: int, settings: Settings,
                           side: str = "") -> List[LayerAggregator]:
    """The connections of a densely connected stack from settings already validated: one after each of
    ``num_blocks`` blocks, the i-th (from 0) over the embedding and the i + 1 block outputs so far."""
    connections = cls.connect_blocks(embed_dim, num_blocks, settings)
    for connection in connections:
        connection.side = side
    return connections


def build_aggregator(name: str, embed_dim: int, num_layers: int,
                     settings: Optional[Union[Settings, Mapping[str, Any]]] = None, side: str = "") -> LayerAggregator:
    """Builds the aggregator called ``name`` for L = ``num_layers`` outputs of width d.

    Args:
        name: a registered name (:func:`aggregation_choices`).
        embed_dim: d.
        num_layers: L, the number of layer outputs passed to ``forward``.
        settings: the aggregator's settings dataclass, or a mapping of setting names to values
            (values of other aggregators are not read); defaults when None.
        side: ``encoder`` or ``decoder``; names the aggregator in fault messages.

    Raises:
        AggregationConfigError: for an unknown name or impossible settings.
    """
    cls = aggregator_class(name)
    return make_aggregator(cls, embed_dim, num_layers, validated_settings(cls, settings, embed_dim), side)


def build_dense_connections(name: str, embed_dim: int, num_blocks: int,
                            settings: Optional[Union[Settings, Mapping[str, Any]]] = None,
                            side: str = "") -> List[LayerAggregator]:
    """The connections of a densely connected stack (:func:`make_dense_connections`), settings checked.

    Raises:
        AggregationConfigError: for a name that cannot connect blocks, or impossible settings.
    """
    cls = dense_connection_class(name)
    return make_dense_connections(cls, embed_dim, num_blocks, validated_settings(cls, settings, embed_dim), side)
