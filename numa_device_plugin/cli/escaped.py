"""Text from sysfs or from an answer, made safe to print on a terminal.

A disk's serial or model, an interface's driver, a node's answer: any of them can hold
a control character. Printed raw, an OSC or CSI sequence clears the screen, retitles
the terminal or forges a line (click strips CSI on a pipe, never OSC). Text output
shows each such character escaped, as Python writes it in a string (``\\x1b``,
``\\n``, ``\\u2028``); JSON output stays exact.
"""

from __future__ import annotations


def shown(value: object) -> str:
    """``str(value)`` with every character that is not printable (``str.isprintable``:
    controls, format characters, line and paragraph separators, surrogates of a
    non-UTF-8 byte) written as its escape; printable text, any script, unchanged."""
    text = str(value)
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)
