"""Loading trained models through fairseq's hub interface, with per-line input repair."""

import logging
from pathlib import Path
from typing import List, Sequence, Tuple, Union

import torch
from fairseq.hub_utils import GeneratorHubInterface

from . import USER_DIR
from .input_repair import EMPTY, repair_line, truncation_note
from .safe_checkpoints import check_checkpoint

logger = logging.getLogger(__name__)

Line = Union[str, bytes]


class CapsAggHubInterface(GeneratorHubInterface):
    """fairseq's ``GeneratorHubInterface`` whose ``translate`` survives any input line.

    Every line gives one translation: lines that needed repair (see
    :mod:`fairseq_capsagg.input_repair`), empty lines (translated as ``""``),
    lines longer than the model's source positions (truncated) and lines whose
    translation fails (``""``) each log one warning naming the line; the other
    lines of the batch are translated as usual.
    """

    def source_token_limit(self) -> int:
        limit = self.max_positions[0] if isinstance(self.max_positions, tuple) else self.max_positions
        return min(limit, self.models[0].encoder.max_positions())

    def truncate(self, text: str, limit: int) -> Tuple[str, List[str]]:
        """Cuts ``text`` to ``limit`` subword tokens, EOS included, if it is longer."""
        pieces = self.apply_bpe(self.tokenize(text)).split()
        if len(pieces) < limit:
            return text, []
        kept = self.detokenize(self.remove_bpe(" ".join(pieces[: limit - 1])))
        return kept, [truncation_note(len(pieces), limit - 1)]

    def translate_lines(self, lines: Sequence[Line], beam: int = 5,
                        **kwargs) -> List[Tuple[str, List[str]]]:
        """Translates ``lines`` (str or raw bytes); returns (translation, notes) for each line."""
        limit = self.source_token_limit()
        results: List[Tuple[str, List[str]]] = []
        todo: List[Tuple[int, str]] = []
        for number, raw in enumerate(lines):
            text, notes = repair_line(raw)
            if text:
                text, cut = self.truncate(text, limit)
                notes += cut
                todo.append((number, text))
            else:
                notes.append(EMPTY)
            results.append(("", notes))
        if not todo:
            return results
        try:
            outputs = super().translate([text for _, text in todo], beam=beam, **kwargs)
        except Exception:  # noqa: BLE001 (one bad line must not lose the others: retry one by one)
            outputs = []
            for number, text in todo:
                try:
                    outputs.append(super().translate(text, beam=beam, **kwargs))
                except Exception as e:  # noqa: BLE001 (any failure is reported for its line)
                    results[number][1].append(f"not translated: {e}")
                    outputs.append("")
        for (number, _), output in zip(todo, outputs):
            results[number] = (output, results[number][1])
        return results

    def translate(self, sentences: Union[Line, Sequence[Line]], beam: int = 5, verbose: bool = False,
                  **kwargs) -> Union[str, List[str]]:
        """As fairseq's ``translate``, with :meth:`translate_lines`' guarantees and warnings."""
        single = isinstance(sentences, (str, bytes))
        results = self.translate_lines([sentences] if single else sentences, beam=beam, verbose=verbose,
                                       **kwargs)
        for number, (_, notes) in enumerate(results):
            if notes:
                logger.warning("sentence %d: %s", number, "; ".join(notes))
        outputs = [output for output, _ in results]
        return outputs[0] if single else outputs


def from_pretrained(model_dir: Union[str, Path], checkpoint_file: str = "checkpoint_best.pt",
                    data_name_or_path: Union[str, Path] = ".", **kwargs) -> CapsAggHubInterface:
    """``TransformerModel.from_pretrained`` with this plugin's ``user_dir`` filled in.

    The checkpoint is first checked for pickled globals beyond those fairseq
    writes (see :mod:`fairseq_capsagg.safe_checkpoints`); it is then loaded
    with torch's ``weights_only=True``.

    Example::

        from fairseq_capsagg.hub import from_pretrained
        model = from_pretrained("runs/main/checkpoints/emrouting", "checkpoint_last.pt",
                                data_name_or_path="runs/main/data-bin", bpe="sentencepiece",
                                sentencepiece_model="runs/main/spm/spm.model")
        model.translate("Open the file.")

    Returns:
        a :class:`CapsAggHubInterface` (fairseq's ``GeneratorHubInterface``
        whose ``translate`` repairs or reports bad lines instead of failing).
    """
    from fairseq import hub_utils
    from fairseq.models.transformer import TransformerModel

    check_checkpoint(Path(model_dir) / checkpoint_file)
    kwargs.setdefault("user_dir", USER_DIR)
    loaded = hub_utils.from_pretrained(str(model_dir), checkpoint_file, str(data_name_or_path),
                                       archive_map=TransformerModel.hub_models(), **kwargs)
    hub = CapsAggHubInterface(loaded["args"], loaded["task"], loaded["models"])
    hub.eval()
    if not torch.cuda.is_available():
        hub.cpu()
    return hub
