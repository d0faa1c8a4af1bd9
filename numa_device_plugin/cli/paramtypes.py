"""The click types and the option class the command line's options are made of
(:mod:`numa_device_plugin.cli.options`): a conversion function as a type, click's BOOL
without its empty-means-false, and an option whose errors name its variable."""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Sequence
from typing import Any

import click

# Characters of a conversion's error message shown in a usage error.
MAX_ERROR = 400
# The whitespace a variable of several values is split at (ASCII only).
_ASCII_SPACE = " \t\n\r\x0b\x0c"


class Converted(click.ParamType[Any]):
    """A click type from a conversion function; its ValueError becomes a BadParameter."""

    def __init__(self, name: str, convert: Callable[[str], Any]) -> None:
        self.name = name
        self._convert = convert

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if not isinstance(value, str):
            return value  # a default, already a value
        try:
            return self._convert(value)
        except ValueError as exc:
            message = str(exc)
            if len(message) > MAX_ERROR:  # whatever echoes the value, a usage error stays short
                message = f"{message[: MAX_ERROR - 20]}... (message cut)"
            self.fail(message, param, ctx)

    def split_envvar_value(self, rv: str) -> Sequence[str]:
        """A multiple option's variable (``NUMA_NEAR``) split at ASCII whitespace only:
        ``str.split()`` also splits at U+00A0, U+2028 and the like, which turned a
        character the plugin refuses into a separator it did not see."""
        text = (rv or "").strip(_ASCII_SPACE)
        return re.split(f"[{_ASCII_SPACE}]+", text) if text else []


class Option(click.Option):
    """A click option whose errors name its variable only when the value came from
    it, and whose variable, when set but empty, is an error unless ``allow_empty``."""

    def __init__(self, *args: Any, allow_empty: bool = False, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.allow_empty = allow_empty

    def get_error_hint(self, ctx: click.Context | None) -> str:
        hint = " / ".join(f"'{opt}'" for opt in self.opts)
        source = ctx.get_parameter_source(self.name) if ctx is not None and self.name else None
        if source is click.core.ParameterSource.ENVIRONMENT and isinstance(self.envvar, str):
            hint += f" (env var: '{self.envvar}')"
        return hint

    def resolve_envvar_value(self, ctx: click.Context) -> str | None:
        if isinstance(self.envvar, str) and os.environ.get(self.envvar) == "":
            if self.allow_empty:
                return None
            raise click.BadParameter(
                f"the variable {self.envvar} is set but empty; unset it to use the default",
                ctx,
                param_hint=" / ".join(f"'{opt}'" for opt in self.opts),
            )
        return super().resolve_envvar_value(ctx)


class Switch(click.types.BoolParamType):
    """click's BOOL (true/false, yes/no, on/off, 1/0, any case) without its reading of
    an empty value as false: ``--debug-endpoints=`` is a usage error, as an empty
    ``NUMA_DEBUG_ENDPOINTS`` is (:class:`Option`): one rule for both."""

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if isinstance(value, str) and not value.strip():
            self.fail("an empty value is not a BOOL (true or false; unset it for the default)")
        return super().convert(value, param, ctx)
