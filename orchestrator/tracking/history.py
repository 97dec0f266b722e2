"""A recipe's history: per target, the variant each MLflow run selected, with its size,
quality and measured latency, oldest run first; as rows (a table, JSON) and as a chart.

Read from what the tracking worker (orchestrator.tracking.worker) logs on each recipe run's parent
run, in the experiment named like the recipe: the tags `selected.<target>` ("none" when no
variant met the budgets), the metrics `<variant>.size_bytes`, `.accuracy`, `.fidelity`,
`.latency_p50_ms` (measured on the run's host) and `.est_latency_ms.<target>` (estimated
for the target's device), the param `recipe.git_commit`, and the host from the
run's report.json artifact. A run that failed, was interrupted (MLflow's status KILLED), is
still running or selected nothing stays in the history as such.

MLflow is queried through MlflowClient (common.open_client) with the project's tracking URI
only, and a local store that does not exist is never created. MLflow is imported inside
functions only, as everywhere in tracking/, the only package that imports it.
"""

from __future__ import annotations

import json
import math
import tempfile
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from orchestrator.engine.run_names import short_commit
from orchestrator.errors import OrchestratorError, OutputError
from orchestrator.formatting import MIB, SIZE_UNIT_NOTE, format_ms, format_number, format_size

if TYPE_CHECKING:
    from mlflow.entities import Run
    from mlflow.tracking import MlflowClient

CHART_FILE = "history.png"
RECIPE_COMMIT_NOTE = ("recipe commit: the commit that last changed the recipe file, not the "
                      "checkout's HEAD (-dirty: the file had uncommitted changes)")
SELECTED_TAG = "selected."
NO_VARIANT = "none"  # the tag's value when no variant met a target's budgets
MAX_TICKS = 16  # run labels on the x axis; more runs label every k-th
_PAGE = 1000


class HistoryError(OrchestratorError):
    """No history to show: tracking unreachable or failing, or no runs of the recipe yet."""


@dataclass
class Row:
    """One target of one recipe run: what it selected and that variant's figures."""

    run_id: str
    run_name: str
    start_time: str  # ISO 8601, UTC
    status: str  # MLflow's: FINISHED, FAILED, KILLED, RUNNING
    git_commit: str | None  # short, '-dirty' when the recipe had uncommitted changes
    target: str | None  # None: the run had no targets
    device: str | None
    selected: str | None  # None: nothing selected (see note)
    note: str | None  # why nothing was selected, or that the run failed
    size_bytes: int | None = None
    size_mib: float | None = None  # MiB (1,048,576 bytes), the unit of max_size_mb
    quality_metric: str = "accuracy"  # or "fidelity" (a recipe without labels)
    quality: float | None = None
    accuracy: float | None = None
    fidelity: float | None = None
    latency_p50_ms: float | None = None  # measured on `host`
    host: str | None = None
    est_latency_ms: float | None = None  # estimated for `device`

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


# --- MLflow


def open_client(tracking_uri: str, recipe_name: str, recipe_arg: str) -> MlflowClient:
    """A client of the project's tracking store (common.open_client); HistoryError (exit 2)
    when it is unreachable, or when the local store does not exist yet."""
    from orchestrator.tracking.common import open_client as open_tracking

    return open_tracking(tracking_uri, HistoryError, lambda database: no_runs(
        recipe_name, recipe_arg, f"no MLflow store at {database}"))


def no_runs(recipe_name: str, recipe_arg: str, where: str) -> HistoryError:
    from orchestrator.formatting import command_hint

    return HistoryError(f"no runs recorded for recipe {recipe_name!r} yet ({where}): run "
                        f"`{command_hint('run', recipe_arg)}` first")


def _tracking_failed(exc: Exception, tracking_uri: str) -> HistoryError:
    from orchestrator.tracking.worker import redact

    return HistoryError(redact(f"MLflow tracking at {tracking_uri!r} failed: "
                               f"{type(exc).__name__}: {exc}"), field="MLFLOW_TRACKING_URI")


def _foreign_errors() -> tuple[type[BaseException], ...]:
    """What MLflow and the libraries under it raise for a store that cannot answer."""
    from mlflow.exceptions import MlflowException

    errors: list[type[BaseException]] = [MlflowException, OSError]
    try:
        from sqlalchemy.exc import SQLAlchemyError

        errors.append(SQLAlchemyError)
    except ImportError:  # a server-only install
        pass
    return tuple(errors)


def recipe_runs(client: MlflowClient, recipe_name: str, last: int | None = None
                ) -> list[Run] | None:
    """The recipe's runs (parent runs only), oldest first; the newest `last` of them when
    given. None when the recipe has no experiment yet."""
    experiment = client.get_experiment_by_name(recipe_name)
    if experiment is None:
        return None
    # a parent run has the recipe's path as a tag; its pipelines' and trials' runs do not
    query = (f"tags.`orchestrator.recipe_name` = '{_quoted(recipe_name)}' "
             "and tags.`orchestrator.recipe` LIKE '%'")
    runs: list[Run] = []
    token = None
    while True:
        page = client.search_runs([experiment.experiment_id], query,
                                  max_results=min(last or _PAGE, _PAGE),
                                  order_by=["attributes.start_time DESC"], page_token=token)
        runs.extend(page)
        token = page.token
        if not token or (last is not None and len(runs) >= last):
            break
    runs = runs[:last] if last is not None else runs
    return sorted(runs, key=lambda run: run.info.start_time or 0)


def _quoted(text: str) -> str:
    return text.replace("\\", "\\\\").replace("'", "\\'")


def run_report(client: MlflowClient, run: Run) -> dict[str, Any] | None:
    """The run's report.json artifact (for the host a latency was measured on), or None:
    a run that wrote none, or an artifact store that cannot be read."""
    errors = _foreign_errors()
    with tempfile.TemporaryDirectory(prefix="orchestrator-history-") as tmp:
        try:
            path = client.download_artifacts(run.info.run_id, "report.json", tmp)
            report = json.loads(Path(path).read_text(encoding="utf-8"))
        except (*errors, ValueError):
            return None
    return report if isinstance(report, dict) else None


# --- rows


def host_label(host: Mapping[str, Any] | None) -> str | None:
    """'AMD EPYC, 2 cores, Linux 6.1, TF 2.21.0' from a report's host record."""
    if not host:
        return None
    parts = [str(host.get("cpu") or "unknown CPU")]
    if host.get("cores"):
        parts.append(f"{host['cores']} cores")
    if host.get("system"):
        parts.append(str(host["system"]))
    if host.get("tensorflow"):
        parts.append(f"TF {host['tensorflow']}")
    return ", ".join(parts)


def _iso(ms: int | None) -> str:
    if not ms:
        return "unknown"
    return datetime.fromtimestamp(ms / 1000, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _status_note(status: str) -> str | None:
    # KILLED: the run was interrupted (Ctrl-C, SIGTERM: the tracking worker records it so)
    return {"FAILED": "run failed", "KILLED": "interrupted",
            "RUNNING": "still running (or died without closing its run)",
            "SCHEDULED": "not started"}.get(status)


def rows_of_run(run: Run, quality_metric: str, report: Mapping[str, Any] | None = None,
                targets: Sequence[str] = ()) -> list[Row]:
    """One row per target of `run` (the targets it recorded a selection for; else those it
    was run with; else `targets`, the recipe's today). `report`: its report.json, if any."""
    tags, metrics, params = run.data.tags, run.data.metrics, run.data.params
    selection = {key.removeprefix(SELECTED_TAG): value for key, value in tags.items()
                 if key.startswith(SELECTED_TAG)}
    names = list(selection) or [t.strip() for t in params.get("targets", "").split(",")
                                if t.strip()] or list(targets)
    # the recipe file's last commit (tracking logs it); never MLflow's source commit, which
    # is the checkout's HEAD and would pass for the recipe's
    commit = params.get("recipe.git_commit")
    status = run.info.status
    report = report or {}
    rows = []
    for target in names or [None]:
        chosen = selection.get(target) if target is not None else None
        selected = None if chosen in (None, NO_VARIANT) else chosen
        note = _status_note(status)
        if target is None:
            note = note or "the run had no targets: nothing is selected"
        elif selected is None and chosen == NO_VARIANT:
            note = "; ".join(filter(None, [note, "no variant met the budgets"]))
        elif selected is None:
            note = note or "no selection recorded"
        row = Row(run_id=run.info.run_id, run_name=run.info.run_name or "",
                  start_time=_iso(run.info.start_time), status=status,
                  git_commit=None if commit in (None, "", "none") else short_commit(commit),
                  target=target, device=_device(target, report, params), selected=selected,
                  note=note, quality_metric=quality_metric)
        if selected is not None:
            _fill(row, selected, metrics, report)
        rows.append(row)
    return rows


def _device(target: str | None, report: Mapping[str, Any], params: Mapping[str, str]
            ) -> str | None:
    if target is None:
        return None
    device = ((report.get("targets") or {}).get(target) or {}).get("device")
    if device:
        return str(device)
    spec = params.get(f"target.{target}")  # "phone-2016: max_size_mb=1, ..."
    return spec.split(":")[0].strip() if spec else None


def _fill(row: Row, variant: str, metrics: Mapping[str, float],
          report: Mapping[str, Any]) -> None:
    def metric(key: str) -> float | None:
        value = metrics.get(f"{variant}.{key}")
        return None if value is None or math.isnan(value) else float(value)

    size = metric("size_bytes")
    row.size_bytes = None if size is None else int(size)
    row.size_mib = None if size is None else round(size / MIB, 6)
    row.accuracy = metric("accuracy")
    row.fidelity = metric("fidelity")
    row.quality = row.accuracy if row.quality_metric == "accuracy" else row.fidelity
    row.latency_p50_ms = metric("latency_p50_ms")
    row.est_latency_ms = metric(f"est_latency_ms.{row.target}")
    row.host = host_label(((report.get("variants") or {}).get(variant) or {}).get("host"))


def history_rows(tracking_uri: str, recipe_name: str, recipe_arg: str,
                 quality_metric: str = "accuracy", targets: Sequence[str] = (),
                 last: int | None = None) -> list[Row]:
    """Every row of the recipe's history, oldest run first. HistoryError when tracking
    cannot answer or there are no runs yet."""
    client = open_client(tracking_uri, recipe_name, recipe_arg)
    errors = _foreign_errors()
    try:
        runs = recipe_runs(client, recipe_name, last)
        if not runs:
            where = ("no experiment of that name" if runs is None else "its experiment has "
                     "no runs")
            from orchestrator.tracking.worker import redact

            raise no_runs(recipe_name, recipe_arg, f"{where} in {redact(tracking_uri)}")
        rows: list[Row] = []
        for run in runs:
            selected = any(key.startswith(SELECTED_TAG) and value != NO_VARIANT
                           for key, value in run.data.tags.items())
            report = run_report(client, run) if selected else None
            rows.extend(rows_of_run(run, quality_metric, report, targets))
    except errors as exc:
        raise _tracking_failed(exc, tracking_uri) from None
    return rows


# --- the table


def _cells(rows: Sequence[Row], hosts: Mapping[str, int]) -> list[list[str]]:
    """Timings as formatting.format_ms writes them (3 significant digits, µs below 1 ms),
    sizes in MiB (3 significant digits) beside the exact bytes."""
    return [[row.start_time, row.git_commit or "-", row.target or "-", row.selected or "-",
             format_number(row.size_bytes, ","), format_size(row.size_bytes, unit=False),
             format_number(row.quality, ".4f"), format_ms(row.latency_p50_ms),
             f"[{hosts[row.host]}]" if row.host in hosts else "-",
             format_ms(row.est_latency_ms), row.note or ""] for row in rows]


def format_table(rows: Sequence[Row], recipe_name: str) -> str:
    """The rows as a plain text table, with a footnote per measuring host and device."""
    hosts: dict[str, int] = {}
    for row in rows:
        if row.host is not None and row.host not in hosts:
            hosts[row.host] = len(hosts) + 1
    metric = rows[0].quality_metric if rows else "accuracy"
    header = ["started (UTC)", "recipe commit", "target", "selected", "size bytes", "MiB", metric,
              "p50 measured", "host", "est. device", "note"]
    body = _cells(rows, hosts)
    right = {4, 5, 6, 7, 9}
    widths = [max(len(line[i]) for line in [header, *body]) for i in range(len(header))]
    count = len({row.run_id for row in rows})
    lines = [f"{recipe_name}: the variant selected per target, {count} "
             f"run{'' if count == 1 else 's'}, oldest first"]
    for line in [header, *body]:
        cells = [cell.rjust(widths[i]) if i in right else cell.ljust(widths[i])
                 for i, cell in enumerate(line)]
        lines.append("  ".join(cells).rstrip())
    for host, key in hosts.items():
        lines.append(f"[{key}] p50 measured on: {host}")
    if any(row.latency_p50_ms is not None and row.host is None for row in rows):
        lines.append("host -: the run recorded none (older runs, or no report.json)")
    devices = {row.target: row.device for row in rows if row.target and row.device}
    if devices:
        lines.append("est. device: estimated for the target's device ("
                     + ", ".join(f"{t}: {d}" for t, d in devices.items()) + "), not measured")
    if any(row.size_bytes is not None for row in rows):
        lines.append(SIZE_UNIT_NOTE)
    if any(row.git_commit for row in rows):
        lines.append(RECIPE_COMMIT_NOTE)
    return "\n".join(lines)


# --- the chart

_COLORS = ("#4c72b0", "#dd8452", "#55a868", "#c44e52", "#8172b3", "#937860", "#da8bc3",
           "#8c8c8c", "#ccb974", "#64b5cd")
_MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*", "h", "<", ">", "p")


def _runs_of(rows: Sequence[Row]) -> list[Row]:
    """The first row of each run, in order."""
    seen: dict[str, Row] = {}
    for row in rows:
        seen.setdefault(row.run_id, row)
    return list(seen.values())


def _tick(row: Row) -> str:
    """Start time, recipe commit, and the run's number among re-runs of it (as MLflow
    names it: `digits-cnn@249b3fe #2`)."""
    stamp = row.start_time.replace("T", "\n").removesuffix("Z")
    number = row.run_name.rpartition(" #")[2] if " #" in row.run_name else ""
    number = f" #{number}" if number.isdigit() else ""
    return f"{stamp}\n@{row.git_commit}{number}" if row.git_commit else stamp + number


def chart(rows: Sequence[Row], recipe_name: str) -> bytes:
    """history.png: chart_figure as PNG bytes."""
    import io

    from orchestrator.results.plots import pyplot

    figure = chart_figure(rows, recipe_name)
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=100)
    pyplot().close(figure)
    return buffer.getvalue()


def chart_figure(rows: Sequence[Row], recipe_name: str) -> Any:
    """Three stacked panels sharing the runs' axis (oldest left): size, accuracy (or
    fidelity) and latency of the variant each target selected; one line per target, one
    marker shape per variant, each change of variant named where it happens; the legend
    below them (the whole figure is the picture: nothing is cut at its edges)."""
    from orchestrator.results.plots import pyplot

    plt = pyplot()
    from matplotlib.lines import Line2D
    from matplotlib.transforms import blended_transform_factory

    runs = _runs_of(rows)
    index = {run.run_id: i for i, run in enumerate(runs)}
    targets = list(dict.fromkeys(row.target for row in rows if row.target is not None))
    variants = list(dict.fromkeys(row.selected for row in rows if row.selected))
    color = {t: _COLORS[i % len(_COLORS)] for i, t in enumerate(targets)}
    marker = {v: _MARKERS[i % len(_MARKERS)] for i, v in enumerate(variants)}
    # targets selecting the same variant would hide each other's line: a small offset each
    offset = {t: (i - (len(targets) - 1) / 2) * min(0.08, 0.3 / max(1, len(targets)))
              for i, t in enumerate(targets)}
    metric = rows[0].quality_metric if rows else "accuracy"
    width = min(18.0, max(8.0, 3.5 + 0.75 * len(runs)))
    figure, axes = plt.subplots(3, 1, figsize=(width, 9.5), sharex=True, layout="constrained")
    size_ax, quality_ax, latency_ax = axes
    panels = [(size_ax, lambda r: r.size_mib), (quality_ax, lambda r: r.quality),
              (latency_ax, lambda r: r.latency_p50_ms)]
    for target in targets:
        mine = {index[r.run_id]: r for r in rows if r.target == target}
        xs = [i + offset[target] for i in range(len(runs))]
        for ax, value in panels:
            ys = [_nan(value(mine[i])) if i in mine else math.nan for i in range(len(runs))]
            ax.plot(xs, ys, color=color[target], linewidth=1.6, zorder=2)
            for i, row in mine.items():
                if row.selected is not None and not math.isnan(_nan(value(row))):
                    ax.scatter([xs[i]], [value(row)], marker=marker[row.selected], s=55,
                               color=color[target], edgecolors="black", linewidths=0.6,
                               zorder=3)
        estimates = [_nan(mine[i].est_latency_ms) if i in mine else math.nan
                     for i in range(len(runs))]
        latency_ax.plot(xs, estimates, color=color[target], linestyle="--", linewidth=1.2,
                        marker="o", markerfacecolor="white", markersize=5, zorder=2)
        _name_changes(axes, mine, xs, color[target], targets.index(target))
    _mark_gaps(axes, rows, index, blended_transform_factory, color, offset)
    size_ax.set_ylabel("shipped size, MiB")
    quality_ax.set_ylabel(f"{metric} (measured,\nevaluation data)" if metric == "accuracy"
                          else "fidelity (top-1 agreement\nwith the source model)")
    hosts = list(dict.fromkeys(r.host for r in rows if r.host))
    latency_ax.set_ylabel("latency")
    measured_on = ("; ".join(hosts[:2]) + (f"; +{len(hosts) - 2} more" if len(hosts) > 2
                                           else "")) if hosts else "not recorded"
    latency_ax.set_title("solid: p50 measured on the run's host · dashed: estimated for the "
                         f"target's device\nmeasured on: {measured_on}",
                         fontsize=8, loc="left")
    size_ax.set_title("the variant each target selected, per run", fontsize=9, loc="left")
    quality_ax.set_title(f"its {metric}", fontsize=9, loc="left")
    for ax in axes:
        ax.grid(True, alpha=0.3)
        ax.ticklabel_format(axis="y", useOffset=False, style="plain")
        ax.tick_params(labelsize=8)
        ax.margins(y=0.25)
    _latency_scale(latency_ax, rows)  # after: a log axis has no plain-number format
    for ax in (size_ax, latency_ax):  # sizes and timings: no room below zero
        bottom, top = ax.get_ylim()
        if ax.get_yscale() == "linear" and bottom < 0:
            ax.set_ylim(0.0, top)
    _fraction_limits(quality_ax, [r.quality for r in rows])
    ticks = list(range(0, len(runs), max(1, math.ceil(len(runs) / MAX_TICKS))))
    latency_ax.set_xticks(ticks, [_tick(runs[i]) for i in ticks], fontsize=7)
    latency_ax.set_xlim(-0.6, len(runs) - 0.4)
    latency_ax.set_xlabel("run start, UTC, and @recipe commit (the commit that last changed "
                          "the recipe file); oldest to newest")
    handles = [Line2D([], [], color=color[t], linewidth=2,
                      label=f"{t}" + (f" ({d})" if (d := _device_of(rows, t)) else ""))
               for t in targets]
    handles += [Line2D([], [], linestyle="", marker=marker[v], color="grey",
                       markeredgecolor="black", markersize=7, label=v) for v in variants]
    handles += [Line2D([], [], color="black", label="measured (host p50)"),
                Line2D([], [], color="black", linestyle="--", marker="o",
                       markerfacecolor="white", label="estimated (device)"),
                Line2D([], [], linestyle="", marker="x", color="black",
                       label="nothing selected")]
    figure.legend(handles=handles, loc="outside lower center", fontsize=8,
                  ncol=min(len(handles), 4), title="target (device) · variant",
                  title_fontsize=8)
    figure.suptitle(f"{recipe_name}: the selected variant across {len(runs)} "
                    f"run{'' if len(runs) == 1 else 's'}",
                    fontsize=12)
    return figure


def _nan(value: float | None) -> float:
    return math.nan if value is None else float(value)


def _device_of(rows: Iterable[Row], target: str) -> str | None:
    return next((r.device for r in reversed(list(rows)) if r.target == target and r.device),
                None)


def _name_changes(axes: Sequence[Any], mine: Mapping[int, Row], xs: Sequence[float],
                  color: str, slot: int) -> None:
    """The variant's name (on the size panel) where a target's selection starts or
    changes; a change also as a dotted line across the panels."""
    ax = axes[0]
    previous: str | None = None
    for i in sorted(mine):
        row = mine[i]
        if row.selected is None or row.size_mib is None:
            continue
        if row.selected != previous:
            arrow = "" if previous is None else f"{previous} → "
            ax.annotate(f"{arrow}{row.selected}", (xs[i], row.size_mib), fontsize=7.5,
                        color=color, xytext=(6, 8 + 11 * slot), textcoords="offset points",
                        bbox={"boxstyle": "round,pad=0.15", "fc": "white", "ec": color,
                              "lw": 0.6, "alpha": 0.9}, zorder=5)
            if previous is not None:
                for axis in axes:
                    axis.axvline(xs[i], color=color, linestyle=":", linewidth=1, alpha=0.7)
        previous = row.selected


def _mark_gaps(axes: Sequence[Any], rows: Sequence[Row], index: Mapping[str, int],
               blended: Any, color: Mapping[str, str], offset: Mapping[str, float]) -> None:
    """Failed runs shaded and named; a target that selected nothing gets an x per panel."""
    failed: dict[int, str] = {}
    slots: dict[int, int] = {}
    gap: dict[str | None, bool] = {}  # per target: its previous run selected nothing
    for row in rows:
        i = index[row.run_id]
        if row.status not in ("FINISHED",):
            failed[i] = "INTERRUPTED" if row.status == "KILLED" else row.status
        if row.selected is None:
            slot = slots[i] = slots.get(i, -1) + 1
            # named where a gap starts; a failed run says so once, above
            if row.status == "FINISHED" and not gap.get(row.target):
                axes[0].annotate(f"{row.target or 'run'}: none selected", (i, 0.04),
                                 xycoords=blended(axes[0].transData, axes[0].transAxes),
                                 xytext=(7, -3 + 10 * slot), textcoords="offset points",
                                 fontsize=7, color=color.get(row.target or "", "black"))
            for ax in axes:
                ax.scatter([i + offset.get(row.target or "", 0.0)], [0.04], marker="x", s=45,
                           color=color.get(row.target or "", "black"),
                           transform=blended(ax.transData, ax.transAxes), zorder=4,
                           clip_on=False)
        gap[row.target] = row.selected is None and row.status == "FINISHED"
    for i, status in failed.items():
        for ax in axes:
            ax.axvspan(i - 0.4, i + 0.4, color="grey", alpha=0.15, zorder=0)
        axes[0].text(i, 0.97, status, ha="center", va="top", fontsize=7, color="dimgrey",
                     transform=blended(axes[0].transData, axes[0].transAxes))


def _fraction_limits(ax: Any, values: Iterable[float | None]) -> None:
    """Room around the values, but no axis above 1 for a fraction that cannot exceed it."""
    known = [v for v in values if v is not None]
    if not known:
        return
    low, high = min(known), max(known)
    span = max(high - low, 0.02)
    ax.set_ylim(max(0.0, low - 0.5 * span), min(high + 0.5 * span, 1.0 + 0.08 * span))


def _latency_scale(ax: Any, rows: Sequence[Row]) -> None:
    """A log scale when measured and estimated latencies are orders of magnitude apart;
    ticks read as the table does (format_ms: 20.0 µs, 1.50 ms)."""
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    values = [v for r in rows for v in (r.latency_p50_ms, r.est_latency_ms)
              if v is not None and v > 0]
    if values and max(values) / min(values) > 30:
        ax.set_yscale("log")
        ax.set_ylabel("latency (log scale)")
        ax.yaxis.set_major_locator(LogLocator(subs=(1.0, 2.0, 5.0)))
        ax.yaxis.set_minor_formatter(NullFormatter())
    ax.yaxis.set_major_formatter(FuncFormatter(lambda value, _: format_ms(value)
                                               if value > 0 else "0"))


def write_chart(png: bytes, folder: Path) -> Path:
    """`folder/history.png`, written whole or not at all (a temporary file, then a rename),
    with the mode a plain open() gives it. OutputError (exit 2) when the folder cannot be
    written."""
    from orchestrator.paths import atomic_write_bytes, describe_os_error

    target = folder / CHART_FILE
    try:
        atomic_write_bytes(target, png, plain_mode=True)
    except OSError as exc:
        raise OutputError(f"cannot write {target}: {describe_os_error(exc)}",
                          file=str(folder)) from exc
    return target
