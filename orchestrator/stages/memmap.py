"""Convert the graph into a memmapped package (what TF's MemmappedEnv loads on a phone).

Every Const of a plain-old-data dtype (quint8 and qint8 included) of at least
`min_conversion_size_bytes` becomes an ImmutableConst whose tensor lives in a 64-byte
aligned region of the package: the app maps the weights instead of copying them to the
heap. The package is parsed back and checked (alignment, bounds, every region's bytes equal
to its Const's) before it is returned.

With `measure`, fresh processes load and run the directly runnable variant (weight files +
ImmutableConst nodes naming them) and the plain frozen graph, and report.json's `memmap`
gets both load times and resident-memory growths (VmRSS, and RssAnon: the heap).
"""

from __future__ import annotations

from pydantic import Field

from orchestrator.errors import StageError
from orchestrator.limits import bounded
from orchestrator.model.artifact import ModelArtifact
from orchestrator.stages import register
from orchestrator.stages.base import Stage, StageContext, StageParams, StageResult


class Params(StageParams):
    min_conversion_size_bytes: bounded("bytes") = Field(
        10_000, description="Consts of at least this many bytes are memory-mapped (TF's "
        "convert_graphdef_memmapped_format default).")
    measure: bool = Field(
        True, description="Measure load time and memory growth against the frozen graph, "
        "each in a fresh process forked from one that imported TensorFlow once.")


def run(artifact: ModelArtifact, params: Params, ctx: StageContext) -> StageResult:
    from orchestrator.model.memmap_format import read_package, tensor_bytes, write_package

    data, _ = write_package(artifact.graph_def, params.min_conversion_size_bytes)
    package = read_package(data)
    consts = {n.name: n for n in artifact.graph_def.node}
    converted = package.converted_nodes()
    for item in converted:  # each region must hold exactly its Const's bytes
        if package.region(item["region"]) != tensor_bytes(consts[item["node"]].attr["value"]
                                                          .tensor):
            raise StageError(f"region {item['region']} differs from Const {item['node']}",
                             pipeline=ctx.pipeline, stage=ctx.stage)
    info = {"regions": len(package.regions), "converted_nodes": len(converted),
            "converted_bytes": sum(item["bytes"] for item in converted),
            "min_conversion_size_bytes": params.min_conversion_size_bytes}
    warnings = []
    if not converted:
        warnings.append(f"no Const of {params.min_conversion_size_bytes} bytes or more: "
                        "nothing is memory-mapped")
    if params.measure:
        from orchestrator.measure.load_probe import ProbeError

        try:
            info.update(_compare_loads(data, artifact))
        except (ProbeError, OSError, ValueError) as exc:
            warnings.append(f"load time and memory not measured: {exc}")
    result = artifact.replace(graph_def=None, kind="memmapped", payload=data)
    metrics = {f"memmap_{k}": float(v) for k, v in info.items() if isinstance(v, int | float)}
    return StageResult(artifact=result, metrics=metrics, info={"memmap": info},
                       warnings=warnings)


def _compare_loads(package_bytes: bytes, frozen: ModelArtifact) -> dict:
    """Fresh-process load of the directly runnable memmapped variant, then of the frozen
    graph (see orchestrator.measure.load_probe)."""
    import tempfile
    from pathlib import Path

    from orchestrator.measure.load_probe import measure_file, write_runnable_memmapped

    inputs, outputs = [s.to_json() for s in frozen.inputs], list(frozen.outputs)
    with tempfile.TemporaryDirectory(prefix="orchestrator-memmap-") as tmp:
        folder = Path(tmp)
        mapped = measure_file(write_runnable_memmapped(package_bytes, folder), "graph",
                              inputs, outputs)
        (folder / "frozen.pb").write_bytes(frozen.graph_bytes())
        plain = measure_file(folder / "frozen.pb", "graph", inputs, outputs)
    return {"load_ms": mapped["load_ms"], "rss_growth_mb": mapped["rss_growth_mb"],
            "anon_growth_mb": mapped["anon_growth_mb"],
            "frozen_load_ms": plain["load_ms"], "frozen_rss_growth_mb": plain["rss_growth_mb"],
            "frozen_anon_growth_mb": plain["anon_growth_mb"],
            "outputs_identical": mapped["outputs_sha256"] == plain["outputs_sha256"]}


def _prepare(params: Params) -> None:
    if params.measure:
        from orchestrator.measure.load_probe import start

        start()  # the probe's process imports TensorFlow while earlier stages run


STAGE = register(Stage(name="memmap", run=run, prepare=_prepare, params=Params, doc=__doc__,
                       produces="memmapped",
                       refuses={"tflite": "a .tflite flatbuffer is memory-mapped as it is: "
                                "memmap does not apply to the LiteRT path"}))
