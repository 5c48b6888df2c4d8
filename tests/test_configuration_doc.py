"""docs/configuration.md's settings table holds every SPECDEC_* variable the code reads, once,
and none that it does not: the names written in the code, and those made from a settings
dataclass's fields (ENV_PREFIX + field name) as its parser looks them up."""
from __future__ import annotations

import re
from pathlib import Path

from tests.deploy.helpers import env_names_read_by_code

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "configuration.md"
CODE = ("specdec", "client", "model_repository")
NAME = re.compile(r"\bSPECDEC_[A-Z0-9]+(?:_[A-Z0-9]+)*\b")


def names_written_in_code() -> set[str]:
    return {m for top in CODE for f in (ROOT / top).rglob("*.py")
            for m in NAME.findall(f.read_text())}


def names_looked_up(monkeypatch) -> set[str]:
    seen = env_names_read_by_code(monkeypatch)
    # A field the spy missed would be a parser this test does not run.
    assert {"SPECDEC_MAX_SEQ_LEN", "SPECDEC_SHUTDOWN_GRACE_S", "SPECDEC_MAX_STOP_WORDS"} <= seen
    return seen


def documented() -> list[str]:
    """The names in the first column of the Settings table, one entry per mention."""
    text = DOC.read_text()
    table = text[text.index("## Settings"):text.index("\n## ", text.index("## Settings") + 1)]
    rows = [line for line in table.splitlines() if line.startswith("| `SPECDEC_")]
    return [n for row in rows for n in NAME.findall(row.split("|")[1])]


def test_every_variable_the_code_reads_is_documented_once(monkeypatch):
    read = names_written_in_code() | names_looked_up(monkeypatch)
    table = documented()
    missing = read - set(table)
    assert not missing, f"docs/configuration.md's table lacks {sorted(missing)}"
    stale = set(table) - read
    assert not stale, f"docs/configuration.md documents {sorted(stale)}, which no code reads"
    twice = sorted({n for n in table if table.count(n) > 1})
    assert not twice, f"docs/configuration.md's table names {twice} more than once"


def test_the_table_is_read_as_a_table():
    table = documented()
    assert len(table) >= 20 and "SPECDEC_TARGET_MODEL" in table
