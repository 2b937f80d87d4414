"""The Lua code of the Functions library, as real ``.lua`` files (package data).

Each file is one function's body (``KEYS`` and ``ARGV`` as Redis passes them),
or ``helpers.lua``, the local functions every body shares; the constants they
use (``MAX_STEP``, the field names) are defined in Python and prepended by
``stepbarrier._protocol.library``, so that Python and Lua share one definition.
"""

from __future__ import annotations

from importlib.resources import files


def lua_source(name: str) -> str:
    """The text of ``<name>.lua``, exactly as written."""
    return files(__name__).joinpath(f"{name}.lua").read_text(encoding="utf-8")
