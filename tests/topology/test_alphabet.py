"""The selector alphabet: pinned by code point, so that a Python of another Unicode
version gives the same verdict (the chart's schema repeats it: test_one_validation)."""

from __future__ import annotations

import re
import unicodedata

import pytest

from numa_device_plugin.topology import alphabet
from numa_device_plugin.topology.selectors import parse_selector


def test_the_refused_ranges_are_sorted_and_disjoint() -> None:
    last = -1
    for first, end in alphabet.REFUSED:
        assert last < first <= end <= 0x10FFFF
        last = end


def test_it_differs_from_this_pythons_isprintable_only_where_meant() -> None:
    """Against the running Python's Unicode database: every assigned character it calls
    printable is allowed but U+FFFC and U+FFFD, and nothing assigned that it refuses
    is allowed. Unassigned code points (category Cn) are allowed, whatever the version."""
    refused_printable = []
    allowed_unprintable = []
    for code in range(0x110000):
        char = chr(code)
        if char.isprintable() and char != " " and not alphabet.allowed(char):
            refused_printable.append(code)
        assigned = unicodedata.category(char) != "Cn"
        if alphabet.allowed(char) and not char.isprintable() and assigned:
            allowed_unprintable.append(code)
    assert refused_printable == [0xFFFC, 0xFFFD]
    assert allowed_unprintable == []


@pytest.mark.parametrize(
    ("value", "allowed"),
    [
        ("S3EVNX0K123", True),
        ("Ñandú-Ω1", True),
        ("S\U0001fae81", True),  # Unicode 15: unassigned in Python 3.11, Go's helm has it
        ("S\U00011f001", True),
        ("S\U000e00411", False),  # a language tag
        ("S\udc801", False),  # an undecodable byte under surrogateescape
        ("S\U0010fffd1", False),  # supplementary private use
        ("S\u20601", False),  # word joiner
        ("S\x85", False),  # next line (C1)
    ],
)
def test_a_serial_is_taken_exactly_when_every_character_is_allowed(
    value: str, allowed: bool
) -> None:
    assert alphabet.graphic(value) == allowed
    if allowed:
        assert parse_selector(f"serial:{value}").value == value
    else:
        with pytest.raises(ValueError, match="printable characters"):
            parse_selector(f"serial:{value}")


def test_the_schema_class_refuses_what_allowed_refuses() -> None:
    pattern = re.compile(alphabet.schema_class())
    for code in (0x20, 0x7F, 0xA0, 0xAD, 0x200B, 0x202E, 0xE000, 0xFFFD, 0x1FFFE, 0xE0041):
        assert not pattern.fullmatch(chr(code)), hex(code)
    for code in (0x41, 0x5C, 0x5D, 0x2D, 0xD1, 0x1FAE8, 0x11F00, 0xE0100):
        assert pattern.fullmatch(chr(code)), hex(code)
