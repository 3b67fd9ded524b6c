"""Loading trained models through fairseq's hub interface, with per-line input repair."""

import logging
from pathlib import Path
from typing import List, Sequence, Tuple, Union

import torch
from fairseq.hub_utils import GeneratorHubInterface
from torch import Tensor

from ..user_dir import USER_DIR
from ..input_repair import EMPTY, repair_line, truncate_tokens
from ..patches.safe_checkpoints import check_checkpoint

logger = logging.getLogger(__name__)

Line = Union[str, bytes]


class CapsAggHubInterface(GeneratorHubInterface):
    """fairseq's ``GeneratorHubInterface`` whose ``translate`` survives any input line.

    Every line gives one translation: lines that needed repair (see
    :mod:`fairseq_capsagg.patches.input_repair`), empty lines (translated as ``""``),
    lines longer than the model's source positions (truncated) and lines whose
    translation fails (``""``) each log one warning naming the line; the other
    lines of the batch are translated as usual.
    """

    def source_token_limit(self) -> int:
        """The longest source in subword tokens that both the task and the encoder accept."""
        limit = self.max_positions[0] if isinstance(self.max_positions, tuple) else self.max_positions
        return min(limit, self.models[0].encoder.max_positions())

    def translate_lines(self, lines: Sequence[Line], beam: int = 5,
                        **kwargs) -> List[Tuple[str, List[str]]]:
        """Translates ``lines`` (str or raw bytes); returns (translation, notes) for each line."""
        limit = self.source_token_limit()
        notes: List[List[str]] = []
        todo: List[Tuple[int, Tensor]] = []  # (line number, source tokens) of non-empty lines
        for number, raw in enumerate(lines):
            text, line_notes = repair_line(raw)
            if text:
                tokens, cut = truncate_tokens(self.encode(text), limit)
                line_notes += cut
                todo.append((number, tokens))
            else:
                line_notes.append(EMPTY)
            notes.append(line_notes)
        outputs = [""] * len(notes)
        try:
            translated = self.translate_tokens([tokens for _, tokens in todo], beam, **kwargs)
        except Exception:  # noqa: BLE001 (one bad line must not lose the others: retry one by one)
            translated = []
            for number, tokens in todo:
                try:
                    translated += self.translate_tokens([tokens], beam, **kwargs)
                except Exception as e:  # noqa: BLE001 (any failure is reported for its line)
                    notes[number].append(f"not translated: {e}")
                    translated.append("")
        for (number, _), output in zip(todo, translated):
            outputs[number] = output
        return list(zip(outputs, notes))

    def translate_tokens(self, sources: List[Tensor], beam: int, **kwargs) -> List[str]:
        """Best hypotheses for encoded sources, decoded (what fairseq's ``sample`` does after encoding)."""
        if not sources:
            return []
        return [self.decode(hypos[0]["tokens"]) for hypos in self.generate(sources, beam, **kwargs)]

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
    writes (see :mod:`fairseq_capsagg.patches.safe_checkpoints`); it is then loaded
    with torch's ``weights_only=True``.

    Example::

        from fairseq_capsagg.tools.hub import from_pretrained
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
