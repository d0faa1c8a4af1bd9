"""The characters a selector's value may hold, pinned by code point so that it does not
depend on the Unicode version of whoever checks it.

``str.isprintable`` follows the Python's own Unicode database: Python 3.11 (the image)
has Unicode 14, so it refuses U+1FAE8 (assigned in 15.0) that the chart's schema, checked
by Go's Unicode 15 tables in ``helm``, accepted; every pod then exited 2. The rule here
is a fixed list of refused ranges, which the chart's schema repeats character for
character (``values.schema.json``, held to :data:`REFUSED` by a test): the controls, the
separators and invisible format characters (a value that looks like another), the
surrogates (undecodable bytes under ``surrogateescape``), private use and the
noncharacters, U+FFFD (the mark of a value decoded with errors). A code point unassigned
today is accepted on both sides alike.
"""

from __future__ import annotations

from bisect import bisect_right

# (first, last) code points, sorted, disjoint: what no selector value may hold
REFUSED: tuple[tuple[int, int], ...] = (
    (0x0000, 0x0020),  # C0 controls and the space (a separator in NUMA_NEAR)
    (0x007F, 0x00A0),  # DEL, C1 controls, no-break space
    (0x00AD, 0x00AD),  # soft hyphen
    (0x0600, 0x0605),  # Arabic number signs (format)
    (0x061C, 0x061C),  # Arabic letter mark
    (0x06DD, 0x06DD),
    (0x070F, 0x070F),
    (0x0890, 0x0891),
    (0x08E2, 0x08E2),
    (0x1680, 0x1680),  # Ogham space
    (0x180E, 0x180E),  # Mongolian vowel separator
    (0x2000, 0x200F),  # spaces, zero-width characters, direction marks
    (0x2028, 0x202F),  # line and paragraph separators, embeddings, narrow no-break space
    (0x205F, 0x206F),  # medium space, word joiner, invisible operators, isolates
    (0x3000, 0x3000),  # ideographic space
    (0xD800, 0xDFFF),  # surrogates (never in the chart's strings: Go reads one as U+FFFD)
    (0xE000, 0xF8FF),  # private use
    (0xFDD0, 0xFDEF),  # noncharacters
    (0xFEFF, 0xFEFF),  # byte order mark
    (0xFFF0, 0xFFFF),  # annotation controls, replacement characters, noncharacters
    (0x110BD, 0x110BD),
    (0x110CD, 0x110CD),
    (0x13430, 0x1343F),  # Egyptian hieroglyph format controls
    (0x1BCA0, 0x1BCA3),  # shorthand format controls
    (0x1D173, 0x1D17A),  # musical symbol format controls
    *((plane + 0xFFFE, plane + 0xFFFF) for plane in range(0x10000, 0xE0000, 0x10000)),
    (0xE0000, 0xE007F),  # language tags
    (0xEFFFE, 0x10FFFF),  # noncharacters, supplementary private use
)
_FIRSTS = [first for first, _ in REFUSED]
_SURROGATES = (0xD800, 0xDFFF)


def allowed(char: str) -> bool:
    """Whether the one character ``char`` may stand in a selector's value (not in
    :data:`REFUSED`)."""
    code = ord(char)
    index = bisect_right(_FIRSTS, code) - 1
    return index < 0 or code > REFUSED[index][1]


def graphic(text: str, also: str = "") -> bool:
    """Whether every character of ``text`` is :func:`allowed` or in ``also`` (a space,
    or the tab and newline a path's escapes decode to)."""
    return all(c in also or allowed(c) for c in text)


def schema_class() -> str:
    """The character class the chart's schema writes for one allowed character:
    ``[^...]`` over :data:`REFUSED`, each range as its literal characters (Go's regexp
    and Python's ``re`` read them alike). The surrogates are left out: a Go string
    cannot hold one, and JSON's ``\\ud800`` alone would reach the regexp as U+FFFD."""
    ranges = "".join(
        _escaped(first) if first == last else f"{_escaped(first)}-{_escaped(last)}"
        for first, last in REFUSED
        if (first, last) != _SURROGATES
    )
    return f"[^{ranges}]"


def _escaped(code: int) -> str:
    """One code point as the schema's pattern holds it: a literal character, the few
    that mean something in a class escaped."""
    char = chr(code)
    return "\\" + char if char in "\\]^-[" else char
