"""How a failure or a docstring is told in one line (logs, ErrorResponses, ``udf-agent list``)."""

from __future__ import annotations


def first_line(source: BaseException | str | None) -> str:
    """The first line of an exception's message (its type's name when it has none), or of a text."""
    if isinstance(source, BaseException):
        text = str(source).strip() or type(source).__name__
    else:
        text = (source or "").strip()
    return text.split("\n", 1)[0]
