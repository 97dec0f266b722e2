"""The recipe's `retrain:` step: the user's training function makes a new model, and the
pipelines run on the path it returns.

The function is called as `fn(output_dir=..., **params)` with a fresh folder under the
store (`retrained/<recipe>/<stamp>/`) and returns the new model's path (a SavedModel
folder, a .keras file...), absolute or relative to that folder. The folder is removed when
the function fails, so a failed retrain leaves nothing behind.
"""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

from orchestrator.data.callables import CallableProblem, import_callable
from orchestrator.errors import StageError
from orchestrator.recipe.loading import LoadedRecipe

FIELD = ("retrain", "callable")


def retrain(loaded: LoadedRecipe, store_root: Path) -> Path:
    """Run the recipe's training function; the absolute path of the model it made.

    A function that cannot be imported, or returns no existing path: RecipeError (exit 2)
    at `retrain.callable`. A function that raises: StageError (exit 3) naming it."""
    spec = loaded.recipe.retrain
    assert spec is not None
    try:
        function = import_callable(spec.callable, loaded.base_dir)
    except CallableProblem as exc:
        raise loaded.error(f"retrain: {exc}", FIELD) from exc
    stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime())
    folder = store_root / "retrained" / loaded.recipe.name / f"{stamp}-{os.getpid()}"
    folder.mkdir(parents=True)
    try:
        try:
            returned = function(output_dir=str(folder), **spec.params)
        except Exception as exc:  # the user's training code: any failure is its own
            raise StageError(f"{type(exc).__name__}: {exc}", pipeline="retrain",
                             stage=spec.callable) from exc
        if not isinstance(returned, str | os.PathLike):
            raise loaded.error(f"retrain: {spec.callable} returned {type(returned).__name__} "
                               f"{returned!r}, not the path of the new model", FIELD)
        path = Path(folder, returned).absolute()  # an absolute return value stays as it is
        if not path.exists():
            raise loaded.error(f"retrain: {spec.callable} returned {str(returned)!r}, which "
                               "does not exist", FIELD)
    except BaseException:
        shutil.rmtree(folder, ignore_errors=True)
        raise
    return path
