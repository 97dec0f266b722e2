"""One model measured on a board, and its outputs there compared with this host's.

What goes to the board is the file that ships, as its bytes (an encrypted one with its
key, which the board holds in memory only); what comes back is its latency per thread
count, its load time and memory in a fresh process, and its outputs on the evaluation
inputs. Those outputs are then judged here: fidelity to the float source model and
accuracy, as evaluate judges the host's, and agreement with the same file run on this host
(`agreement_with_host`; top-1 agreement, max abs difference, SQNR per output).
"""

from __future__ import annotations

import io
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from orchestrator.boards.errors import DeviceLost
from orchestrator.boards.session import BoardSession

if TYPE_CHECKING:
    from orchestrator.model.artifact import ModelArtifact
    from orchestrator.model.kinds import KeyLookup

# the runtimes each kind needs on the board (board_runner.NEEDS by the kind inside)
BOARD_KINDS = {"tflite": "tflite", "graphdef": "graphdef"}
NOISE_CV = 0.15  # timings whose coefficient of variation is above this are noise


def board_kind(artifact: ModelArtifact) -> tuple[str | None, bool]:
    """(the kind the board runs, encrypted?): the kind inside an encrypted file."""
    if artifact.kind != "encrypted":
        return BOARD_KINDS.get(artifact.kind), False
    from orchestrator.model.encryption import read_header
    from orchestrator.model.kinds import to_bytes

    return BOARD_KINDS.get(read_header(to_bytes(artifact)).payload_kind), True


def runtimes_needed(kind: str, encrypted: bool) -> list[str]:
    from orchestrator.boards.board_runner import NEEDS

    return [*NEEDS[kind], *(["cryptography"] if encrypted else [])]


def prepare_command(where: str, runtime: str | None = None) -> str:
    """The `orchestrator device prepare` command for the board at `where`, shell-quoted
    (a `?` in a qemu URL is a glob)."""
    import shlex

    return (f"orchestrator device prepare {shlex.quote(where)}"
            + (f" --runtime {runtime}" if runtime == "tensorflow" else ""))


def why_not_measurable(artifact: ModelArtifact, board: dict[str, Any], where: str
                       ) -> str | None:
    """Why this board (at `where`, its URL) cannot run this file (None: it can)."""
    kind, encrypted = board_kind(artifact)
    if kind is None:
        inner = "a memmapped" if not encrypted else "an encrypted memmapped"
        return (f"{inner} package runs on TensorFlow's MemmappedEnv, which the board's "
                "measuring program does not load; its graph is measured in the variant "
                "before memmap")
    if len(artifact.inputs) != 1:
        return f"the model has {len(artifact.inputs)} inputs; the board is fed one"
    missing = [m for m in runtimes_needed(kind, encrypted)
               if not (board.get("runtimes") or {}).get(m)]
    if missing:
        return (f"the board has no {', '.join(missing)} (`{prepare_command(where, missing[0])}` "
                "installs it)")
    return None


def _npz(arrays: Sequence[np.ndarray], prefix: str) -> bytes:
    buffer = io.BytesIO()
    np.savez(buffer, **{f"{prefix}_{i}": np.asarray(a) for i, a in enumerate(arrays)})
    return buffer.getvalue()


def measure(session: BoardSession, artifact: ModelArtifact, keys: KeyLookup | None,
            inputs: np.ndarray, threads: Sequence[int], *, warmup: int, runs: int,
            samples: int, timeout: float) -> dict[str, Any]:
    """The board's figures for `artifact`: latency per thread setting, load and memory of
    a fresh process, and its outputs on the first `samples` inputs (raw, for `compare`)."""
    from orchestrator.model.encryption import HEADER_BYTES, read_header
    from orchestrator.model.kinds import to_bytes

    kind, encrypted = board_kind(artifact)
    shipped = to_bytes(artifact)
    blobs = [shipped]
    if encrypted:
        assert keys is not None
        blobs.append(keys(read_header(shipped).key_id).secret)
    blobs.append(_npz([inputs], "input"))
    request = {"op": "measure", "kind": kind, "encrypted": encrypted,
               "header_bytes": HEADER_BYTES, "inputs": artifact.input_names,
               "outputs": list(artifact.outputs), "threads": list(threads),
               "warmup": warmup, "runs": runs, "samples": samples}
    reply, out = session.request(request, blobs, timeout=timeout,
                                 doing=f"measuring the {artifact.kind} file")
    if "error" in reply:
        raise DeviceLost(f"{session.where}: the board could not run the file: "
                         f"{reply['error']}")
    with np.load(io.BytesIO(out[0])) as arrays:
        reply["outputs"] = [arrays[f"output_{i}"] for i in range(len(arrays.files))]
    return reply


def compare(device: Sequence[np.ndarray], host: Sequence[np.ndarray], names: Sequence[str],
            labels: np.ndarray | None, kinds: Sequence[str] | None = None,
            source: Sequence[np.ndarray | None] | None = None) -> dict[str, Any]:
    """The board's outputs judged as evaluate judges the host's, and their agreement with
    this host's outputs for the same file, each figure under its own name:

    - `fidelity`: against the float source model's outputs on the same inputs (`source`,
      one per output in order, None where there is none): the scalar evaluate reports
      (top-1 agreement of the first class output, else the lowest 1 - noise/signal
      energy); None without the source's outputs (random inputs);
    - `accuracy`: the first class output against the labels (`host_accuracy`: the same
      file's on this host);
    - `agreement_with_host`: the same scalar against this host's outputs for the same
      file; `top1_agreement` the lowest top-1 agreement with them over the class outputs;
      per output (`outputs`), max abs difference and SQNR against this host's, and top-1
      agreement for class outputs.

    An output's kind is the one evaluate gives it (`kinds`, judged on the source model's
    outputs, else on this host's): an 8-bit file's scores no longer sum to one exactly."""
    from orchestrator.measure import fidelity

    per_output: dict[str, dict[str, Any]] = {}
    judged, against_source = [], []
    unlike_source: dict[str, dict[str, list[int]]] = {}  # left out of `fidelity`
    for index, (name, mine, theirs) in enumerate(zip(names, device, host, strict=False)):
        mine, theirs = np.asarray(mine, np.float64), np.asarray(theirs, np.float64)
        kind = kinds[index] if kinds is not None and index < len(kinds) else (
            fidelity.output_kind(theirs, labelled=labels is not None))
        judged.append((kind, mine, theirs))
        reference = source[index] if source is not None and index < len(source) else None
        if reference is not None:
            reference = np.asarray(reference, np.float64)[:len(mine)]
            if reference.shape == mine.shape:
                against_source.append((kind, mine, reference))
            else:
                unlike_source[name] = {"board": list(mine.shape),
                                       "source": list(reference.shape)}
        figures: dict[str, Any] = {
            "kind": kind, "max_abs_diff": float(f"{fidelity.max_abs_diff(mine, theirs):.6g}"),
            "sqnr_db": round(fidelity.sqnr_db(mine, theirs), 3)}
        if kind in fidelity.CLASS_KINDS:
            figures["top1_agreement"] = round(fidelity.top1_agreement(mine, theirs), 6)
        per_output[name] = figures
    result: dict[str, Any] = {
        "outputs": per_output,
        "fidelity": round(fidelity.fidelity_of(against_source), 6) if against_source
        else None,
        "agreement_with_host": round(fidelity.fidelity_of(judged), 6)}
    if unlike_source:
        result["unlike_source"] = unlike_source
    agreements = [o["top1_agreement"] for o in per_output.values() if "top1_agreement" in o]
    if agreements:
        result["top1_agreement"] = min(agreements)
    # the first class output, as evaluate scores accuracy
    scored = next((i for i, (kind, _, _) in enumerate(judged)
                   if kind in fidelity.CLASS_KINDS), 0)
    if labels is not None and device:
        mine, theirs = np.asarray(device[scored]), np.asarray(host[scored])
        accuracy = fidelity.top1_accuracy(mine, labels[:len(mine)])
        host_accuracy = fidelity.top1_accuracy(theirs, labels[:len(theirs)])
        if accuracy is not None:
            result["accuracy"] = round(accuracy, 6)
            result["host_accuracy"] = None if host_accuracy is None else round(
                host_accuracy, 6)
    return result
