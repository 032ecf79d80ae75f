"""A JSON string's content bytes as the code points JSON Schema counts, read as they are decoded
(``lengths.LengthCount``, ``matched.PatternMatch``)."""

from __future__ import annotations

_ESCAPES = {ord('"'): 0x22, ord("\\"): 0x5C, ord("/"): 0x2F, ord("b"): 8, ord("f"): 12}
_ESCAPES.update({ord("n"): 10, ord("r"): 13, ord("t"): 9})


def decode(data: bytes, final: bool = False) -> tuple[list[int], bytes]:
    """The code points of a JSON string's content bytes (no closing quote among them), as
    JSON Schema counts them: an escaped surrogate pair is one, a lone surrogate one; and the
    bytes of a last character not complete yet (a high surrogate escape waits for its pair
    unless `final`: the string ends there)."""
    out, i, end = [], 0, len(data)
    while i < end:
        b = data[i]
        if b == 0x5C:
            if i + 1 >= end:
                break
            if data[i + 1] != 0x75:  # \" \\ \/ \b \f \n \r \t
                out.append(_ESCAPES[data[i + 1]])
                i += 2
                continue
            if i + 6 > end:
                break
            unit = int(data[i + 2 : i + 6], 16)
            if 0xD800 <= unit <= 0xDBFF:
                low = _low_surrogate(data[i + 6 : i + 12])
                if low is None and not final and i + 12 > end and _may_pair(data[i + 6 :]):
                    break  # a low surrogate may still come
                if low is not None:
                    out.append(0x10000 + (unit - 0xD800) * 0x400 + low - 0xDC00)
                    i += 12
                    continue
            out.append(unit)
            i += 6
            continue
        size = 1 if b < 0x80 else 2 if b >> 5 == 0b110 else 3 if b >> 4 == 0b1110 else 4
        if i + size > end:
            break
        out.append(ord(data[i : i + size].decode("utf-8", "surrogatepass")))
        i += size
    return out, data[i:]


def _low_surrogate(text: bytes) -> int | None:
    if len(text) == 6 and text[:2] == b"\\u":
        try:
            unit = int(text[2:], 16)
        except ValueError:
            return None
        return unit if 0xDC00 <= unit <= 0xDFFF else None
    return None


def _may_pair(text: bytes) -> bool:
    """Whether `text` may begin an escaped low surrogate (``\\uDC00``-``\\uDFFF``)."""
    patterns = (b"\\", b"u", b"dD", b"cdefCDEF")
    return all(c in patterns[i] for i, c in enumerate(text[:4]))
