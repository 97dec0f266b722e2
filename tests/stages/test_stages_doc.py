"""docs/stages.md lists every registered stage, with its kind and its own one-line
description (the first line of what `orchestrator stages` prints): a new stage that misses
the page, or a page row for a stage that is gone, fails here."""

from __future__ import annotations

import re
from pathlib import Path

from orchestrator.stages import STAGE_MODULES, get_stage

PAGE = Path(__file__).resolve().parents[2] / "docs" / "stages.md"
ROW = re.compile(r"^\| `([a-z_0-9]+)` \| (transform|measure) \| (.*?) \|", re.MULTILINE)


def test_the_stages_page_lists_every_stage_with_its_kind_and_description() -> None:
    rows = {name: (kind, text) for name, kind, text in ROW.findall(PAGE.read_text())}
    assert sorted(rows) == sorted(STAGE_MODULES), (
        f"docs/stages.md rows differ from the registry: missing "
        f"{sorted(set(STAGE_MODULES) - set(rows))}, extra {sorted(set(rows) - set(STAGE_MODULES))}")
    for name, (kind, text) in rows.items():
        stage = get_stage(name)
        assert kind == stage.kind, name
        first = " ".join(stage.doc.strip().split("\n\n")[0].split())
        assert text.startswith(first.rstrip(".")), (name, first, text)
