"""Dense connections between the blocks of a fairseq layer stack (DenseFormer, MUDDFormer, attention residuals)."""

import functools
from typing import Any, Dict, List, Optional, Tuple

from torch import Tensor, nn

from ..aggregators import LayerAggregator
from ..aggregators.layer_history import LayerHistory


class DenseConnections(nn.Module):
    """After block i, X_i = Connection_i(B_0, ..., B_i) is block i + 1's input.

    B_0 is the stack's embedding output and B_i (i >= 1) block i's output; X_L,
    after the top block, is the stack's output (before its final LayerNorm).
    The connections run on fairseq's own layers and loops through module hooks,
    so the layers, their checkpoint keys, the encoder's and decoder's loops and
    incremental decoding stay fairseq's:

    * a forward pre-hook on the first block starts the history with its input B_0;
    * a forward hook on block i records its output B_i and returns X_i in its
      place, which fairseq passes on to block i + 1 (and records in its hidden states);
    * a multiway connection (MUDD) returns the residual stream and keeps the
      query, key and value aggregates for the next block's self-attention, whose
      forward pre-hook reads them (through the block's own LayerNorm in a
      pre-norm block). That self-attention then projects its key and value from
      their own inputs; its weights are unchanged.

    The B_i of one forward pass are written once each into one buffer, which
    every connection reads without a copy (:class:`~fairseq_capsagg.aggregators.layer_history.LayerHistory`;
    DLCL's buffer holds each output normalised once).

    Every connection works per position, so in incremental decoding a step's
    history is the current position's outputs only, and the keys and values of
    earlier positions come from fairseq's attention cache as usual.
    """

    def __init__(self, connections: List[LayerAggregator], layers: nn.ModuleList, normalize_before: bool):
        super().__init__()
        if len(connections) != len(layers):
            raise ValueError(f"{len(connections)} connections for {len(layers)} blocks")
        if not all(connection.depth_first for connection in connections):
            raise ValueError("connections between blocks read their layers depth first")
        self.connections = nn.ModuleList(connections)
        self.normalize_before = normalize_before
        self.embedding: Optional[Tensor] = None  # B_0, written with B_1
        self.history: Optional[LayerHistory] = None
        self.attention_inputs: Optional[Tensor] = None  # (3, T, B, C): the next block's query, key, value
        layers[0].register_forward_pre_hook(self._begin)
        for index, layer in enumerate(layers):
            layer.register_forward_hook(functools.partial(self._connect, index))
            if index > 0 and connections[index - 1].streams > 1:  # a self-attending block (checked when read)
                layer.self_attn.self_attention = False
                layer.self_attn.register_forward_pre_hook(
                    functools.partial(self._multiway_inputs, layer), with_kwargs=True)

    def _begin(self, block: nn.Module, args: Tuple[Any, ...]) -> None:
        self.embedding = args[0]
        self.history = LayerHistory(len(self.connections) + 1)
        self.attention_inputs = None

    def _connect(self, index: int, block: nn.Module, args: Tuple[Any, ...], output: Any) -> Any:
        connection = self.connections[index]
        newest = connection.stack_input(index + 1, output[0] if isinstance(output, tuple) else output)
        if index == 0:
            stacked = self.history.extend([connection.stack_input(0, self.embedding), newest])
            self.embedding = None
        else:
            stacked = self.history.extend([newest])
        mixed = connection(stacked)
        if index == len(self.connections) - 1:
            self.history = None
        if mixed.dim() == 4:  # (query, key, value, residual); split, whose backward is one concatenation
            self.attention_inputs, residual = mixed.split((3, 1))
            mixed = residual.squeeze(0)
        return (mixed, *output[1:]) if isinstance(output, tuple) else mixed

    def _multiway_inputs(self, block: nn.Module, attention: nn.Module, args: Tuple[Any, ...],
                         kwargs: Dict[str, Any]) -> Tuple[Tuple[Any, ...], Dict[str, Any]]:
        if self.attention_inputs is None:
            raise RuntimeError("a multiway block ran without the connection before it")
        streams, self.attention_inputs = self.attention_inputs, None
        if self.normalize_before:  # the three at once: one LayerNorm each way, not three
            streams = block.self_attn_layer_norm(streams)
        query, key, value = streams.unbind(0)
        return args, dict(kwargs, query=query, key=key, value=value)


class ResidualStreams(nn.Module):
    """Connections that keep n residual streams (hyper-connections, mHC) on fairseq's own layers.

    * a forward pre-hook on block l gives it its input read from the streams in place of what fairseq passes
      it (the first block's starts the streams as n copies of the embedding output and reads them);
    * a forward hook on block l writes its output back into the streams and returns the stack's readout
      of them (held by the top block's connection), which fairseq records as the block's output and
      passes on (after the top block: the stack's output); below the top block the same hook reads block
      l + 1's input and weights from the streams it wrote (:meth:`.StreamConnection.read_after_write`, one
      operator with the write where the family fuses them).

    Everything works per position, so incremental decoding runs the streams of the current position only.
    """

    def __init__(self, connections: List[LayerAggregator], layers: nn.ModuleList):
        super().__init__()
        if len(connections) != len(layers):
            raise ValueError(f"{len(connections)} connections for {len(layers)} blocks")
        self.connections = nn.ModuleList(connections)
        self.streams: Optional[Tensor] = None  # (T, B, n, C)
        self.block_input: Optional[Tensor] = None
        self.weights: Optional[Tuple[Tensor, Tensor]] = None  # (r, b) of the block's write
        for index, layer in enumerate(layers):
            layer.register_forward_pre_hook(functools.partial(self._read, index), with_kwargs=True)
            layer.register_forward_hook(functools.partial(self._write, index))

    def _read(self, index: int, block: nn.Module, args: Tuple[Any, ...],
              kwargs: Dict[str, Any]) -> Tuple[Tuple[Any, ...], Dict[str, Any]]:
        if index == 0:
            connection = self.connections[0]
            self.streams = connection.expand(args[0] if args else kwargs["x"])
            self.block_input, self.weights = connection.read_with_weights(self.streams)
        # above the first block, the write of the block below has read this block's input and weights
        if args:
            return (self.block_input, *args[1:]), kwargs
        return args, dict(kwargs, x=self.block_input)

    def _write(self, index: int, block: nn.Module, args: Tuple[Any, ...], output: Any) -> Any:
        connection = self.connections[index]
        newest = output[0] if isinstance(output, tuple) else output
        # and the state after it, by the stack's one readout (the top block's connection holds it)
        readout = self.connections[-1].readout
        if index == len(self.connections) - 1:
            _, state = connection.write(self.streams, self.weights, self.block_input, newest, readout)
            self.streams = self.block_input = self.weights = None
        else:  # and the next block's read of the streams written
            self.streams, state, self.block_input, self.weights = self.connections[index + 1].read_after_write(
                self.streams, self.weights, self.block_input, newest, readout)
        return (state, *output[1:]) if isinstance(output, tuple) else state
