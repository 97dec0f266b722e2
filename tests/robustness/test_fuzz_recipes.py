"""Hypothesis fuzzing of the recipe loader and `--set` (issue 9).

Random YAML text, random mutations of the valid recipes (recipes/*.yaml: types, keys,
nesting, aliases, names, paths, unicode) and random `--set` overrides go through
`load_recipe` in this process (milliseconds each). The property: it raises only
OrchestratorError with exit code 2, naming the recipe file (or the `--set` at fault), or it
succeeds, and then every recipe, pipeline and target name passes `limits.name_problem`,
resolves under the output folder, and the counts are within the limits. A hang detector
(SIGALRM) turns a loader that does not return into a failure instead of a stalled suite.

A small sample of mutated recipes also goes through the whole CLI (`orchestrator run`, in
process): exit 0, 1, 2 or 3, never 70, and on exit 2 no output and no new cache entry.

Every example's outcome is counted; the session prints the totals at its end.
"""

from __future__ import annotations

import copy
import json
import math
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, note, settings
from hypothesis import strategies as st
from support.project_env import in_project
from support.robust_helpers import (
    DIGITS,
    FUZZ_FAILURES,
    FUZZ_OUTCOMES,
    RECIPES,
    cache_entries,
    cli_in_process,
)

from orchestrator import limits
from orchestrator.errors import OrchestratorError
from orchestrator.recipe.loading import load_recipe

# Examples per test: 1,300 through the loader in all, 6 through the whole CLI.
N_TEXT, N_SOUP, N_STRUCTURED, N_MUTATIONS, N_SET, N_CLI = 200, 250, 150, 450, 250, 6
LOADER_HANG_S = 20  # a hang detector, not a timing assertion (a load takes milliseconds)

FUZZ = settings(deadline=None, derandomize=True, database=None, print_blob=True,
                suppress_health_check=list(HealthCheck))


# ---------------------------------------------------------------- the property


class LoaderHung(BaseException):
    """Raised by the hang detector inside a load that did not return."""


def _on_alarm(signum: int, frame: object) -> None:
    raise LoaderHung()


def _record(kind: str, outcome: str) -> None:
    FUZZ_OUTCOMES[f"{kind}: {outcome}"] += 1


def _fail(kind: str, outcome: str, detail: str) -> None:
    _record(kind, outcome)
    FUZZ_FAILURES.append(f"{kind}: {outcome}: {detail[:300]}")
    raise AssertionError(f"{outcome}: {detail}")


def check_loader(path: Path, overrides: list[str], kind: str) -> None:
    """Load; assert the property; count the outcome."""
    previous = signal.signal(signal.SIGALRM, _on_alarm)
    signal.setitimer(signal.ITIMER_REAL, LOADER_HANG_S)
    try:
        try:
            loaded = load_recipe(path, overrides)
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
    except OrchestratorError as exc:
        message = str(exc)
        if exc.exit_code != 2:
            _fail(kind, f"exit {exc.exit_code}", message)
        if str(path) not in message and not (overrides and "--set" in message):
            _fail(kind, "exit 2 not naming the recipe", message)
        if "Traceback" in message:
            _fail(kind, "exit 2 with a traceback", message)
        _record(kind, "exit 2")
        return
    except LoaderHung:
        _fail(kind, "hang", f"load_recipe did not return within {LOADER_HANG_S} s")
    except BaseException as exc:  # noqa: BLE001  (RecursionError, TypeError, MemoryError...)
        _fail(kind, f"crash {type(exc).__name__} (exit 70)", repr(exc))
    finally:
        signal.signal(signal.SIGALRM, previous)
    check_loaded(loaded, path, kind)
    _record(kind, "loaded (exit 0)")


def check_loaded(loaded: Any, path: Path, kind: str) -> None:
    recipe = loaded.recipe
    names = [("recipe", recipe.name), *(("pipeline", p) for p in recipe.pipelines),
             *(("target", t.name) for t in recipe.targets)]
    out = (path.parent / "out-of-this-example").resolve()
    for role, name in names:
        problem = limits.name_problem(name)
        if problem:
            _fail(kind, f"unsafe {role} name accepted", f"{name!r}: {problem}")
        if not (out / name).resolve().is_relative_to(out) or (out / name).resolve() == out:
            _fail(kind, f"{role} name escapes the output folder", repr(name))
    default_out = (path.parent / "out").resolve()
    if not (default_out / recipe.name).resolve().is_relative_to(default_out):
        _fail(kind, "recipe name escapes out/", repr(recipe.name))
    if len(recipe.pipelines) > limits.MAX_PIPELINES:
        _fail(kind, "too many pipelines accepted", str(len(recipe.pipelines)))
    if len(recipe.targets) > limits.MAX_TARGETS:
        _fail(kind, "too many targets accepted", str(len(recipe.targets)))
    for name, stages in loaded.stages.items():
        # the limit is on the stages a recipe lists, not those added by default
        listed = len(stages) - len(loaded.added.get(name, []))
        if listed > limits.MAX_STAGES_PER_PIPELINE:
            _fail(kind, "too many stages accepted", f"{name}: {listed}")
        if len(loaded.added.get(name, [])) > 1:
            _fail(kind, "more than one stage added by default", name)


@pytest.fixture(scope="module")
def fuzz_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("fuzz")


def write(folder: Path, text: str | bytes, name: str = "recipe.yaml") -> Path:
    path = folder / name
    if isinstance(text, str):
        text = text.encode("utf-8", "surrogatepass")
    path.write_bytes(text)
    return path


# ---------------------------------------------------------------- building blocks


ODD_NAMES = ["../escaped", "..", ".", "/", "/abs/path", "a/b", "a\\b", "..\\x", "C:", "C:\\x",
             "\\\\server\\share", "a\x00b", "\x00", "a\x07b", "a\tb", "a\nb", "a\rb", "\x1b[2J",
             "x" * 300, "x" * (limits.MAX_NAME_LENGTH + 1), "", " ", "-rf", ".hidden", "~",
             "名前", "a\u202eb", "\ufeffbom", "e\u0301", "CON", "nul", "a:b", "a*b", "a?b",
             "fp32/../../x", "%2e%2e", "$HOME", "`id`", "a;b", "a b", "'quoted'"]
ODD_PATHS = ["", ".", "..", "/", "~", "~root", "/dev/null", "/etc/passwd", "/proc/self/status",
             "/tmp", "C:\\models\\m.pb", "\\\\server\\share\\m.pb", "file:///etc/passwd",
             "http://127.0.0.1:9/m.pb", "a\x00b", "x" * 5000, "/" + "a/" * 2000,
             "名前/モデル.pb", "../" * 30 + "etc/passwd", "nonexistent_module_xyz:fn",
             "json:loads", "saved_model", "*.npz", "$HOME/x", "\n", " "]
KNOWN_KEYS = ["version", "name", "model", "path", "format", "inputs", "outputs", "data",
              "representative", "evaluation", "source", "array", "samples", "labels",
              "targets", "device", "budgets", "max_size_mb", "max_accuracy_drop",
              "max_latency_ms", "pipelines", "from", "stages", "tune", "guard", "log_file",
              "min_percentile", "max_percentile", "dtype", "shape"]
STAGE_NAMES = ["freeze", "strip", "fold", "benchmark", "evaluate", "quantize_weights",
               "quantize_nodes", "log_ranges", "freeze_ranges", "round_weights",
               "compact_names", "transform", "sort_by_execution_order", "summarize", "nope"]

scalars = st.one_of(
    st.none(), st.booleans(), st.integers(), st.integers(min_value=-10, max_value=300),
    st.floats(allow_nan=True, allow_infinity=True), st.sampled_from([math.nan, math.inf, 1e308]),
    st.text(max_size=20), st.sampled_from(ODD_NAMES), st.sampled_from(ODD_PATHS),
    st.sampled_from(STAGE_NAMES), st.sampled_from(KNOWN_KEYS),
    st.integers(min_value=10**20, max_value=10**30))
values = st.recursive(
    scalars, lambda inner: st.one_of(
        st.lists(inner, max_size=5),
        st.dictionaries(st.one_of(st.sampled_from(KNOWN_KEYS), st.text(max_size=10)),
                        inner, max_size=5)),
    max_leaves=12)


def deep(depth: int, kind: str) -> str:
    return "[" * depth + "]" * depth if kind == "list" else "{a: " * depth + "1" + "}" * depth


def mini_bomb(levels: int, fan_out: int) -> str:
    """Nested aliases expanding to fan_out ** levels scalars, as one flow sequence."""
    parts = ["&b0 [lol]"]
    for level in range(1, levels + 1):
        parts.append(f"&b{level} [" + ", ".join([f"*b{level - 1}"] * fan_out) + "]")
    return "[" + ", ".join(parts) + "]"


raw_values = st.one_of(
    st.builds(deep, st.sampled_from([limits.MAX_NESTING_DEPTH - 2, limits.MAX_NESTING_DEPTH,
                                     limits.MAX_NESTING_DEPTH + 1, 200, 5000]),
              st.sampled_from(["list", "map"])),
    st.builds(mini_bomb, st.integers(1, 5), st.integers(2, 10)),
    st.sampled_from(["[a, b]", "{a: 1}", "!!binary aGVsbG8=", "!!python/object/apply:os.system "
                     "['true']", "!!set {a, b}", "!!timestamp 2001-12-14", "!!float nan",
                     "*undefined_alias", "&anchor_only x", "'\\x00'", '"\\x00\\u202e"',
                     "|\n  text", ">-", "? complex", "- - -", "{{{", "]]]", "@reserved",
                     "`reserved", "%TAG", "'unterminated", '"bad \\q escape"']))


class Raw(str):
    """A value written into the YAML text as it is (deep nesting, aliases, tags)."""


def dump(data: Any) -> str:
    """YAML text of `data`; Raw values are spliced in, and objects shared between two
    places become anchors and aliases."""
    raws: list[str] = []
    seen: dict[int, Any] = {}  # keeps shared objects shared (anchors and aliases)

    def mark(node: Any) -> Any:
        if isinstance(node, Raw):
            raws.append(str(node))
            return f"RAWTOKEN{len(raws) - 1}X"
        if id(node) in seen:
            return seen[id(node)]
        if isinstance(node, dict):
            result: Any = {}
            seen[id(node)] = result
            for k, v in node.items():
                result[mark(k) if isinstance(k, Raw) else k] = mark(v)
            return result
        if isinstance(node, list):
            result = []
            seen[id(node)] = result
            result.extend(mark(v) for v in node)
            return result
        return node

    marked = mark(data)
    try:
        text = yaml.safe_dump(marked, sort_keys=False, allow_unicode=True, width=10**6)
    except (yaml.YAMLError, RecursionError, ValueError):
        text = json.dumps(marked, default=str)
    for index, raw in enumerate(raws):
        text = text.replace(f"RAWTOKEN{index}X", raw.replace("\n", " "))
    return text


def base_recipes() -> dict[str, dict[str, Any]]:
    """recipes/*.yaml with absolute paths, so that the originals load from any folder."""
    found = {}
    for path in sorted(RECIPES.glob("*.yaml")):
        data = yaml.safe_load(path.read_text())
        model = data.get("model", {})
        if isinstance(model.get("path"), str):
            model["path"] = str((path.parent / model["path"]).resolve())
        for source in (data.get("data") or {}).values():
            if isinstance(source, dict) and isinstance(source.get("source"), str) \
                    and ":" not in source["source"]:
                source["source"] = str((path.parent / source["source"]).resolve())
        found[path.name] = data
    return found


BASES = base_recipes()
# For the whole-CLI sample: recipes/digits.yaml cut to an fp32 pipeline of two stages, a
# transform and a measure (a run of the full recipe takes 10-20 s on a 2-core machine; this
# one a few).
SMALL = copy.deepcopy(BASES["digits.yaml"])
SMALL["pipelines"] = {"fp32": {"stages": ["freeze", "evaluate"]}}
del SMALL["data"]["representative"]
SMALL_BASES = {"digits.yaml (fp32 only)": SMALL}


def paths_in(node: Any, prefix: tuple = (), above: frozenset[int] = frozenset()
             ) -> Iterator[tuple]:
    """Every path into `node`; a container inside itself (a `share` mutation can make a
    cycle) is not entered again, which would recurse without end."""
    yield prefix
    if id(node) in above:
        return
    inside = above | {id(node)}
    if isinstance(node, dict):
        for key, value in node.items():
            yield from paths_in(value, (*prefix, key), inside)
    elif isinstance(node, list):
        for index, value in enumerate(node):
            yield from paths_in(value, (*prefix, index), inside)


def get(node: Any, path: tuple) -> Any:
    for part in path:
        node = node[part]
    return node


@st.composite
def mutated(draw: st.DrawFn, max_mutations: int = 5,
            bases: dict[str, dict[str, Any]] = BASES) -> tuple[str, list[str]]:
    """A recipe from `bases` (recipes/*.yaml) with 1..max_mutations random changes: its
    YAML text and what was done (for the failure report)."""
    base = draw(st.sampled_from(sorted(bases)))
    data = copy.deepcopy(bases[base])
    done = [base]
    for _ in range(draw(st.integers(1, max_mutations))):
        all_paths = list(paths_in(data))
        path = draw(st.sampled_from(all_paths))
        parent_path, key = (path[:-1], path[-1]) if path else ((), None)
        parent = get(data, parent_path) if path else None
        op = draw(st.sampled_from(["delete", "replace", "raw", "add", "rename", "name",
                                   "odd_path", "retype", "share", "stages"]))
        if op == "delete" and parent is not None:
            del parent[key]
        elif op == "replace" and parent is not None:
            parent[key] = draw(values)
        elif op == "raw" and parent is not None:
            parent[key] = Raw(draw(raw_values))
        elif op == "add":
            target = get(data, path)
            if isinstance(target, dict):
                new_key = draw(st.one_of(st.sampled_from(KNOWN_KEYS), st.text(max_size=12),
                                         st.sampled_from(ODD_NAMES),
                                         st.builds(Raw, st.sampled_from(["[a, b]", "{a: 1}",
                                                                          "[[x]]"]))))
                target[new_key] = draw(values)
            elif isinstance(target, list):
                target.append(draw(values))
        elif op == "rename" and isinstance(parent, dict):
            new_key = draw(st.one_of(st.sampled_from(ODD_NAMES), st.text(max_size=12),
                                     st.sampled_from(KNOWN_KEYS)))
            parent[new_key] = parent.pop(key)
        elif op == "name":
            odd = draw(st.one_of(st.sampled_from(ODD_NAMES), st.text(max_size=80)))
            where = draw(st.sampled_from(["recipe", "pipeline", "target", "from"]))
            if where == "recipe":
                data["name"] = odd
            elif where == "pipeline" and isinstance(data.get("pipelines"), dict) \
                    and data["pipelines"]:
                old = draw(st.sampled_from(sorted(map(str, data["pipelines"]))))
                if old in data["pipelines"]:
                    data["pipelines"][odd] = data["pipelines"].pop(old)
                    for pipeline in data["pipelines"].values():  # keep from: wiring
                        if isinstance(pipeline, dict) and pipeline.get("from") == old:
                            pipeline["from"] = odd
            elif where == "target" and isinstance(data.get("targets"), list) \
                    and data["targets"] and isinstance(data["targets"][0], dict):
                data["targets"][0]["name"] = odd
            elif where == "from" and isinstance(data.get("pipelines"), dict):
                for pipeline in data["pipelines"].values():
                    if isinstance(pipeline, dict):
                        pipeline["from"] = odd
                        break
            done.append(f"name {where} = {odd!r}")
            continue
        elif op == "odd_path":
            odd = draw(st.one_of(st.sampled_from(ODD_PATHS), st.text(max_size=40)))
            where = draw(st.sampled_from(["model", "representative", "evaluation", "log"]))
            if where == "model" and isinstance(data.get("model"), dict):
                data["model"]["path"] = odd
            elif where in ("representative", "evaluation") and isinstance(
                    data.get("data"), dict) and isinstance(data["data"].get(where), dict):
                data["data"][where]["source"] = odd
            elif where == "log" and isinstance(data.get("pipelines"), dict):
                data["pipelines"]["logged"] = {"stages": ["freeze", "strip", "fold",
                                                          "quantize_nodes",
                                                          {"freeze_ranges": {"log_file": odd}}]}
            done.append(f"path {where} = {odd!r}")
            continue
        elif op == "retype" and parent is not None:
            value = parent[key]
            if isinstance(value, dict):
                parent[key] = list(value.values())
            elif isinstance(value, list):
                parent[key] = {str(i): v for i, v in enumerate(value)}
            else:
                parent[key] = draw(st.sampled_from([[value], {"value": value}, str(value),
                                                    None, 0, True]))
        elif op == "share" and parent is not None:
            other = draw(st.sampled_from(all_paths))
            if other and other[:len(path)] != path and path[:len(other)] != other:
                parent[key] = get(data, other)  # dumped as an anchor and an alias
        elif op == "stages" and isinstance(data.get("pipelines"), dict) and data["pipelines"]:
            name = draw(st.sampled_from(sorted(map(str, data["pipelines"]))))
            if isinstance(data["pipelines"].get(name), dict):
                count = draw(st.sampled_from([0, 1, limits.MAX_STAGES_PER_PIPELINE,
                                              limits.MAX_STAGES_PER_PIPELINE + 1, 5000]))
                data["pipelines"][name]["stages"] = draw(st.lists(
                    st.sampled_from(STAGE_NAMES), min_size=count, max_size=count)) \
                    if count < 50 else ["freeze"] + ["strip"] * (count - 1)
        done.append(f"{op} at {'.'.join(map(str, path)) or '<top>'}")
    return dump(data), done


soup_tokens = st.sampled_from([
    "version: 1\n", "name: x\n", "model:\n", f"  path: {DIGITS / 'saved_model'}\n",
    "pipelines:\n", "  fp32:\n", "    stages: [freeze]\n", "targets:\n", "  - name: t\n",
    "    device: phone-2016\n", "- ", ": ", "{", "}", "[", "]", ", ", "&a ", "*a", "&b ", "*b",
    "!!python/object/apply:os.system ['true'] ", "!!binary ", "!!str ", "!custom ", "? ",
    "|\n", ">\n", "'", '"', "# c\n", "%YAML 1.1\n", "---\n", "...\n", "\t", "  ", "\n", "~",
    "null", ".nan", "1e999", "0x1F", "0o17", "<<: *a\n", "\x00", "\ufeff", "é", "\u202e",
    "\\", "\r\n", "\x85", "\u2028", "-1", "true", "yes", "no", "@", "`", "%", "..", "/"])


# ---------------------------------------------------------------- the fuzz tests


@settings(FUZZ, max_examples=N_TEXT)
@given(text=st.text(max_size=400) | st.binary(max_size=400))
def test_random_text(text: str | bytes, fuzz_dir: Path) -> None:
    check_loader(write(fuzz_dir, text), [], "random text")


@settings(FUZZ, max_examples=N_SOUP)
@given(tokens=st.lists(soup_tokens, max_size=60))
def test_yaml_token_soup(tokens: list[str], fuzz_dir: Path) -> None:
    text = "".join(tokens)
    note(repr(text))
    check_loader(write(fuzz_dir, text), [], "YAML token soup")


@settings(FUZZ, max_examples=N_STRUCTURED)
@given(data=st.dictionaries(st.one_of(st.sampled_from(KNOWN_KEYS), st.text(max_size=10)),
                            values, max_size=8))
def test_random_structures(data: dict, fuzz_dir: Path) -> None:
    text = dump(data)
    note(text)
    check_loader(write(fuzz_dir, text), [], "random YAML structure")


@settings(FUZZ, max_examples=N_MUTATIONS)
@given(case=mutated())
def test_mutated_recipes(case: tuple[str, list[str]], fuzz_dir: Path) -> None:
    text, done = case
    note(f"mutations: {done}\n{text[:3000]}")
    check_loader(write(fuzz_dir, text), [], "mutated recipe")


set_keys = st.one_of(
    st.sampled_from(["name", "version", "model.path", "model.format", "model.inputs",
                     "model.inputs.0.shape", "model.inputs.0.shape.0", "model.outputs",
                     "data.representative.samples", "data.evaluation.source",
                     "targets.0.name", "targets.0.device", "targets.0.budgets.max_size_mb",
                     "pipelines.fp32.stages", "pipelines.fp32.stages.0", "pipelines.int8.from",
                     "pipelines.int8.stages.1.quantize_nodes.guard", "pipelines", "targets",
                     "pipelines.new.stages", "a..b", ".", "", "0", "name.x", "pipelines.fp32",
                     "targets.99999.name", "pipelines.fp32.stages.-1",
                     "tags." + ".".join(["a"] * 3000)]),
    st.text(max_size=30))
GOOD_SETS = ["name=renamed", "name=v1.2-x_y", "targets.0.device=raspberry-pi-3",
             "model.format=auto", "targets.0.budgets.max_size_mb=2.5",
             "pipelines.fp32.stages=[freeze, strip]", "version=1"]
set_values = st.one_of(
    st.text(max_size=40), st.sampled_from(ODD_NAMES), st.sampled_from(ODD_PATHS), raw_values,
    st.builds(lambda v: json.dumps(v, default=str), values),
    st.builds(lambda tokens: "".join(tokens), st.lists(soup_tokens, max_size=20)))


@settings(FUZZ, max_examples=N_SET)
@given(base=st.sampled_from(sorted(BASES)),
       overrides=st.lists(st.one_of(
           st.builds(lambda k, v: f"{k}={v}", set_keys, set_values),
           st.sampled_from(GOOD_SETS),
           st.text(max_size=30)), min_size=1, max_size=4))
def test_set_overrides(base: str, overrides: list[str], fuzz_dir: Path) -> None:
    if any("\x00" in o for o in overrides):  # argv cannot hold NUL: the CLI never sees it
        overrides = [o.replace("\x00", "") for o in overrides]
    path = write(fuzz_dir, dump(BASES[base]), name=f"set-{base}")
    check_loader(path, overrides, "--set override")


# ---------------------------------------------------------------- the whole CLI on a sample


@settings(FUZZ, max_examples=N_CLI)
@given(case=mutated(max_mutations=1, bases=SMALL_BASES))
def test_cli_on_mutated_recipes(case: tuple[str, list[str]],
                                tmp_path_factory: pytest.TempPathFactory,
                                cli_workspace: Path, prefect_server: None,
                                capsys: pytest.CaptureFixture[str]) -> None:
    text, done = case
    note(f"mutations: {done}\n{text[:3000]}")
    folder = tmp_path_factory.mktemp("cli-example")
    path = write(folder, text)
    out = folder / "out"
    # first the loader: an unsafe name it let through must not be run (it could write
    # anywhere); the loader tests report it
    try:
        loaded = load_recipe(path)
        check_loaded(loaded, path, "whole CLI (pre-check)")
    except OrchestratorError:
        pass
    before = cache_entries(cli_workspace / ".orchestrator")
    code, _, err = cli_in_process(["run", path, "-o", out], capsys)
    _record("whole CLI", f"exit {code}")
    note(err[-3000:])
    assert code in (0, 1, 2, 3), f"exit {code}:\n{err[-3000:]}"
    assert "Traceback" not in err
    if code == 2:
        assert str(path) in err or path.name in err, err[-2000:]
        assert not out.exists(), f"exit 2 but {out} was written"
        assert cache_entries(cli_workspace / ".orchestrator") == before, "new cache entries"


@pytest.fixture(scope="module")
def cli_workspace(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """One store and MLflow database for the CLI sample (a successful example's entries
    are reused by the next)."""

    folder = tmp_path_factory.mktemp("cli-workspace")
    (folder / "mlruns").mkdir()
    env = {"ORCHESTRATOR_HOME": str(folder / ".orchestrator"),
           "MLFLOW_TRACKING_URI": f"sqlite:///{folder / 'mlruns' / 'mlflow.db'}"}
    with in_project(folder, env):
        yield folder
