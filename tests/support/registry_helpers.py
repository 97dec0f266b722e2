"""Reports and output folders shaped like a digits run's, for the tracking and registry
tests: the numbers are the ones the digits recipe measures (fp32 1.03 MB, int8 277 KB)."""

from __future__ import annotations

import copy
import json
import os
from pathlib import Path
from typing import Any

RECIPE = """\
version: 1
name: {name}
description: The digits CNN for phones and Pis, fp32 against 8-bit.
{register}model:
  path: {model}
data:
  representative: {{source: {data}, array: x_calib, samples: 200}}
  evaluation: {{source: {data}, inputs: x_test, labels: y_test}}
targets:
  - name: phone
    device: phone-2016
    budgets: {{max_size_mb: 1.0, max_accuracy_drop: 0.01, max_latency_ms: 50}}
  - name: pi
    device: raspberry-pi-3
    budgets: {{max_size_mb: 2.0, max_accuracy_drop: 0.02, max_latency_ms: 100}}
retrain:
  callable: trainer:train
  params: {{seed: 7, api_token: s3cr3t-t0ken}}
pipelines:
  fp32:
    stages: [freeze, strip, fold, benchmark, evaluate]
  int8:
    from: fp32
    stages:
      - quantize_nodes: {{}}
      - log_ranges: {{samples: 200}}
      - freeze_ranges: {{min_percentile: 5, max_percentile: 5}}
      - benchmark
      - evaluate
"""


def write_project(root: Path, digits: Path, name: str = "digits-test",
                  register: bool = True) -> Path:
    """A project folder (pyproject.toml marks its root) with recipes/<name>.yaml."""
    root.mkdir(parents=True, exist_ok=True)
    (root / "pyproject.toml").write_text("[project]\nname = 'models'\n")
    recipe = root / "recipes" / f"{name}.yaml"
    recipe.parent.mkdir(exist_ok=True)
    recipe.write_text(RECIPE.format(name=name, model=digits / "saved_model",
                                    data=digits / "data.npz",
                                    register="register: true\n" if register else ""))
    return recipe


def _targets(size: int, drop: float, est: dict[str, float]) -> dict[str, Any]:
    limits = {"phone": (1.0, 0.01), "pi": (2.0, 0.02)}
    targets = {}
    for target, (max_mb, max_drop) in limits.items():
        violations = []
        if size / 1048576 > max_mb:
            violations.append(f"size {size / 1048576:.3f} MiB > max_size_mb {max_mb}")
        if drop > max_drop:
            violations.append(f"accuracy drop {drop:.4f} > max_accuracy_drop {max_drop}")
        targets[target] = {"device": "phone-2016" if target == "phone" else "raspberry-pi-3",
                           "est_latency_ms": est[target], "budgets_ok": not violations,
                           "violations": violations}
    return targets


def variant(name: str, size: int, accuracy: float, fidelity: float,
            source_accuracy: float = 0.9933) -> dict[str, Any]:
    """One report variant; its budgets checked as report.build_variant does for digits."""
    int8 = name != "fp32"
    flops = 1138364 if int8 else 1137620
    drop = round(source_accuracy - accuracy, 6)
    est = ({"phone": 0.0296, "pi": 0.1184} if int8 else {"phone": 0.0569, "pi": 0.2275})
    return {
        "artifact": f"{name}/model.pb", "kind": "graphdef", "size_bytes": size,
        "gzip_size_bytes": int(size * 0.75), "params": 268398, "flops": flops,
        "ops": {"QuantizedConv2D": 2} if int8 else {"Conv2D": 2},
        "latency_ms": {"count": 50, "first": 5.2, "mean": 2.08, "std": 0.6, "min": 0.76,
                       "p50": 2.06, "p90": 2.8, "max": 3.46},
        "accuracy": accuracy, "source_accuracy": source_accuracy, "accuracy_drop": drop,
        "fidelity": fidelity, "ram_bytes": size, "ram_source": "measured peak (benchmark)",
        "precision": "int8" if int8 else "float32",
        "metrics": {"accuracy": accuracy, "fidelity": fidelity},
        "warnings": [], "targets": _targets(size, drop, est),
        "stages": [{"name": "benchmark", "seconds": 0.13, "cached": False},
                   {"name": "evaluate", "seconds": 0.63, "cached": False}]}


def report(int8_accuracy: float = 0.9933, int8_fidelity: float = 1.0,
           int8_size: int = 283539) -> dict[str, Any]:
    """A digits report: fp32 fails the phone's 1 MB budget, int8 passes both targets
    (unless its figures say otherwise); selection as report.select makes it."""
    variants = {"fp32": variant("fp32", 1076835, 0.9933, 1.0),
                "int8": variant("int8", int8_size, int8_accuracy, int8_fidelity)}
    selected = {}
    for target in ("phone", "pi"):
        ok = [n for n, v in variants.items() if v["targets"][target]["budgets_ok"]]
        selected[target] = min(ok, key=lambda n: variants[n]["targets"][target][
            "est_latency_ms"]) if ok else None
    return {"recipe": "digits-test", "recipe_path": "", "mlflow_run_id": None,
            "data": {}, "variants": variants, "selected": selected,
            "data_fingerprints": {"representative": "a1" * 32, "evaluation": "b2" * 32}}


def write_outputs(out_dir: Path, report: dict[str, Any]) -> dict[str, Any]:
    """out_dir/<variant>/ (model.pb of random bytes, signature.json, a stage file) and
    out_dir/report.json, as report.write_outputs lays them out."""
    report = copy.deepcopy(report)
    for name in report["variants"]:
        folder = out_dir / name
        (folder / "ops").mkdir(parents=True, exist_ok=True)
        (folder / "model.pb").write_bytes(os.urandom(4096))
        (folder / "signature.json").write_text(json.dumps({"inputs": ["image"]}))
        (folder / "ops" / "ops_to_register.h").write_text(f"// {name}\n")
    (out_dir / "report.json").write_text(json.dumps(report, indent=2))
    return report
