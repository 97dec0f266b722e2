"""Load time and resident-memory growth of a model in a fresh process: the one place that
measures them (the `benchmark` stage's `memory`, the `memmap` stage's comparison).

A fresh Python process pays about 5-10 s to import TensorFlow before it can load anything,
which is not the model's cost. So one helper process (the zygote, as Android starts apps)
imports TensorFlow and LiteRT once, then forks a child per measurement. Each child starts
with no model, creates one empty session (TF's thread pools and allocators are the
runtime's cost, not the model's), then reads the model file, loads it, and runs it once on
random inputs: `load_ms` is that time, `rss_growth_mb` and `anon_growth_mb` the growth of
VmRSS and RssAnon over it (RssAnon is the heap, what a phone's OS counts against an app;
memory-mapped weights are clean file pages it can drop). An encrypted model is decrypted
in the child, as the app does; its key reaches the child through the zygote's pipe only.

The zygote starts on first use, or earlier with `start()` so that its import overlaps other
work, and ends with the process that started it (its stdin closes). It also answers on a
Unix socket of its own (`shared_address()`): the Dask workers of a run's LocalCluster get
its path in SOCKET_ENV and measure through it, rather than each importing TensorFlow once
more in a zygote of their own (on a 2-core machine that was 7 s of CPU per worker).
"""

from __future__ import annotations

import atexit
import hashlib
import json
import os
import selectors
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from orchestrator import helper_process

MB = 1024 * 1024
# how long the zygote's TensorFlow import, then one measurement (a large model on a busy
# machine), may take; past that the zygote and its child are killed and the stage warns
READY_TIMEOUT_S = 300.0
MEASURE_TIMEOUT_S = 180.0
# the socket of a zygote another process of the same run started (a Dask worker's parent)
SOCKET_ENV = "ORCHESTRATOR_LOAD_PROBE_SOCKET"


class ProbeError(RuntimeError):
    """A measurement that could not be made (the stage reports it as a warning)."""


# --------------------------------------------------------------------------- in the child


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


def _random_feeds(inputs: list[dict[str, Any]]) -> list[Any]:
    """Random data of each input's dtype and shape (the benchmark's own; batch 1)."""
    import numpy as np

    from orchestrator.measure.tf_runtime import random_input

    return [random_input(None if item["shape"] is None else
                         [None if d in (None, -1) else d for d in item["shape"]],
                         np.dtype(item["dtype"]), 1, seed=index)
            for index, item in enumerate(inputs)]


def _run_graph(data: bytes, spec: dict[str, Any]) -> list[Any]:
    import tensorflow as tf

    from orchestrator.measure.tf_runtime import session_config

    graph_def = tf.compat.v1.GraphDef()
    graph_def.ParseFromString(data)
    graph = tf.Graph()
    with graph.as_default():
        tf.compat.v1.import_graph_def(graph_def, name="")
    session = tf.compat.v1.Session(graph=graph, config=session_config(1))
    feed = {graph.get_tensor_by_name(f"{item['name']}:0"): value
            for item, value in zip(spec["inputs"], _random_feeds(spec["inputs"]), strict=True)}
    fetches = [graph.get_tensor_by_name(o if ":" in o else f"{o}:0") for o in spec["outputs"]]
    return list(session.run(fetches, feed))


def _run_tflite(data: bytes, spec: dict[str, Any]) -> list[Any]:
    from ai_edge_litert.interpreter import Interpreter

    interpreter = Interpreter(model_content=data, num_threads=1)
    interpreter.allocate_tensors()
    for detail in interpreter.get_input_details():
        shape = [int(d) for d in detail["shape"]]
        item = {"shape": shape, "dtype": detail["dtype"]}
        interpreter.set_tensor(detail["index"], _random_feeds([item])[0])
    interpreter.invoke()
    return [interpreter.get_tensor(d["index"]) for d in interpreter.get_output_details()]


def probe(spec: dict[str, Any]) -> dict[str, Any]:
    """In this (fresh) process: read, load and run the model once; time and memory growth.

    spec: `path` (the file), `format` ("graph" or "tflite"), `inputs`, `outputs`, and for
    an encrypted file `key` (hex): the format is then the one inside."""
    import numpy as np
    import tensorflow as tf

    from orchestrator.measure.tf_runtime import session_config

    with tf.compat.v1.Session(graph=tf.Graph(), config=session_config(1)):
        pass  # TF's runtime (thread pools, allocators) is not the model's cost
    before = _memory()
    start = time.perf_counter()
    data = Path(spec["path"]).read_bytes()
    fmt = spec["format"]
    if spec.get("key"):
        from orchestrator.model.encryption import decrypt

        fmt, data = decrypt(data, bytes.fromhex(spec["key"]))
        if fmt == "memmapped":  # decrypted into memory: the weights cannot be mapped
            from orchestrator.model.memmap_format import read_package, rebuild

            fmt, data = "graph", rebuild(read_package(data)).SerializeToString()
    outputs = _run_tflite(data, spec) if fmt == "tflite" else _run_graph(data, spec)
    load_ms = (time.perf_counter() - start) * 1000.0
    after = _memory()
    digest = hashlib.sha256(b"".join(np.ascontiguousarray(o).tobytes() for o in outputs))
    return {"load_ms": round(load_ms, 3),
            "rss_growth_mb": round((after["rss"] - before["rss"]) / MB, 3),
            "anon_growth_mb": round((after["anon"] - before["anon"]) / MB, 3),
            "outputs_sha256": digest.hexdigest()}


# --------------------------------------------------------------------------- the zygote


def _forked_probe(spec: dict[str, Any]) -> dict[str, Any]:
    """Fork, probe in the child, return its answer (or why it gave none)."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: answer through the pipe, then leave without cleanup
        os.close(read_end)
        try:
            answer = probe(spec)
        except BaseException as exc:  # noqa: BLE001 - every failure becomes an answer
            answer = {"error": f"{type(exc).__name__}: {exc}"}
        with os.fdopen(write_end, "w") as out:
            out.write(json.dumps(answer))
        os._exit(0)
    os.close(write_end)
    with os.fdopen(read_end) as answers:
        text = answers.read()
    _, status = os.waitpid(pid, 0)
    if text:
        return dict(json.loads(text))
    if os.WIFSIGNALED(status):
        return {"error": f"the probe process died of signal {os.WTERMSIG(status)}"}
    return {"error": f"the probe process exited with {os.waitstatus_to_exitcode(status)}"}


def zygote_loop(socket_path: str | None = None) -> None:
    """The zygote's loop: a JSON spec per stdin line, a JSON answer per stdout line; and,
    with `socket_path`, one spec and its answer per connection there. Ends at the end of
    stdin (the process that started it is gone)."""
    answers = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)  # anything a library prints goes to stderr, never into the answers
    listener = None
    if socket_path is not None:  # bound first: a client that comes early waits in line
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        listener.bind(socket_path)
        listener.listen(16)
    from orchestrator.model.tf_adapter import import_tensorflow

    import_tensorflow()  # once here, shared by every child
    from ai_edge_litert.interpreter import Interpreter  # noqa: F401

    import orchestrator.measure.tf_runtime  # noqa: F401
    import orchestrator.model.encryption  # noqa: F401

    answers.write(json.dumps({"ready": True}) + "\n")
    answers.flush()
    selector = selectors.DefaultSelector()
    selector.register(0, selectors.EVENT_READ)
    if listener is not None:
        selector.register(listener, selectors.EVENT_READ)
    pending = b""
    while True:
        for key, _ in selector.select():
            if key.fileobj is listener:
                _answer_connection(listener)
                continue
            chunk = os.read(0, 65536)
            if not chunk:
                return
            pending += chunk
            while b"\n" in pending:
                line, _, pending = pending.partition(b"\n")
                if line.strip():
                    answers.write(json.dumps(_forked_probe(json.loads(line))) + "\n")
                    answers.flush()


def _answer_connection(listener: socket.socket) -> None:
    """One spec from a connection on the zygote's socket, and its answer. A client that
    went away (a worker killed mid-measurement) costs its own answer only."""
    connection, _ = listener.accept()
    with connection:
        channel = helper_process.Channel(connection, connection)
        try:
            line = channel.read_line(helper_process.deadline_in(MEASURE_TIMEOUT_S))
            if line.strip():
                answer = _forked_probe(json.loads(line))
                channel.write((json.dumps(answer) + "\n").encode(),
                              helper_process.deadline_in(MEASURE_TIMEOUT_S))
        except (helper_process.HelperError, OSError, ValueError):
            pass


def _shared_request(path: str, spec: dict[str, Any]) -> dict[str, Any] | None:
    """`spec` measured by the zygote listening at `path`; None when none listens there."""
    waited = READY_TIMEOUT_S + MEASURE_TIMEOUT_S  # its import, others first
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as client:
        client.settimeout(waited)
        try:
            client.connect(path)
        except OSError:
            return None
        channel = helper_process.Channel(client, client)
        deadline = helper_process.deadline_in(waited)
        try:
            channel.write((json.dumps(spec) + "\n").encode(), deadline)
            line = channel.read_line(deadline)
        except helper_process.HelperEnded as exc:
            if exc.why != "it ended":
                raise ProbeError(f"the run's load probe process at {path} failed: "
                                 f"{exc.__cause__}") from exc
            line = b""
        except helper_process.HelperTimeout as exc:
            raise ProbeError(f"the run's load probe process at {path} failed: no answer "
                             f"in {waited:.0f} s") from exc
    if not line.strip():
        raise ProbeError(f"the run's load probe process at {path} gave no answer")
    return dict(json.loads(line))


def _shared_path() -> str | None:
    """The socket of the run's zygote that this process was given, when it is there."""
    path = os.environ.get(SOCKET_ENV)
    return path if path and os.path.exists(path) else None


class _Zygote:
    """The client side: starts the zygote, sends specs, reads answers (one at a time)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._process: subprocess.Popen[bytes] | None = None
        self._helper: helper_process.Helper | None = None
        self._log: Any = None
        self._ready = False
        self._socket_dir: str | None = None

    @property
    def address(self) -> str | None:
        """The zygote's socket, while it runs."""
        if self._process is None or self._process.poll() is not None or not self._socket_dir:
            return None
        return os.path.join(self._socket_dir, "probe.sock")

    def start(self) -> None:
        with self._lock:
            self._start()

    def _start(self) -> None:
        if self._process is not None and self._process.poll() is None:
            return
        env = helper_process.module_env({**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"})
        self._log = tempfile.TemporaryFile()
        self._remove_socket()
        # a folder only this user reads: a model's key may cross the socket
        self._socket_dir = tempfile.mkdtemp(prefix="orchestrator-probe-")
        socket_path = os.path.join(self._socket_dir, "probe.sock")
        self._process = helper_process.start(
            [sys.executable, "-m", "orchestrator.measure.load_probe", "--zygote", socket_path],
            env=env, stderr=self._log,
            new_session=True)  # a Ctrl-C at the terminal is for the run to handle
        self._helper = helper_process.Helper(self._process)
        self._ready = False

    def request(self, spec: dict[str, Any]) -> dict[str, Any]:
        """The spec's answer; a zygote that gives none in time, ends, or is cut short (a
        Ctrl-C) is killed, and the next request starts a new one."""
        with self._lock:
            self._start()
            assert self._helper is not None
            with self._helper.exchange():
                if not self._ready:  # {"ready": true}: TensorFlow is imported
                    self._read_line(READY_TIMEOUT_S)
                    self._ready = True
                try:
                    self._helper.write((json.dumps(spec) + "\n").encode())
                except helper_process.HelperError as exc:
                    raise self._failed(f"could not reach it ({exc.__cause__})") from exc
                answer = self._read_line(MEASURE_TIMEOUT_S)
        if "error" in answer:
            raise ProbeError(f"the load probe failed: {answer['error']}")
        return answer

    def _read_line(self, timeout_s: float) -> dict[str, Any]:
        assert self._helper is not None
        try:
            line = self._helper.read_line(helper_process.deadline_in(timeout_s))
        except helper_process.HelperTimeout:
            raise self._failed(f"no answer in {timeout_s:.0f} s") from None
        except helper_process.HelperEnded:
            raise self._failed("it ended") from None
        return dict(json.loads(line))

    def _failed(self, why: str) -> ProbeError:
        """Kill the zygote (the next request starts a new one); the error says why."""
        if self._process is not None:
            helper_process.kill(self._process)
        tail = ""
        if self._log is not None:
            self._log.seek(0)
            lines = self._log.read().decode(errors="replace").strip().splitlines()
            tail = " ".join(lines[-3:])
        self.stop_locked()
        return ProbeError(f"the load probe process failed: {why}" + (f": {tail}" if tail
                                                                      else ""))

    def stop(self) -> None:
        with self._lock:
            self.stop_locked()

    def stop_locked(self) -> None:
        """Its input ends (its loop ends there), 5 s for that, then killed. Still importing
        TensorFlow (it reads no input until then), nothing asked of it yet: killed at once
        (an exit right after a Ctrl-C waited 5 s)."""
        process = self._process
        try:
            if process is not None:
                helper_process.stop(process, 5 if self._ready else None)
        finally:
            self._process = self._helper = None
            if self._log is not None:
                self._log.close()
                self._log = None
            self._remove_socket()

    def kill(self) -> None:
        """At once, without the lock or a wait (this process exits now, on a second
        Ctrl-C): the zygote and the children it forked, and its socket's folder."""
        process = self._process
        if process is not None:
            helper_process.kill(process, reap_timeout=0)
        self._remove_socket()

    def _remove_socket(self) -> None:
        if self._socket_dir is not None:
            shutil.rmtree(self._socket_dir, ignore_errors=True)
            self._socket_dir = None


_ZYGOTE = _Zygote()


def _stop_at_exit() -> None:
    """The zygote ends with this process. A Ctrl-C while it is stopped (the interpreter's
    exit, after a first Ctrl-C: a double Ctrl-C) kills it instead, quietly: a traceback
    from an exit handler would read as a crash."""
    try:
        _ZYGOTE.stop()
    except KeyboardInterrupt:
        _ZYGOTE.kill()


atexit.register(_stop_at_exit)


def kill_now() -> None:
    """The zygote killed at once (see _Zygote.kill), for a process that exits now."""
    _ZYGOTE.kill()


def start() -> None:
    """Start the zygote now (its TensorFlow import then overlaps the caller's work); not
    when this process was given the socket of its run's zygote (a LocalCluster worker)."""
    if _shared_path() is None:
        _ZYGOTE.start()


def shared_address() -> str | None:
    """The socket of this process's zygote, for worker processes of the same run and
    machine (SOCKET_ENV); None when it is not running."""
    return _ZYGOTE.address


def measure_file(path: Path, fmt: str, inputs: list[dict[str, Any]], outputs: list[str],
                 key: bytes | None = None) -> dict[str, Any]:
    """Load time and memory growth of the model file at `path` in a fresh process.

    fmt: "graph" (a GraphDef, frozen or with ImmutableConst nodes naming weight files) or
    "tflite"; `key`: the file is encrypted with it (the format is then the one inside)."""
    spec: dict[str, Any] = {"path": str(path), "format": fmt, "inputs": inputs,
                            "outputs": outputs}
    if key is not None:
        spec["key"] = key.hex()
    shared = _shared_path()
    answer = None if shared is None else _shared_request(shared, spec)
    if answer is None:
        return _ZYGOTE.request(spec)
    if "error" in answer:
        raise ProbeError(f"the load probe failed: {answer['error']}")
    return answer


def measure_artifact(artifact: Any, keys: Any, inputs: list[dict[str, Any]],
                     outputs: list[str]) -> dict[str, Any]:
    """`measure_file` of an artifact of any kind, written to a temporary folder as an app
    gets it: a memmapped package as its weight files + ImmutableConst graph, an encrypted
    model as the encrypted file (decrypted in the child)."""
    from orchestrator.model import kinds
    with tempfile.TemporaryDirectory(prefix="orchestrator-load-") as tmp:
        folder = Path(tmp)
        key = None
        if artifact.kind == "encrypted":
            from orchestrator.model.encryption import read_header

            data = kinds.to_bytes(artifact)
            key = keys(read_header(data).key_id).secret if keys is not None else None
            if key is None:
                raise ProbeError("the model is encrypted and no key was given")
            path, fmt = folder / "model.enc", "graph"
            path.write_bytes(data)
        elif artifact.kind == "memmapped":
            path, fmt = write_runnable_memmapped(artifact.payload, folder), "graph"
        else:
            fmt = "tflite" if artifact.kind == "tflite" else "graph"
            path = folder / kinds.file_name(artifact.kind)
            path.write_bytes(kinds.to_bytes(artifact))
        return measure_file(path, fmt, inputs, outputs, key)


def write_runnable_memmapped(package_bytes: bytes, folder: Path) -> Path:
    """The memmapped package as TF runs it directly: weight files + a GraphDef whose
    ImmutableConst nodes name them. Returns the GraphDef's path."""
    from orchestrator.model.memmap_format import read_package, write_runnable

    runnable = write_runnable(read_package(package_bytes), folder / "weights")
    path = folder / "memmapped.pb"
    path.write_bytes(runnable.SerializeToString())
    return path


if __name__ == "__main__":  # python -m orchestrator.measure.load_probe --zygote [SOCKET]
    zygote_loop(sys.argv[2] if len(sys.argv) > 2 else None)
