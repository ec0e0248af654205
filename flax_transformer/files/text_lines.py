"""Text input, line by line: the one reader behind TSV corpora, LM text and generate's input.

Lines are split on b"\\n" (a trailing "\\r" is dropped), a UTF-8 byte-order mark at the start of
the data is dropped (editors on Windows write one; it would otherwise stick to the first text),
and each line is decoded on its own, so one bad line can be named and the others still used.
"""

from __future__ import annotations

BOM = b"\xef\xbb\xbf"


class LineDecodeError(ValueError):
    """A line that is not valid UTF-8; the message says which byte and column."""


def split_lines(data: bytes) -> list[bytes]:
    """Raw lines of `data` without the BOM, the newlines and a final empty line."""
    data = data.removeprefix(BOM)
    lines = data.split(b"\n")
    if lines and lines[-1] == b"":
        lines.pop()
    return [line.removesuffix(b"\r") for line in lines]


def decode_line(raw: bytes) -> str:
    """One raw line as str; LineDecodeError naming the first bad byte and its 1-based column if it
    is not UTF-8."""
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as err:
        raise LineDecodeError(
            f"not valid UTF-8 (byte 0x{raw[err.start]:02x} at column {err.start + 1})"
        ) from None
