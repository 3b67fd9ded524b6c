"""One-line errors for bad aggregation settings in the fairseq command-line tools."""

import os
import sys
from types import TracebackType
from typing import Optional, Type

from ..aggregators import AggregationConfigError


def _report(exc_type: Type[BaseException], exc: BaseException,
            tb: Optional[TracebackType], previous=sys.excepthook) -> None:
    if issubclass(exc_type, AggregationConfigError):
        prog = os.path.basename(sys.argv[0]) if sys.argv and sys.argv[0] else "fairseq"
        print(f"{prog}: error: {exc}", file=sys.stderr)
        return
    previous(exc_type, exc, tb)


def install_error_hook() -> None:
    """Makes an uncaught :class:`AggregationConfigError` print one line, not a traceback.

    Only that exception type is affected; every other error keeps the
    interpreter's usual report. Library code can catch it as a ValueError.
    """
    if getattr(sys.excepthook, "__name__", "") != _report.__name__:
        sys.excepthook = _report
