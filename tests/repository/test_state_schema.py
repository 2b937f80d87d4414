"""The state hash is stated once (``wire.STATE_SCHEMA``): the docs' tables and the
Lua library follow it, and these tests fail when one of them drifts."""

from __future__ import annotations

import re
from pathlib import Path

from stepbarrier._protocol import library
from stepbarrier._protocol.lua import lua_source
from stepbarrier._protocol.wire import STATE_SCHEMA
from tests import conftest

DOCS = Path(conftest.ROOT).resolve() / "docs"


def state_rows() -> dict[str, str]:
    """docs/protocol.md#keys's rows of the ``state`` hash: field -> its role."""
    rows: dict[str, str] = {}
    inside = False
    for line in (DOCS / "protocol.md").read_text().splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if len(cells) < 4:
            inside = False
            continue
        if cells[0]:
            inside = cells[0] == "`state`"
        if inside:
            for name in re.findall(r"`([a-z_]+)`", cells[2]):
                rows[name] = cells[3].split()[0]
    return rows


def test_protocol_md_tables_every_state_field_with_its_role() -> None:
    assert state_rows() == {name: role for name, role, _waited in STATE_SCHEMA}


def test_design_md_names_every_state_field() -> None:
    row = next(
        line
        for line in (DOCS / "design.md").read_text().splitlines()
        if line.startswith("| `stepbarrier:{JOB}:state`")
    )
    assert [name for name, _role, _waited in STATE_SCHEMA if f"`{name}`" not in row] == [
        "begun",
        "probation",
        "idle_ms",
    ]


def test_the_lua_reads_the_schemas_fields_and_writes_no_other() -> None:
    names = [name for name, _role, _waited in STATE_SCHEMA]
    assert f"local STATE_FIELDS = {{{', '.join(repr(n) for n in names)}}}" in library.HELPERS
    writers = lua_source("publish_step") + lua_source("begin_generation")
    written = set()
    for call in re.findall(r"'HSET', KEYS\[1\],([^)]*)", writers):
        written |= set(re.findall(r"'([a-z_]+)'", call))
    assert written <= set(names)
    assert [name for name in names if f"'{name}'" not in writers] == []
