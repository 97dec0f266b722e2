"""Representative data from a folder of images (resize, mean, std, channels, like the classic
label_image's --input_mean/--input_std), with non-image files in it: they are skipped with a
warning and counted in report.json; the 8-bit ranges are logged from the images."""

from __future__ import annotations

import json
import logging
import re
from pathlib import Path

import numpy as np
import pytest

from orchestrator.cli.main import main

pytestmark = pytest.mark.slow

IMAGES = 40
NON_IMAGES = ("notes.txt", "README")
# `;<node>__print__;__requant_min_max:[<min>][<max>]`, as the classic insert_logging prints
RANGE_LINE = re.compile(r"^;(?P<node>[^;]+)__print__;__requant_min_max:"
                        r"\[(?P<min>[^\]]+)\]\[(?P<max>[^\]]+)\]$")


def write_image_folder(folder: Path) -> np.ndarray:
    """IMAGES digits as 16x16 8-bit grey PNGs (0..255), plus the non-image files; returns
    the 8x8 images as written, in [0, 1]."""
    from PIL import Image
    from sklearn.datasets import load_digits

    folder.mkdir()
    digits = load_digits().images[:IMAGES]  # (N, 8, 8), values 0..16
    pixels = np.clip(np.round(digits * 16), 0, 255).astype(np.uint8)
    for index, image in enumerate(pixels):
        big = np.kron(image, np.ones((2, 2), dtype=np.uint8))  # 16x16, each pixel doubled
        Image.fromarray(big, mode="L").save(folder / f"digit_{index:03d}.png")
    (folder / "notes.txt").write_text("calibration images: the first 40 sklearn digits\n")
    (folder / "README").write_text("not an image either\n")
    return pixels.astype(np.float32) / 255.0


def write_recipe(workspace: Path, model: Path, images: Path) -> Path:
    recipe = workspace / "recipe.yaml"
    recipe.write_text(f"""\
version: 1
name: digits-image-folder
model:
  path: {model}
  inputs: [{{name: image, dtype: float32, shape: [1, 8, 8, 1]}}]
  outputs: [probs]
data:
  representative: {{source: {images.name}, resize: [8, 8], mean: 0, std: 255, channels: 1}}
pipelines:
  fp32:
    stages: [freeze, strip, fold]
  int8:
    from: fp32
    stages:
      - quantize_nodes
      - log_ranges: {{samples: 30}}
      - freeze_ranges
""")
    return recipe


class Records(logging.Handler):
    """Keeps the records of one logger (caplog's root handler does not survive Prefect's
    logging setup in a flow run)."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


def test_image_folder_with_non_images(digits_example: Path, workspace: Path,
                                      prefect_server: None) -> None:
    from orchestrator.model.artifact import ModelArtifact

    images = workspace / "images"
    write_image_folder(images)
    recipe = write_recipe(workspace, digits_example / "saved_model", images)
    out = workspace / "out"
    handler = Records()
    logger = logging.getLogger("orchestrator.data")
    logger.addHandler(handler)
    try:
        code = main(["run", str(recipe), "-o", str(out)])
    finally:
        logger.removeHandler(handler)
    assert code == 0

    # skipped with a warning naming the file
    skip_warnings = [r.getMessage() for r in handler.records if "not an image" in r.getMessage()]
    print("skip warnings:", skip_warnings)
    assert any(message.endswith("/README: not an image") for message in skip_warnings)

    # ... and counted in the report's data section
    report = json.loads((out / "report.json").read_text())
    representative = report["data"]["representative"]
    print("report data:", json.dumps(report["data"], indent=1))
    assert representative["skipped_inputs"] == 2
    assert sorted(Path(f).name for f in representative["skipped_files"]) == sorted(NON_IMAGES)
    assert "evaluation" not in report["data"]

    # the ranges were frozen from the images
    int8 = ModelArtifact.from_bytes((out / "int8" / "model.pb").read_bytes(),
                                    (out / "int8" / "signature.json").read_text())
    ops = {node.op for node in int8.graph_def.node}
    assert "RequantizationRange" not in ops
    assert {"QuantizedConv2D", "QuantizedMatMul"} <= ops
    assert "RequantizationRange" not in report["variants"]["int8"]["ops"]

    log = (out / "int8" / "ranges.log").read_text().splitlines()
    print(f"ranges.log: {len(log)} lines, e.g. {log[:2]}")
    assert log
    records = [RANGE_LINE.match(line) for line in log]
    assert all(records), [line for line, m in zip(log, records, strict=True) if not m][:3]
    per_node: dict[str, int] = {}
    for match in records:
        assert match is not None
        lo, hi = float(match["min"]), float(match["max"])
        assert np.isfinite(lo) and np.isfinite(hi) and lo <= hi
        per_node[match["node"]] = per_node.get(match["node"], 0) + 1
    # one line per node per sample: 30 of the 40 images (the non-images are not samples)
    assert set(per_node.values()) == {30}, per_node
