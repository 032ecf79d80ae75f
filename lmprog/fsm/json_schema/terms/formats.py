"""String formats as anchored value-level patterns (ECMA syntax).

Each format is a regex over the *decoded* string, compiled like a ``pattern``, exact for the
grammar it cites except for documented narrowings (some valid strings rejected, never an
invalid one accepted); other formats (custom ones) raise ConstraintError. The formats and
their narrowings: docs/design/json-schema.md.
"""

from __future__ import annotations

_DEC_OCTET = r"(?:25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])"
IPV4 = rf"{_DEC_OCTET}(?:\.{_DEC_OCTET}){{3}}"
_H16 = r"[0-9A-Fa-f]{1,4}"
_LS32 = rf"(?:{_H16}:{_H16}|{IPV4})"
IPV6 = (
    "(?:"
    + "|".join(
        [
            rf"(?:{_H16}:){{6}}{_LS32}",
            rf"::(?:{_H16}:){{5}}{_LS32}",
            rf"(?:{_H16})?::(?:{_H16}:){{4}}{_LS32}",
            rf"(?:(?:{_H16}:){{0,1}}{_H16})?::(?:{_H16}:){{3}}{_LS32}",
            rf"(?:(?:{_H16}:){{0,2}}{_H16})?::(?:{_H16}:){{2}}{_LS32}",
            rf"(?:(?:{_H16}:){{0,3}}{_H16})?::{_H16}:{_LS32}",
            rf"(?:(?:{_H16}:){{0,4}}{_H16})?::{_LS32}",
            rf"(?:(?:{_H16}:){{0,5}}{_H16})?::{_H16}",
            rf"(?:(?:{_H16}:){{0,6}}{_H16})?::",
        ]
    )
    + ")"
)

_LEAP_YEAR = r"(?:[0-9]{2}(?:0[48]|[2468][048]|[13579][26])|(?:0[48]|[2468][048]|[13579][26])00)"
_YEAR = r"(?:[0-9]{3}[1-9]|[0-9]{2}[1-9][0-9]|[0-9][1-9][0-9]{2}|[1-9][0-9]{3})"  # 0001..9999
DATE = (
    rf"(?:{_YEAR}-(?:(?:0[13578]|1[02])-(?:0[1-9]|[12][0-9]|3[01])"
    r"|(?:0[469]|11)-(?:0[1-9]|[12][0-9]|30)|02-(?:0[1-9]|1[0-9]|2[0-8]))"
    rf"|{_LEAP_YEAR}-02-29)"
)
_OFFSET = r"(?:[Zz]|[+-](?:[01][0-9]|2[0-3]):[0-5][0-9])"
TIME = rf"(?:[01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9](?:\.[0-9]+){{0,1}}{_OFFSET}"
DATE_TIME = rf"{DATE}[Tt]{TIME}"

_DUR_TIME = r"T(?:[0-9]+H(?:[0-9]+M(?:[0-9]+S)?)?|[0-9]+M(?:[0-9]+S)?|[0-9]+S)"
_DUR_DATE = r"(?:[0-9]+D|[0-9]+M(?:[0-9]+D)?|[0-9]+Y(?:[0-9]+M(?:[0-9]+D)?)?)"
DURATION = rf"P(?:{_DUR_DATE}(?:{_DUR_TIME})?|{_DUR_TIME}|[0-9]+W)"

UUID = r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}"


def _label(longest: int) -> str:
    """An LDH label of 1..longest characters, no hyphen first or last, and not "--" in
    positions 3-4 (reserved for IDNA A-labels, which are not checked here)."""
    a, h = "[A-Za-z0-9]", "[A-Za-z0-9-]"
    return rf"{a}(?:{h}?{a}|{h}{{2}}{a}|{h}(?:{a}{h}|-{a}){h}{{0,{longest - 5}}}{a})?"


_LABEL = _label(63)
_SHORT_LABEL = _label(61)
HOSTNAME = rf"(?:{_LABEL}|{_SHORT_LABEL}(?:\.{_SHORT_LABEL}){{1,3}})"
_ATOM = r"[A-Za-z0-9!#$%&'*+/=?^_`{|}~-]+"
_REGEX_LITERAL = r"(?:[^\\^$.|?*+()\[\]{}]|\\[\\^$.|?*+()\[\]{}/])*"
EMAIL = rf"{_ATOM}(?:\.{_ATOM})*@{HOSTNAME}"

_UCS = "\u00a0-\ud7ff\uf900-\ufdcf\ufdf0-\uffef" + "".join(
    f"\\u{{{p:x}0000}}-\\u{{{p:x}fffd}}" for p in range(1, 15)
)


def _rfc3986(extra: str) -> dict[str, str]:
    """Productions of RFC 3986 (``extra`` = additional unreserved characters, for IRIs)."""
    pct = "%[0-9A-Fa-f]{2}"
    unres = rf"A-Za-z0-9._~\-{extra}"
    sub = r"!$&'()*+,;="
    pchar = rf"(?:[{unres}{sub}:@]|{pct})"
    nc_char = rf"(?:[{unres}{sub}@]|{pct})"
    userinfo = rf"(?:[{unres}{sub}:]|{pct})*"
    ip_lit = rf"\[(?:{IPV6}|v[0-9A-Fa-f]+\.[{unres}{sub}:]+)\]"
    host = rf"(?:{ip_lit}|(?:[{unres}{sub}]|{pct})*)"
    authority = rf"(?:{userinfo}@)?{host}(?::[0-9]*)?"
    abempty = rf"(?:/{pchar}*)*"
    absolute = rf"/(?:{pchar}+{abempty})?"
    rootless = rf"{pchar}+{abempty}"
    noscheme = rf"{nc_char}+{abempty}"
    tail = rf"(?:\?(?:{pchar}|[/?])*)?(?:#(?:{pchar}|[/?])*)?"
    scheme = r"[A-Za-z][A-Za-z0-9+.\-]*"
    hier = rf"(?://{authority}{abempty}|{absolute}|{rootless}|)"
    relative = rf"(?://{authority}{abempty}|{absolute}|{noscheme}|)"
    absolute_uri = rf"{scheme}:{hier}{tail}"
    return {"absolute": absolute_uri, "reference": rf"(?:{absolute_uri}|{relative}{tail})"}


_URI, _IRI = _rfc3986(""), _rfc3986(_UCS)
_JSON_POINTER = r"(?:/(?:[^/~]|~[01])*)*"
_VARCHAR = r"(?:[A-Za-z0-9_]|%[0-9A-Fa-f]{2})"
_VARSPEC = rf"{_VARCHAR}(?:\.?{_VARCHAR})*(?::[1-9][0-9]{{0,3}}|\*)?"
_TEMPLATE_LITERAL = "(?:[^\\x00-\\x20\"'%<>\\\\^`{|}\\x7f]|%[0-9A-Fa-f]{2})"
URI_TEMPLATE = rf"(?:{_TEMPLATE_LITERAL}|\{{[+#./;?&=,!@|]?{_VARSPEC}(?:,{_VARSPEC})*\}})*"

FORMATS: dict[str, str] = {
    "date": DATE,
    "time": TIME,
    "date-time": DATE_TIME,
    "duration": DURATION,
    "uuid": UUID,
    "email": EMAIL,
    "hostname": HOSTNAME,
    "ipv4": IPV4,
    "ipv6": IPV6,
    "uri": _URI["absolute"],
    "uri-reference": _URI["reference"],
    "iri": _IRI["absolute"],
    "iri-reference": _IRI["reference"],
    "json-pointer": _JSON_POINTER,
    "relative-json-pointer": rf"(?:0|[1-9][0-9]*)(?:#|{_JSON_POINTER})",
    "uri-template": URI_TEMPLATE,
    # narrowed to subsets that are certainly valid:
    "idn-hostname": HOSTNAME,  # ASCII LDH hostnames
    "idn-email": EMAIL,  # ASCII addresses
    "regex": _REGEX_LITERAL,  # literal text, metacharacters escaped
}


def format_source(name: str) -> str:
    """``format_pattern`` of a format a StrT keeps (it keeps only supported ones)."""
    source = format_pattern(name)
    assert source is not None, name
    return source


def format_pattern(name: str) -> str | None:
    """The anchored ECMA pattern of a supported format, or None."""
    body = FORMATS.get(name)
    return None if body is None else f"^(?:{body})$"
