"""The example's training script says what its parameter count counts."""

from __future__ import annotations

import sys
from pathlib import Path

DIGITS = Path(__file__).resolve().parents[1] / "examples" / "digits"


def test_the_training_script_labels_its_parameter_count() -> None:
    sys.path.insert(0, str(DIGITS))
    try:
        import make_model
    finally:
        sys.path.remove(str(DIGITS))
    text = make_model.params_text(make_model.build_model())
    # 268,698 trained + 2 x (16 + 32 + 128) moving means and variances of the batch norms
    assert text.startswith("269,050 Keras parameters (268,698 trainable + 352 batch-norm "
                           "moving statistics;")
    assert "after batch norm is folded" in text
