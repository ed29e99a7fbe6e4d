"""Read settings from the environment: the one reader of every variable, typed, with errors naming the variable.

config/settings.py (and, before Django starts, config/celery.py and gunicorn.conf.py) read every variable
through `env`; nothing else in the project reads `os.environ` for a setting. Parsing is environs' (marshmallow's
fields), with two house rules on top:

- a variable set to an empty (or blank) value counts as unset and gets its default, so `FOO=` in a compose file
  or a Kubernetes manifest never means "false" or crashes on `int("")`;
- a value that does not parse stops the process with one line naming the variable and what was expected
  (`BadSetting`, a `SystemExit`: no traceback), and never echoes the value, which may be a secret.

Every read is recorded in `READS` (name, type, default), so a test can check that docs/configuration.md
documents exactly the variables that are read.
"""

from __future__ import annotations

import builtins
import os
from dataclasses import dataclass
from typing import Any, TypeVar

from environs import Env, EnvError

T = TypeVar("T")

# What each type accepts, for the error message (environs' own says only "Not a valid boolean.").
_EXPECTED = {
    "bool": "true/false, yes/no, on/off or 1/0",
    "int": "a whole number",
    "float": "a number",
    "json": "JSON",
    "int or off": 'a whole number, or "off"',
}


class BadSetting(SystemExit):
    """A variable holds a value its type does not accept: the process stops with this one line."""


@dataclass(frozen=True)
class Read:
    """One variable as the code reads it: what the configuration table documents."""

    name: str
    type: str
    default: object


# Every variable read in this process, by name (filled as settings modules are imported).
READS: dict[str, Read] = {}

_environs = Env(eager=True, expand_vars=False)


class _Reader:
    """Typed getters over the environment; each takes the variable's name and the default for unset or empty."""

    def _set(self, name: builtins.str, type_: builtins.str, default: object) -> builtins.bool:
        """Record the read; return whether the variable holds a non-blank value."""
        read = Read(name=name, type=type_, default=default)
        if READS.setdefault(name, read).type != type_:
            raise TypeError(f"{name} is read as {READS[name].type} and as {type_}")
        return bool(os.environ.get(name, "").strip())

    def _parse(self, name: builtins.str, type_: builtins.str, **kwargs: Any) -> Any:
        """Parse the variable with environs' parser of `type_`, turning its error into `BadSetting`."""
        try:
            return getattr(_environs, type_)(name, **kwargs)
        except EnvError:
            raise BadSetting(f"Bad setting {name}: expected {_EXPECTED.get(type_, type_)}.") from None

    def str(self, name: builtins.str, default: builtins.str = "") -> builtins.str:
        """Return the variable as a string (trimmed)."""
        return self._parse(name, "str").strip() if self._set(name, "str", default) else default

    def bool(self, name: builtins.str, default: builtins.bool = False) -> builtins.bool:
        """Return the variable as a boolean (true/false, yes/no, on/off, 1/0, t/f, y/n)."""
        return builtins.bool(self._parse(name, "bool")) if self._set(name, "bool", default) else default

    def int(self, name: builtins.str, default: builtins.int) -> builtins.int:
        """Return the variable as an integer."""
        return builtins.int(self._parse(name, "int")) if self._set(name, "int", default) else default

    def float(self, name: builtins.str, default: builtins.float) -> builtins.float:
        """Return the variable as a number."""
        return builtins.float(self._parse(name, "float")) if self._set(name, "float", default) else default

    def list(self, name: builtins.str, default: builtins.str = "") -> builtins.list[builtins.str]:
        """Return a comma-separated variable as a list of trimmed, non-empty strings (`default` is comma-separated)."""
        items = self._parse(name, "list") if self._set(name, "list", default) else default.split(",")
        return [item.strip() for item in items if item.strip()]

    def json(self, name: builtins.str, default: T) -> T | Any:
        """Return the variable parsed as JSON."""
        return self._parse(name, "json") if self._set(name, "json", default) else default

    def int_or_off(self, name: builtins.str, default: builtins.int | None) -> builtins.int | None:
        """Return the variable as an integer, or None for "off" (or "none")."""
        if not self._set(name, "int or off", default):
            return default
        if os.environ[name].strip().lower() in {"off", "none"}:
            return None
        try:
            return builtins.int(os.environ[name])
        except ValueError:
            raise BadSetting(f"Bad setting {name}: expected {_EXPECTED['int or off']}.") from None


env = _Reader()
