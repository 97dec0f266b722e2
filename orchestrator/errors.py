"""The small error hierarchy. Each error carries the context a user needs to act on it.

Exit codes (SPEC): RecipeError/ModelSourceError/DataError/OutputError/UsageError -> 2,
StageError -> 3.
Programming errors are not wrapped: they propagate as tracebacks, on purpose.
"""

from __future__ import annotations

# Ctrl-C (SIGINT) seen while a command runs: orchestrator/cli/main.py notes each one. Read
# wherever an error may be a Ctrl-C a library turned into an error of its own (the CLI's
# exit 130, pipelines/recipe_run.py's interrupted MLflow run); empty outside a command.
interrupts_seen: list[int] = []


class OrchestratorError(Exception):
    """Base class: a problem with the user's input or a stage, reported without a traceback."""

    exit_code = 2

    def __init__(
        self,
        message: str,
        *,
        file: str | None = None,
        line: int | None = None,
        column: int | None = None,
        field: str | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.file = file
        self.line = line
        self.column = column
        self.field = field

    def location(self) -> str:
        """`file:line:column` (as much of it as is known)."""
        parts = [p for p in (self.file, self.line, self.column) if p is not None]
        return ":".join(str(p) for p in parts)

    def __str__(self) -> str:
        where = self.location()
        field = f" [{self.field}]" if self.field else ""
        return f"{where}{field}: {self.message}" if where else f"{self.message}{field}"


class RecipeError(OrchestratorError):
    """The recipe is invalid: bad YAML, unknown key, bad param, broken wiring."""


class ModelSourceError(OrchestratorError):
    """The model file is missing, not a model, or lacks the named inputs/outputs."""


class DataError(OrchestratorError):
    """Representative or evaluation data is missing, malformed or does not fit the model."""


class OutputError(OrchestratorError):
    """A folder the run writes to (`-o DIR`, the store, MLflow's) cannot be written: read-only,
    full, not a folder. Checked before the run where it can be; `file` names the folder."""


class UsageError(OrchestratorError):
    """A bad command-line option value (exit 2), e.g. `benchmark --threads 0`."""


class StageError(OrchestratorError):
    """A stage raised while running. Names the pipeline and stage."""

    exit_code = 3

    def __init__(self, message: str, *, pipeline: str | None = None, stage: str | None = None):
        super().__init__(message)
        self.pipeline = pipeline
        self.stage = stage

    def __str__(self) -> str:
        where = "/".join(p for p in (self.pipeline, self.stage) if p)
        return f"stage {where} failed: {self.message}" if where else self.message
