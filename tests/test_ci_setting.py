"""The CI switch of tests/conftest.py: when a missing ../shared is an error."""

from __future__ import annotations

import pytest

from tests.conftest import under_ci


@pytest.mark.parametrize(
    ("value", "ci"),
    [(None, False), ("", False), ("0", False), ("false", False), ("False", False),
     ("true", True), ("1", True), ("yes", True), ("github", True)],
)  # fmt: skip
def test_any_ci_value_but_empty_0_or_false_means_ci(value: str | None, ci: bool) -> None:
    assert under_ci(value) is ci
