"""Load time and resident-memory growth of a model, measured in a fresh Python process.

`measure(package, frozen)` writes the memmapped package's directly runnable variant (weight
files + a GraphDef of ImmutableConst nodes naming them) and the plain frozen graph into a
temporary folder, then runs `python -m orchestrator.memmap_probe SPEC` once for each: every
measurement starts from a process that has imported TensorFlow and created one empty
session, so the numbers are the model's own. RSS comes from /proc/self/status (VmRSS, and
RssAnon: the heap, which is what a phone's OS counts against an app; mapped weights are
clean file pages it can drop).
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

MB = 1024 * 1024


def _memory() -> dict[str, int]:
    """VmRSS and RssAnon in bytes (ru_maxrss when /proc is missing)."""
    try:
        lines = Path("/proc/self/status").read_text().splitlines()
    except OSError:
        import resource

        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
        return {"rss": peak, "anon": peak}
    values = {k: int(v.split()[0]) * 1024 for k, v in (line.split(":", 1) for line in lines
                                                      if line.startswith(("VmRSS", "RssAnon")))}
    return {"rss": values.get("VmRSS", 0), "anon": values.get("RssAnon", values.get("VmRSS", 0))}


def probe(spec: dict[str, Any]) -> dict[str, Any]:
    """In this process: read, import and run the graph once; time and memory growth."""
    import numpy as np
    import tensorflow as tf

    from orchestrator.runtime import session_config

    with tf.compat.v1.Session(graph=tf.Graph(), config=session_config(1)):
        pass  # TF's runtime (thread pools, allocators) is not the model's cost
    before = _memory()
    start = time.perf_counter()
    graph_def = tf.compat.v1.GraphDef()
    graph_def.ParseFromString(Path(spec["graph"]).read_bytes())
    graph = tf.Graph()
    with graph.as_default():
        tf.compat.v1.import_graph_def(graph_def, name="")
    session = tf.compat.v1.Session(graph=graph, config=session_config(1))
    rng = np.random.default_rng(0)
    feed = {}
    for item in spec["inputs"]:
        shape = [1 if d in (None, -1) else d for d in (item["shape"] or [1])]
        feed[graph.get_tensor_by_name(f"{item['name']}:0")] = rng.random(shape).astype(
            item["dtype"])
    fetches = [graph.get_tensor_by_name(o if ":" in o else f"{o}:0") for o in spec["outputs"]]
    outputs = session.run(fetches, feed)
    load_ms = (time.perf_counter() - start) * 1000.0
    after = _memory()
    digest = hashlib.sha256(b"".join(np.ascontiguousarray(o).tobytes() for o in outputs))
    return {"load_ms": round(load_ms, 3),
            "rss_growth_mb": round((after["rss"] - before["rss"]) / MB, 3),
            "anon_growth_mb": round((after["anon"] - before["anon"]) / MB, 3),
            "outputs_sha256": digest.hexdigest()}


def _run_fresh(spec: dict[str, Any]) -> dict[str, Any]:
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"}
    package_root = str(Path(__file__).resolve().parents[1])
    env["PYTHONPATH"] = os.pathsep.join(p for p in (package_root, env.get("PYTHONPATH")) if p)
    done = subprocess.run([sys.executable, "-m", "orchestrator.memmap_probe", json.dumps(spec)],
                          capture_output=True, text=True, env=env, timeout=600, check=False)
    if done.returncode != 0:
        tail = done.stderr.strip().splitlines()[-3:]
        raise RuntimeError(f"the load probe failed (exit {done.returncode}): {' '.join(tail)}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def measure(package: Any, frozen_graph_bytes: bytes, inputs: list[dict[str, Any]],
            outputs: list[str]) -> dict[str, Any]:
    """Fresh-process load of the runnable memmapped variant, then of the frozen graph."""
    from orchestrator.memmap_format import write_runnable

    with tempfile.TemporaryDirectory(prefix="orchestrator-memmap-") as tmp:
        folder = Path(tmp)
        runnable = write_runnable(package, folder / "weights")
        (folder / "memmapped.pb").write_bytes(runnable.SerializeToString())
        (folder / "frozen.pb").write_bytes(frozen_graph_bytes)
        mapped = _run_fresh({"graph": str(folder / "memmapped.pb"), "inputs": inputs,
                             "outputs": outputs})
        frozen = _run_fresh({"graph": str(folder / "frozen.pb"), "inputs": inputs,
                             "outputs": outputs})
    return {"load_ms": mapped["load_ms"], "rss_growth_mb": mapped["rss_growth_mb"],
            "anon_growth_mb": mapped["anon_growth_mb"],
            "frozen_load_ms": frozen["load_ms"], "frozen_rss_growth_mb": frozen["rss_growth_mb"],
            "frozen_anon_growth_mb": frozen["anon_growth_mb"],
            "outputs_identical": mapped["outputs_sha256"] == frozen["outputs_sha256"]}


if __name__ == "__main__":
    print(json.dumps(probe(json.loads(sys.argv[1]))))
