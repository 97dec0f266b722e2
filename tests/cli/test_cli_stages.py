"""`orchestrator stages`: whole summaries, types with their choices, common params once."""

from __future__ import annotations

import re
from typing import Annotated, Literal

import pytest
from pydantic import Field

from orchestrator.cli.main import main
from orchestrator.cli.stages import summary_and_rest, type_text
from orchestrator.stages import all_stages
from orchestrator.stages.base import StageParams


def _stages_output(capsys: pytest.CaptureFixture[str], *args: str) -> str:
    assert main(["stages", *args]) == 0
    return capsys.readouterr().out


def test_types_print_their_choices_not_python_typing(capsys: pytest.CaptureFixture[str]
                                                     ) -> None:
    out = _stages_output(capsys)
    for leak in ("Union", "Literal[", "typing.", "Annotated", "NoneType", "Optional"):
        assert leak not in out, leak
    assert "    mode: fp32 | dynamic_range | float16 | int8 (default int8)" in out
    assert "    fallback_min: float | null (default null)" in out
    assert "    threads: int in [1, 256] | non-empty list[int in [1, 256]] | null " \
        "(default null)" in out
    assert "    samples: int in [1, 1000000] | null (default 200)" in out
    assert "    iterations: int in [1, 100] (default 4)" in out
    assert "    min_percentile: float in [0, 50) (default 5.0)" in out
    assert "    remove_nodes: list[str] (default [Identity, CheckNumerics])" in out


def test_params_every_stage_accepts_are_stated_once(capsys: pytest.CaptureFixture[str]
                                                   ) -> None:
    out = _stages_output(capsys)
    common = list(StageParams.model_fields)
    assert common  # ignore_errors at least
    for name in common:
        assert len(re.findall(rf"^\s+{name}:", out, flags=re.M)) == 1, name
    head = out.split("\n\n")[0]
    assert head.startswith("Every stage also accepts:")
    assert "ignore_errors: bool (default false)" in head


def test_each_summary_is_the_whole_first_paragraph(capsys: pytest.CaptureFixture[str]) -> None:
    out = " ".join(_stages_output(capsys).split())  # wrapping aside
    for stage in all_stages():
        summary, _ = summary_and_rest(stage.doc)
        assert summary.endswith((".", ")", "`")), (stage.name, summary)
        assert f"{stage.name} [{stage.kind}] {summary}" in out, stage.name
    # the one that used to stop mid-sentence ("... the weight ranges of")
    assert ("balance the weight ranges of consecutive layers, so that per-tensor 8-bit "
            "weights serve every channel.") in out


def test_verbose_adds_the_rest_of_each_doc(capsys: pytest.CaptureFixture[str]) -> None:
    short = _stages_output(capsys)
    full = _stages_output(capsys, "-v")
    assert "Depthwise ->" not in short and "Depthwise ->" in full  # equalize's 2nd paragraph
    assert len(full) > len(short)


def test_type_text() -> None:
    assert type_text(Literal["a", "b"] | None) == "a | b | null"
    assert type_text(Literal[1, 3]) == "1 | 3"
    assert type_text(Annotated[float, Field(gt=0, le=1)]) == "float in (0, 1]"
    assert type_text(dict[str, int]) == "dict[str, int]"
    assert type_text(list[str] | None) == "list[str] | null"
