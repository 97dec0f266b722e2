"""The program that runs on the board: sent as source over the connection, never installed.

It needs Python 3.8+ and numpy, plus `ai_edge_litert` for `.tflite` files, `tensorflow`
for GraphDef ones and `cryptography` for encrypted ones, each imported only when a request
needs it. It imports nothing of the orchestrator, so nothing of the host's package has to
be on the board.

The host speaks to it over stdin and stdout in frames: 8 bytes of length (little-endian),
then the bytes. A message is a JSON frame, then as many binary frames as its `blobs` says.
Requests: `describe` (what the board is), `measure` (one model: latency per thread count,
load time and memory of a fresh process, the evaluation inputs run), `bye`. Every reply is
JSON (`error` and `missing` when it failed). Native code's prints go to stderr: stdout
carries frames only.

On the board it keeps to one folder, `<tmp>/orchestrator-board/`: `lock`, held while
measuring, so that two measurements never share the board's cores (across runs, hosts and
Dask workers), and one `job-<pid>` folder per runner, removed when the runner ends; one
whose runner died (a lost connection, a reboot) is removed by the next runner to start.
A model's bytes stay in memory where the runtime allows it; the model key always does.
"""

import fcntl
import io
import json
import os
import platform
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import time

PROTOCOL = 1
FRAME = struct.Struct("<Q")
ROOT = os.path.join(tempfile.gettempdir(), "orchestrator-board")
RUNTIMES = ("numpy", "ai_edge_litert", "tensorflow", "cryptography")
# the runtime each artifact kind runs in on the board
NEEDS = {"tflite": ("numpy", "ai_edge_litert"), "graphdef": ("numpy", "tensorflow")}


def read_exact(stream, count):
    chunks, left = [], count
    while left:
        chunk = stream.read(left)
        if not chunk:
            raise EOFError("the host closed the connection")
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def read_message(stream):
    (size,) = FRAME.unpack(read_exact(stream, FRAME.size))
    message = json.loads(read_exact(stream, size))
    blobs = []
    for _ in range(message.get("blobs", 0)):
        (size,) = FRAME.unpack(read_exact(stream, FRAME.size))
        blobs.append(read_exact(stream, size))
    return message, blobs


def write_message(stream, message, blobs=()):
    data = json.dumps(dict(message, blobs=len(blobs))).encode()
    stream.write(FRAME.pack(len(data)) + data)
    for blob in blobs:
        stream.write(FRAME.pack(len(blob)))
        stream.write(blob)
    stream.flush()


def version_of(module):
    try:
        from importlib.metadata import version

        names = {"ai_edge_litert": "ai-edge-litert", "tensorflow": "tensorflow"}
        if module == "tensorflow":
            for dist in ("tensorflow", "tensorflow-cpu", "tensorflow-aarch64"):
                try:
                    return version(dist)
                except Exception:  # noqa: BLE001, S112
                    continue
        return version(names.get(module, module))
    except Exception:  # noqa: BLE001
        return None


def read_text(path):
    try:
        with open(path) as handle:
            return handle.read().strip()
    except OSError:
        return None


def cpu_model():
    """The CPU's name: `model name` where the kernel gives one, else the Arm part number."""
    text = read_text("/proc/cpuinfo") or ""
    fields = {}
    for line in text.splitlines():
        if ":" in line:
            name, _, value = line.partition(":")
            fields.setdefault(name.strip(), value.strip())
    if "model name" in fields:
        return fields["model name"]
    parts = {"0xd03": "Cortex-A53", "0xd04": "Cortex-A35", "0xd05": "Cortex-A55",
             "0xd07": "Cortex-A57", "0xd08": "Cortex-A72", "0xd09": "Cortex-A73",
             "0xd0a": "Cortex-A75", "0xd0b": "Cortex-A76", "0xd0c": "Neoverse-N1",
             "0xd0d": "Cortex-A77", "0xd41": "Cortex-A78", "0xd44": "Cortex-X1",
             "0xd46": "Cortex-A510", "0xd47": "Cortex-A710", "0xd4f": "Neoverse-V2"}
    part = fields.get("CPU part")
    if part:
        return parts.get(part, "Arm CPU part " + part)
    return fields.get("Hardware") or platform.processor() or None


def memory_mb():
    for line in (read_text("/proc/meminfo") or "").splitlines():
        if line.startswith("MemTotal:"):
            return round(int(line.split()[1]) / 1024, 1)
    return None


def describe():
    runtimes = {}
    for module in RUNTIMES:
        found = importable(module)
        runtimes[module] = version_of(module) if found else None
    return {"protocol": PROTOCOL, "site": board_site(), "machine": platform.machine(),
            "system": platform.system(),
            "kernel": platform.release(), "cpu": cpu_model(), "cores": os.cpu_count(),
            "memory_mb": memory_mb(), "python": platform.python_version(),
            "python_tag": "cp%d%d" % sys.version_info[:2], "libc": "-".join(platform.libc_ver()),
            "hostname": platform.node(), "runtimes": runtimes}


def importable(module):
    import importlib.util

    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def missing_for(kind, encrypted):
    needed = list(NEEDS.get(kind, ("numpy",)))
    if encrypted:
        needed.append("cryptography")
    return [m for m in needed if not importable(m)]


def decrypted(model, key, header_bytes):
    from cryptography.hazmat.primitives.ciphers.aead import AESGCM

    nonce = model[header_bytes - 12:header_bytes]
    return AESGCM(key).decrypt(nonce, model[header_bytes:], model[:header_bytes])


class LiteRT:
    """A `.tflite` in LiteRT's interpreter; float in and out, int8 edges (de)quantized."""

    def __init__(self, model, threads, input_names, output_names):
        from ai_edge_litert.interpreter import Interpreter

        self.interpreter = Interpreter(model_content=bytes(model), num_threads=threads)
        self.interpreter.allocate_tensors()
        self.inputs = ordered(self.interpreter.get_input_details(), input_names,
                              signature(self.interpreter, "inputs"))
        self.outputs = ordered(self.interpreter.get_output_details(), output_names,
                               signature(self.interpreter, "outputs"))

    def batch_size(self):
        shape = self.inputs[0]["shape"]
        return int(shape[0]) if len(shape) else 1

    def set_inputs(self, values):
        import numpy as np

        resized = False
        for detail, value in zip(self.inputs, values):
            if tuple(detail["shape"]) != tuple(value.shape):
                self.interpreter.resize_tensor_input(detail["index"], list(value.shape))
                resized = True
        if resized:
            self.interpreter.allocate_tensors()
            by_index = {d["index"]: d for d in self.interpreter.get_input_details()}
            self.inputs = [by_index[d["index"]] for d in self.inputs]
            by_index = {d["index"]: d for d in self.interpreter.get_output_details()}
            self.outputs = [by_index[d["index"]] for d in self.outputs]
        for detail, value in zip(self.inputs, values):
            dtype = np.dtype(detail["dtype"])
            scale, zero_point = detail.get("quantization", (0.0, 0))
            if dtype in (np.int8, np.uint8, np.int16) and scale > 0:
                info = np.iinfo(dtype)
                value = np.clip(np.round(value / scale + zero_point), info.min, info.max)
            self.interpreter.set_tensor(detail["index"], np.ascontiguousarray(value, dtype))

    def invoke(self):
        self.interpreter.invoke()

    def outputs_now(self):
        import numpy as np

        values = []
        for detail in self.outputs:
            value = self.interpreter.get_tensor(detail["index"])
            scale, zero_point = detail.get("quantization", (0.0, 0))
            if np.dtype(detail["dtype"]) in (np.int8, np.uint8, np.int16) and scale > 0:
                value = (value.astype(np.float32) - zero_point) * np.float32(scale)
            values.append(np.array(value, copy=True))
        return values


class TFGraph:
    """A frozen GraphDef in one TF1 session: inter-op 1, intra-op `threads`, as on a phone."""

    def __init__(self, model, threads, input_names, output_names):
        import tensorflow as tf

        graph_def = tf.compat.v1.GraphDef()
        graph_def.ParseFromString(bytes(model))
        graph = tf.Graph()
        with graph.as_default():
            tf.compat.v1.import_graph_def(graph_def, name="")
        config = tf.compat.v1.ConfigProto(inter_op_parallelism_threads=1,
                                          intra_op_parallelism_threads=threads)
        self.session = tf.compat.v1.Session(graph=graph, config=config)
        self.feeds = [graph.get_tensor_by_name(tensor_name(n)) for n in input_names]
        self.fetches = [graph.get_tensor_by_name(tensor_name(n)) for n in output_names]
        self.values = None
        self.results = None

    def batch_size(self):
        dims = self.feeds[0].shape.as_list() if self.feeds[0].shape.rank else []
        return dims[0] if dims and dims[0] else None

    def set_inputs(self, values):
        self.values = dict(zip(self.feeds, values))

    def invoke(self):
        self.results = self.session.run(self.fetches, self.values)

    def outputs_now(self):
        return list(self.results)


def tensor_name(name):
    return name if ":" in name else name + ":0"


def signature_name(ref):
    """As orchestrator.model.litert_model.signature_name: `node` for output 0, else
    `node:k`."""
    ref = ref.lstrip("^")
    return ref[:-2] if ref.endswith(":0") else ref


def signature(interpreter, side):
    """A LiteRT model's signature (serving_default, else the only one): name -> tensor
    index, for `side` ("inputs" or "outputs"); {} without one."""
    try:
        signatures = interpreter._get_full_signature_list()
    except (AttributeError, RuntimeError, ValueError):
        return {}
    key = "serving_default" if "serving_default" in signatures else (
        next(iter(signatures)) if len(signatures) == 1 else None)
    return {} if key is None else dict(signatures[key].get(side) or {})


def ordered(details, names, by_signature=None):
    """`details` in the order of the graph tensors `names`: through the signature, else
    by tensor name, else (names stripped) as the interpreter has them. As
    orchestrator.model.litert_model.in_order: the converter does not keep output order."""
    if len(details) != len(names):
        return list(details)
    wanted = [signature_name(n) for n in names]
    by_index = {int(d["index"]): d for d in details}
    by_signature = by_signature or {}
    picked = [by_signature.get(n) for n in wanted]
    if None not in picked and len(set(picked)) == len(picked) and all(
            int(i) in by_index for i in picked):
        return [by_index[int(i)] for i in picked]
    by_name = {signature_name(d["name"]): d for d in details}
    if len(by_name) == len(details) and all(n in by_name for n in wanted):
        return [by_name[n] for n in wanted]
    return list(details)


def open_model(kind, model, threads, request):
    runner = LiteRT if kind == "tflite" else TFGraph
    return runner(model, threads, request["inputs"], request["outputs"])


def percentile(values, share):
    ordered_values = sorted(values)
    position = (len(ordered_values) - 1) * share
    low = int(position)
    high = min(low + 1, len(ordered_values) - 1)
    return ordered_values[low] + (ordered_values[high] - ordered_values[low]) * (position - low)


def latency_stats(first, timed):
    count = len(timed)
    mean = sum(timed) / count
    std = (sum((t - mean) ** 2 for t in timed) / count) ** 0.5
    stats = {"count": count, "first": first, "curr": timed[-1], "mean": mean, "std": std,
             "cv": std / mean if mean > 0 else 0.0, "min": min(timed),
             "p50": percentile(timed, 0.5), "p90": percentile(timed, 0.9),
             "p99": percentile(timed, 0.99), "max": max(timed)}
    return {k: (v if k == "count" else round(v, 4)) for k, v in stats.items()}


def timed(runner, feeds, warmup, runs):
    runner.set_inputs(feeds)
    times = []
    for _ in range(warmup + runs + 1):
        started = time.perf_counter()
        runner.invoke()
        times.append((time.perf_counter() - started) * 1000)
    return latency_stats(times[0], times[1 + warmup:])


def batches(inputs, size):
    import numpy as np

    for start in range(0, len(inputs[0]), size):
        batch = [x[start:start + size] for x in inputs]
        if len(batch[0]) < size:  # a fixed batch: the last one padded, the padding dropped
            batch = [np.concatenate([b, np.repeat(b[-1:], size - len(b), axis=0)])
                     for b in batch]
        yield batch


def predict(runner, inputs):
    import numpy as np

    size = runner.batch_size() or 1
    count = len(inputs[0])
    per_batch = []
    for batch in batches(inputs, size):
        runner.set_inputs(batch)
        runner.invoke()
        per_batch.append(runner.outputs_now())
    return [np.concatenate([outs[i] for outs in per_batch])[:count]
            for i in range(len(per_batch[0]))]


def big_cores():
    """The cores with the highest capacity (big.LITTLE boards), else every core."""
    cores = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
    capacity = {}
    for core in cores:
        value = read_text("/sys/devices/system/cpu/cpu%d/cpu_capacity" % core)
        if value and value.isdigit():
            capacity[core] = int(value)
    if capacity and len(set(capacity.values())) > 1:
        top = max(capacity.values())
        return [c for c in cores if capacity.get(c) == top]
    return cores


def temperature_c():
    value = read_text("/sys/class/thermal/thermal_zone0/temp")
    return round(int(value) / 1000, 1) if value and value.lstrip("-").isdigit() else None


def noise_controls():
    """What the board allows to keep timings steady: its governor, the big cores pinned."""
    controls = {"governor": read_text("/sys/devices/system/cpu/cpu0/cpufreq/scaling_governor"),
                "temperature_before_c": temperature_c()}
    cores = big_cores()
    if cores and hasattr(os, "sched_setaffinity"):
        try:
            os.sched_setaffinity(0, cores)
            controls["pinned_cores"] = cores
        except OSError:
            controls["pinned_cores"] = None
    return controls


LOAD_PROBE = r"""
import os, sys, time, json
def rss():
    fields = {}
    with open("/proc/self/status") as handle:
        for line in handle:
            name, _, value = line.partition(":")
            fields[name] = value.strip()
    kb = lambda name: int(fields.get(name, "0 kB").split()[0])
    return kb("VmRSS"), kb("RssAnon")
request = json.loads(sys.stdin.buffer.readline())
exec(request["source"])
add_board_site()
import numpy as np
payload = sys.stdin.buffer.read()
key = payload[:request["key_bytes"]]
model = payload[request["key_bytes"]:]
# the runtime imported first, as an app's process has it: the figures are the model's
if request["kind"] == "tflite":
    from ai_edge_litert.interpreter import Interpreter
else:
    import tensorflow
if key:
    from cryptography.hazmat.primitives.ciphers.aead import AESGCM
before_rss, before_anon = rss()
started = time.perf_counter()
if key:
    model = decrypted(model, key, request["header_bytes"])
runner = open_model(request["kind"], model, request["threads"], request)
feeds = [np.zeros(shape, dtype) for shape, dtype in request["feeds"]]
runner.set_inputs(feeds)
runner.invoke()
load_ms = (time.perf_counter() - started) * 1000
after_rss, after_anon = rss()
print(json.dumps({"load_ms": round(load_ms, 3),
                  "rss_growth_mb": round((after_rss - before_rss) / 1024, 3),
                  "anon_growth_mb": round((after_anon - before_anon) / 1024, 3)}))
"""


def load_probe(request, model, key, feeds, source, timeout):
    """Load time and memory growth of a fresh process that loads the model and runs it
    once; the model (and key) reach it over a pipe, never a file."""
    probe = dict(request, source=source, key_bytes=len(key or b""), threads=request["threads"][0],
                 feeds=[[list(f.shape), str(f.dtype)] for f in feeds])
    # an emulated board's Python is a script that starts qemu: exec of the aarch64 binary
    # itself fails under qemu-user, so the board names its own command
    python = os.environ.get("ORCHESTRATOR_BOARD_PYTHON") or sys.executable
    process = subprocess.Popen([python, "-c", LOAD_PROBE], stdin=subprocess.PIPE,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        out, err = process.communicate(json.dumps(probe).encode() + b"\n" + (key or b"")
                                       + model, timeout=timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        process.communicate()
        return {"error": "the fresh process did not load the model in %d s" % timeout}
    if process.returncode != 0:
        lines = err.decode(errors="replace").strip().splitlines()
        return {"error": "the fresh process failed: " + (lines[-1] if lines else "exit %d"
                                                         % process.returncode)}
    return json.loads(out.decode().strip().splitlines()[-1])


def measure(request, blobs, source):
    import numpy as np

    model = blobs[0]
    key = blobs[1] if request.get("encrypted") else None
    inputs_blob = blobs[-1]
    missing = missing_for(request["kind"], bool(key))
    if missing:
        return {"error": "the board lacks " + ", ".join(missing), "missing": missing}, []
    with np.load(io.BytesIO(inputs_blob)) as arrays:
        inputs = [arrays["input_%d" % i] for i in range(len(arrays.files))]
    with board_lock(request.get("lock_timeout_s", 600)) as waited:
        controls = noise_controls()
        controls["lock_wait_s"] = round(waited, 3)
        started = time.perf_counter()
        plain = decrypted(model, key, request["header_bytes"]) if key else model
        threads = {}
        outputs = []
        for index, count in enumerate(request["threads"]):
            runner = open_model(request["kind"], plain, count, request)
            size = runner.batch_size() or 1
            feeds = [x[:size] if len(x) >= size else np.repeat(x[:1], size, axis=0)
                     for x in inputs]
            threads[str(count)] = timed(runner, feeds, request["warmup"], request["runs"])
            if index == 0:
                outputs = predict(runner, [x[:request["samples"]] for x in inputs])
            del runner
        controls["temperature_after_c"] = temperature_c()
        load = load_probe(request, model, key, feeds, source, request.get("timeout_s", 600))
        seconds = time.perf_counter() - started
    buffer = io.BytesIO()
    np.savez(buffer, **{"output_%d" % i: o for i, o in enumerate(outputs)})
    return {"threads": threads, "load": load, "noise": controls,
            "seconds": round(seconds, 3)}, [buffer.getvalue()]


class board_lock:
    """The board's measurement lock (flock: released by the kernel when its holder dies)."""

    def __init__(self, timeout):
        self.timeout = timeout

    def __enter__(self):
        os.makedirs(ROOT, exist_ok=True)
        self.handle = open(os.path.join(ROOT, "lock"), "a+")
        started = time.monotonic()
        while True:
            try:
                fcntl.flock(self.handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return time.monotonic() - started
            except OSError:
                if time.monotonic() - started > self.timeout:
                    raise TimeoutError("another measurement held the board for %d s"
                                       % self.timeout) from None
                time.sleep(0.2)

    def __exit__(self, *exc):
        fcntl.flock(self.handle, fcntl.LOCK_UN)
        self.handle.close()


def sweep_stale_jobs():
    """Remove the folders of runners that died (their flock is free); how many."""
    removed = 0
    try:
        names = os.listdir(ROOT)
    except OSError:
        return 0
    for name in names:
        folder = os.path.join(ROOT, name)
        if not name.startswith("job-") or not os.path.isdir(folder):
            continue
        try:
            with open(os.path.join(folder, "alive"), "a") as handle:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            continue  # a live runner holds it
        shutil.rmtree(folder, ignore_errors=True)
        removed += 1
    return removed


def board_site():
    """Where `orchestrator device prepare` installs the runtimes on the board: per Python
    and machine (a home folder may be shared by boards of several kinds)."""
    return os.path.join(os.path.expanduser("~"), ".cache", "orchestrator-board",
                        "site-cp%d%d-%s" % (sys.version_info[:2] + (platform.machine(),)))


def add_board_site():
    site = board_site()
    if os.path.isdir(site) and site not in sys.path:
        sys.path.insert(0, site)


def main(source):
    add_board_site()
    os.makedirs(ROOT, exist_ok=True)
    removed = sweep_stale_jobs()
    job = os.path.join(ROOT, "job-%d" % os.getpid())
    os.makedirs(job, exist_ok=True)
    alive = open(os.path.join(job, "alive"), "a")
    fcntl.flock(alive, fcntl.LOCK_EX)
    # frames on the real stdout only: whatever else prints (native code too) goes to stderr
    channel = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)
    incoming = sys.stdin.buffer
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)  # the host gone: end at once
    try:
        write_message(channel, {"ready": True, "protocol": PROTOCOL, "job": job,
                                "stale_jobs_removed": removed})
        while True:
            try:
                request, blobs = read_message(incoming)
            except EOFError:
                return
            op = request.get("op")
            # a request that hangs ends the runner itself, even when the host is gone
            signal.alarm(int(request.get("timeout_s", 600)) + 5)
            try:
                if op == "describe":
                    write_message(channel, describe())
                elif op == "measure":
                    reply, out = measure(request, blobs, source)
                    write_message(channel, reply, out)
                elif op == "bye":
                    write_message(channel, {"bye": True})
                    return
                else:
                    write_message(channel, {"error": "unknown request %r" % op})
            except Exception as exc:  # noqa: BLE001  (reported to the host, which decides)
                write_message(channel, {"error": "%s: %s" % (type(exc).__name__, exc)})
            finally:
                signal.alarm(0)
    finally:
        shutil.rmtree(job, ignore_errors=True)
        alive.close()


if globals().get("BOARD_ROLE") == "runner":  # set by the bootstrap (boards/session.py)
    main(globals()["BOARD_SOURCE"])
