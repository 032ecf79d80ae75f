"""Checks on text from users before it reaches a tokenizer."""

from __future__ import annotations


def check_text(text: str, what: str = "text") -> None:
    """ValueError naming the position unless `text` is valid Unicode (no lone surrogates,
    which no tokenizer can encode: they come from text decoded with errors='surrogateescape'
    or from JSON escapes such as "\\ud800" without their pair)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        raise ValueError(
            f"{what} has a lone surrogate U+{ord(text[e.start]):04X} at position {e.start}: it "
            "is not valid Unicode and cannot be tokenized; decode the source with "
            "errors='replace' or drop the character"
        ) from None
