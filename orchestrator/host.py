"""The machine a timing was measured on: CPU model, cores, OS and the runtime's version.

A latency means little without its host: report.json keeps this beside every measured
timing (a cached result keeps the host that measured it).
"""

from __future__ import annotations

import os
import platform
from functools import lru_cache
from pathlib import Path
from typing import Any


def _cpu_model() -> str:
    """The CPU's model name (Linux: /proc/cpuinfo), else what the platform says."""
    try:
        for line in Path("/proc/cpuinfo").read_text(errors="replace").splitlines():
            key, _, value = line.partition(":")
            if key.strip() in ("model name", "Hardware", "cpu model") and value.strip():
                return value.strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown"


@lru_cache(maxsize=1)
def describe() -> dict[str, Any]:
    """{cpu, cores, machine, system, python, tensorflow}: this process's host."""
    import tensorflow as tf

    return {"cpu": _cpu_model(), "cores": os.cpu_count(), "machine": platform.machine(),
            "system": f"{platform.system()} {platform.release()}",
            "python": platform.python_version(), "tensorflow": tf.__version__}
