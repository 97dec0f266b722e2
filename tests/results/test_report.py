"""Budgets and selection: readable violations; lowest estimated latency, then size."""

from __future__ import annotations

from orchestrator.measure.budgets import MB, check_budgets
from orchestrator.results.report import RAM_HEAP, select, selection_reasons
from orchestrator.spec.devices import resolve_device
from orchestrator.spec.models import Budgets


def variant(size: int, est: float | None, ok: bool = True, p50: float | None = None,
            cv: float = 0.0, kind: str = "graphdef", host_cv: float | None = None,
            board_cv: float | None = None) -> dict:
    violations = [] if ok else [f"size {size} too large"]
    board = {} if board_cv is None else {  # `est` measured on the target's board
        "latency_ms": est, "latency_basis": "measured on t's board",
        "measured": {"measured": True, "latency_ms": {"p50": est, "cv": board_cv}}}
    return {"size_bytes": size, "kind": kind,
            "targets": {"t": {"budgets_ok": ok, "est_latency_ms": est,
                              # an estimate whose runtime overhead is most of it
                              **({"estimate": {"host_cv": host_cv, "compute_ms": est / 4,
                                               "overhead_ms": est * 3 / 4}}
                                 if host_cv and est else {}),
                              **board, "violations": violations}},
            **({"latency_ms": {"p50": p50, "cv": cv}} if p50 is not None else {})}


def test_select_prefers_latency_then_size_among_those_within_budgets() -> None:
    variants = {"fp32": variant(1000, 5.0), "int8": variant(300, 2.0),
                "int8b": variant(200, 2.0), "fast_but_bad": variant(100, 0.5, ok=False)}
    assert select(variants, ["t"]) == {"t": "int8b"}
    assert select({"a": variant(10, 1.0, ok=False)}, ["t"]) == {"t": None}


def test_selection_reasons_say_why_each_variant_was_or_was_not_chosen() -> None:
    variants = {"fp32": variant(1000, 5.0), "int8": variant(3072, 2.0),
                "int8b": variant(2048, 2.0), "fast_but_bad": variant(100, 0.5, ok=False)}
    why = selection_reasons(variants, select(variants, ["t"]))["t"]
    assert why["int8b"].startswith("selected: meets every budget; lowest estimated latency "
                                   "(2.00 ms est.)")
    assert why["fp32"] == ("meets every budget, but fp32's estimated latency 5.00 ms > "
                           "int8b's 2.00 ms")
    assert why["int8"] == ("meets every budget, a tie with int8b (estimated latency 2.00 ms vs "
                           "2.00 ms), but larger (0.00293 MiB vs 0.00195 MiB)")
    assert why["fast_but_bad"] == "breaks a budget: size 100 too large"
    alone = {"a": variant(10, 1.0), "b": variant(10, 1.0, ok=False)}
    assert selection_reasons(alone, select(alone, ["t"]))["t"]["a"].endswith(
        "the only variant that does")


def test_measured_latency_decides_among_estimates_that_tie() -> None:
    # GraphDef int8 and LiteRT int8 do the same arithmetic (the same estimate), but this
    # host measures the GraphDef eight-bit kernels 30x slower: the measurement decides
    variants = {"int8": variant(266, 0.030, p50=1.24), "litert_int8": variant(271, 0.031,
                                                                             p50=0.033),
                "fp32": variant(1000, 0.057, p50=0.61)}
    assert select(variants, ["t"]) == {"t": "litert_int8"}
    why = selection_reasons(variants, select(variants, ["t"]))["t"]
    assert why["litert_int8"] == (
        "selected: meets every budget; estimated latency 31.0 µs, within 10% of the lowest "
        "(int8's 30.0 µs); the fastest measured on this host (33.0 µs p50 vs int8's 1.24 ms; "
        "beyond the 5% noise of the timings)")
    assert why["int8"] == ("meets every budget, estimated latency close to litert_int8's "
                           "(30.0 µs vs 31.0 µs), but slower measured on this host (1.24 ms "
                           "vs 33.0 µs p50)")
    # beyond the tie the estimate decides, and a measurement pointing the other way is said
    apart = {"int8": variant(266, 0.030, p50=1.24), "fp32": variant(1000, 0.057, p50=0.61)}
    assert select(apart, ["t"]) == {"t": "int8"}
    fp32 = selection_reasons(apart, select(apart, ["t"]))["t"]["fp32"]
    assert fp32.startswith("meets every budget, but fp32's estimated latency 57.0 µs > "
                           "int8's 30.0 µs. Measured on this host it is the faster one "
                           "(610 µs vs 1.24 ms p50)")
    assert "disagree" in fp32


def test_the_chosen_reason_names_only_the_steps_of_the_rule_that_decided() -> None:
    # the digits run: no other estimate within 10%, so neither the host measurement nor
    # the size decided, and the reason says neither
    far = {"litert_int8": variant(277_760, 0.0331, p50=0.0063),
           "litert_dynamic": variant(275_000, 0.0604, p50=0.0071),
           "fp32": variant(1_076_839, 1.17, p50=0.221)}
    why = selection_reasons(far, select(far, ["t"]))["t"]["litert_int8"]
    assert why == "selected: meets every budget; lowest estimated latency (33.1 µs est.)"
    # within 10% of it, the measurement decided: it names the estimates that tied
    close = {**far, "litert_dynamic": variant(275_000, 0.0340, p50=0.0071)}
    why = selection_reasons(close, select(close, ["t"]))["t"]["litert_int8"]
    assert why == ("selected: meets every budget; lowest estimated latency (33.1 µs est.); "
                   "within 10% of it: litert_dynamic (34.0 µs est.); the fastest measured "
                   "on this host (6.30 µs p50 vs litert_dynamic's 7.10 µs; beyond the 5% "
                   "noise of the timings)")
    # estimates and measurements alike: the size decided, and only then is it said
    same = {"a": variant(3072, 2.0), "b": variant(2048, 2.0), "c": variant(100, 9.0)}
    why = selection_reasons(same, select(same, ["t"]))["t"]["b"]
    assert why == ("selected: meets every budget; lowest estimated latency (2.00 ms est.); "
                   "a tie (none measured on this host), broken by the smaller file "
                   "(0.00195 MiB vs a's 0.00293 MiB)")


def test_timings_within_their_noise_are_a_tie_broken_by_a_stable_rule() -> None:
    # the loaded host: 131 µs against 131 µs, 0.08 % apart: within the noise (the
    # larger cv, at least 5 %), so the host does not decide: the smaller file does, in
    # either order of the recipe and whichever of the two this run measured faster
    for fast, slow in (("litert_int8", "litert_q"), ("litert_q", "litert_int8")):
        timings = {fast: 0.1310, slow: 0.1311}
        variants = {name: variant(size, 0.0331, p50=timings[name], cv=cv, kind="tflite")
                    for name, size, cv in (("litert_int8", 277_000, 0.03),
                                           ("litert_q", 271_000, 0.02))}
        for ordered in (variants, dict(reversed(variants.items()))):
            assert select(ordered, ["t"]) == {"t": "litert_q"}
            why = selection_reasons(ordered, {"t": "litert_q"})["t"]
            assert "a tie (this host's timings (p50: " in why["litert_q"], why
            assert "within the 5% noise" in why["litert_q"]
            assert "broken by the smaller file" in why["litert_q"]
            assert why["litert_int8"].startswith("meets every budget, a tie with litert_q")
    # a spread wider than their difference: a tie too (12 % apart, cv 0.3)
    wide = {"big": variant(900, 1.0, p50=1.00, cv=0.3), "small": variant(800, 1.0, p50=1.12,
                                                                         cv=0.1)}
    assert select(wide, ["t"]) == {"t": "small"}
    assert "within the 30% noise" in selection_reasons(wide, {"t": "small"})["t"]["small"]
    # the same size: the simpler kind, then recipe order
    kinds = {"mapped": variant(800, 1.0, p50=1.0, kind="memmapped"),
             "plain": variant(800, 1.0, p50=1.01)}
    assert select(kinds, ["t"]) == {"t": "plain"}
    assert "broken by the simpler kind" in selection_reasons(kinds, {"t": "plain"})["t"][
        "plain"]
    twins = {"b": variant(800, 1.0, p50=1.01), "a": variant(800, 1.0, p50=1.0)}
    assert select(twins, ["t"]) == {"t": "b"}
    assert "broken by recipe order" in selection_reasons(twins, {"t": "b"})["t"]["b"]
    # three tie: each loser's reason comes from its own key against the chosen one's, and
    # the chosen one's names each rival only under the step that really separated them
    three = {"a": variant(100, 1.0, kind="encrypted"), "b": variant(100, 1.0, kind="tflite"),
             "c": variant(500, 1.0, kind="tflite")}
    assert select(three, ["t"]) == {"t": "b"}
    why = selection_reasons(three, {"t": "b"})["t"]
    assert why["b"].endswith(
        "a tie (none measured on this host), broken by the smaller file (0.0000954 MiB vs "
        "c's 0.000477 MiB) and the simpler kind (tflite vs a's encrypted, the same size)"), why
    assert why["a"].endswith("but the same size, a less simple kind (encrypted)"), why
    assert why["c"].endswith("but larger (0.000477 MiB vs 0.0000954 MiB)"), why
    # and a later twin is told recipe order, not the kind the runner-up lost by
    four = {**three, "d": variant(100, 1.0, kind="tflite")}
    why = selection_reasons(four, {"t": "b"})["t"]
    assert why["d"].endswith("but the same size and kind, later in the recipe"), why
    assert "recipe order (the same size and kind as d)" in why["b"], why
    # the fastest runs are compared where recorded, not the p50s a loaded host (or a stage
    # beside the benchmark on a parallel runner) moves: the test_dask threads run, where
    # the p50s were 392 µs against 910 µs (cv about 1) and the fastest runs 264 vs 245 µs
    threads = {"stripped": variant(1_085_084, 0.845, p50=0.392, cv=1.03),
               "folded": variant(1_076_843, 0.819, p50=0.910, cv=0.96)}
    threads["stripped"]["latency_ms"]["min"] = 0.264
    threads["folded"]["latency_ms"]["min"] = 0.245
    assert select(threads, ["t"]) == {"t": "folded"}
    assert "(fastest run: folded 245 µs, stripped 264 µs)" in selection_reasons(
        threads, {"t": "folded"})["t"]["folded"]
    # a board's p50s that spread: within that spread they tie as well
    board = {"a": variant(900, 1.0, board_cv=0.4), "b": variant(800, 1.3, board_cv=0.4)}
    assert select(board, ["t"]) == {"t": "b"}
    assert "the spread of the timings behind them" in selection_reasons(board, {"t": "b"})[
        "t"]["b"]
    # estimates whose runtime overhead is calibrated on host runs that spread: the share of
    # them the timings move ties them (the test_dask run: 457 µs vs 538 µs, cv 0.9, most of
    # it overhead); FLOPs alone, or overhead on tight timings, do not
    spread = {"a": variant(900, 0.457, host_cv=0.9), "b": variant(800, 0.538, host_cv=0.9)}
    assert select(spread, ["t"]) == {"t": "b"}
    tight = {"a": variant(900, 0.457, host_cv=0.05), "b": variant(800, 0.538, host_cv=0.05)}
    assert select(tight, ["t"]) == {"t": "a"}
    assert select({"a": variant(900, 1.0), "b": variant(800, 1.3)}, ["t"]) == {"t": "a"}


def test_a_clear_difference_still_selects_the_faster() -> None:
    # 20 % apart with tight timings: the faster one, the larger file, and no tie is said
    variants = {"small": variant(800, 1.0, p50=1.20, cv=0.02),
                "fast": variant(900, 1.0, p50=1.00, cv=0.03)}
    assert select(variants, ["t"]) == {"t": "fast"}
    why = selection_reasons(variants, {"t": "fast"})["t"]
    assert "the fastest measured on this host" in why["fast"] and "tie" not in why["fast"]
    assert "slower measured on this host" in why["small"]


def test_check_budgets_names_each_violation() -> None:
    v = {"size_bytes": int(1.5 * MB), "accuracy_drop": 0.03, "fidelity": 0.9,
         "ram_bytes": 50 * MB, "ram_source": RAM_HEAP, "ram_measure": "heap growth"}
    budgets = Budgets(max_size_mb=1.0, max_accuracy_drop=0.01, min_fidelity=0.95,
                      max_latency_ms=10, max_ram_mb=20)
    violations = check_budgets(v, budgets, est_latency_ms=12.5)
    assert len(violations) == 5
    assert "size 1.50 MiB > max_size_mb 1 MiB" in violations
    assert "accuracy drop 0.0300 > max_accuracy_drop 0.01" in violations
    assert "fidelity 0.9000 < min_fidelity 0.95" in violations
    assert "estimated latency 12.5 ms > max_latency_ms 10 ms" in violations
    # what the figure is, as in the RAM column's name and the device limit's message
    assert "RAM 50.0 MiB (heap growth) > max_ram_mb 20 MiB" in violations
    # each knows the budget it broke: the report marks that cell
    assert [x.kind for x in violations] == ["size", "accuracy", "fidelity", "latency", "ram"]
    assert check_budgets(v, Budgets(), est_latency_ms=None) == []


def test_unmeasured_budgets_say_what_to_add() -> None:
    v = {"size_bytes": 10, "accuracy_drop": None, "fidelity": None, "ram_bytes": 10,
         "ram_source": "model size"}
    violations = check_budgets(v, Budgets(max_accuracy_drop=0.01, max_latency_ms=5), None)
    assert any("add evaluate" in x for x in violations)
    assert any("add benchmark" in x for x in violations)


def test_device_ram_limit_applies_without_a_budget() -> None:
    phone = resolve_device("phone-2016")
    big = {"size_bytes": 10, "ram_bytes": int((phone.ram_limit_mb + 1) * MB),
           "ram_source": "model size: add benchmark to measure", "ram_measure": "file size"}
    violations = check_budgets(big, Budgets(), None, phone)
    assert len(violations) == 1 and "device's limit" in violations[0]
    assert violations[0].startswith(f"RAM {phone.ram_limit_mb + 1:.3g} MiB (file size) > ")


def test_summary_shows_the_lowest_sqnr_of_outputs_that_are_not_classes(tmp_path) -> None:
    import io

    from rich.console import Console

    from orchestrator.results.report import print_summary

    def row(name: str, outputs: list[dict]) -> dict:
        return {"size_bytes": 2048, "gzip_size_bytes": 1024, "params": 10, "fidelity": 0.999,
                "stages": [], "outputs": outputs,
                "targets": {"t": {"budgets_ok": True, "est_latency_ms": 1.0, "device": "d",
                                  "violations": []}}}

    report = {"recipe": "r", "selected": {"t": "int8"}, "variants": {
        "fp32": row("fp32", [{"name": "kind", "kind": "class_scores", "sqnr_db": 9.0},
                             {"name": "onset", "kind": "probabilities", "sqnr_db": 200.0}]),
        "int8": row("int8", [{"name": "kind", "kind": "class_scores", "sqnr_db": 9.0},
                             {"name": "onset", "kind": "probabilities", "sqnr_db": 31.2},
                             {"name": "offset", "kind": "values", "sqnr_db": 23.14}])}}
    out = io.StringIO()
    print_summary(report, tmp_path, Console(file=out, width=250))
    text = out.getvalue()
    assert "min SQNR dB" in text
    assert "200.0 (onset)" in text and "23.1 (offset)" in text and "9.0" not in text
    classes_only = {**report, "variants": {"fp32": row("fp32", [])}}
    out = io.StringIO()
    print_summary(classes_only, tmp_path, Console(file=out, width=250))
    assert "SQNR" not in out.getvalue()


def test_one_preempted_run_does_not_make_a_tie() -> None:
    """The figures of a digits run on a loaded host (a fresh clone's suite with a CPU hog
    beside it): one of litert_int8's 50 runs took 15 ms against a 4.7 µs fastest, so its cv
    was 6.87 while its median sat 6 % above its fastest. Judged by the cv, 34.3 µs against
    61.6 µs estimated were a tie and the smaller file shipped; judged by the median over the
    fastest, the estimates decide, as on a quiet host."""
    def timed(size: int, est: float, compute: float, fastest: float, p50: float, cv: float
              ) -> dict:
        estimate = {"compute_ms": compute, "overhead_ms": est - compute, "host_cv": cv,
                    "host_p50_ms": p50, "host_fastest_ms": fastest}
        return {"size_bytes": size, "kind": "tflite",
                "targets": {"t": {"budgets_ok": True, "est_latency_ms": est,
                                  "estimate": estimate, "violations": []}},
                "latency_ms": {"min": fastest, "p50": p50, "cv": cv}}

    variants = {"litert_int8": timed(277_864, 0.0343, 0.0296, 0.0047, 0.0050, 6.8676),
                "litert_dynamic": timed(275_600, 0.0616, 0.0569, 0.0060, 0.0060, 0.0092)}
    assert select(variants, ["t"]) == {"t": "litert_int8"}
    why = selection_reasons(variants, {"t": "litert_int8"})["t"]
    assert "lowest estimated latency" in why["litert_int8"], why
    assert "tie" not in why["litert_int8"], why
    # most runs slowed (the median 1.5x the fastest) for estimates that are mostly runtime
    # overhead: 1.0 and 1.2 ms are within that noise, a tie the smaller file breaks
    slowed = {"a": timed(900, 1.0, 0.1, 0.30, 0.45, 0.3),
              "b": timed(800, 1.2, 0.1, 0.30, 0.45, 0.3)}
    assert select(slowed, ["t"]) == {"t": "b"}
    assert "broken by the smaller file" in selection_reasons(slowed, {"t": "b"})["t"]["b"]


def _stages(*spans: tuple[str, float, float], cached: bool = False) -> list[dict]:
    return [{"name": name, "seconds": end - start, "cached": cached, "started": start,
             "finished": end, **({"timed": True} if name == "benchmark" else {})}
            for name, start, end in spans]


def test_host_timings_taken_beside_another_stage_are_not_compared() -> None:
    """A parallel runner (dask, threads) timed `folded` while `int8`'s quantize ran: its
    fastest run doubled (the CI failure: 409 µs against 177 µs alone). Those timings do
    not decide; the stable rule does, as on the sequential run whose timings agree."""
    from orchestrator.results.selection import timed_beside

    def run(folded_fastest: float, parallel: bool) -> dict:
        shift = 0.0 if parallel else 10.0  # sequential: int8's quantize after the benchmarks
        variants = {"stripped": variant(1_085_084, 2.25, p50=0.26),
                    "folded": variant(1_076_843, 2.05, p50=folded_fastest),
                    "int8": variant(300_000, 9.0, ok=False)}
        variants["stripped"]["stages"] = _stages(("strip", 0.0, 1.0), ("benchmark", 1.0, 2.0))
        variants["folded"]["stages"] = _stages(("strip", 0.0, 1.0), ("fold", 2.0, 3.0),
                                               ("benchmark", 3.0, 4.0))
        variants["int8"]["stages"] = _stages(("strip", 0.0, 1.0),
                                             ("quantize_nodes", 2.5 + shift, 5.0 + shift))
        for name, stages in timed_beside(variants).items():
            variants[name]["timed_beside"] = stages
        return variants

    parallel = run(0.41, parallel=True)
    # the shared parent (strip) is one stage, not beside itself; stripped ran alone
    assert timed_beside(parallel) == {"folded": ["int8 › quantize_nodes"]}
    assert select(parallel, ["t"]) == {"t": "folded"}  # the smaller file, not the timing
    why = selection_reasons(parallel, {"t": "folded"})["t"]
    assert ("a tie (only stripped timed alone on this host; folded timed while other stages "
            "ran on a parallel runner, not compared)") in why["folded"], why["folded"]
    assert why["folded"].endswith("broken by the smaller file (1.027 MiB vs stripped's "
                                  "1.035 MiB)")
    assert why["stripped"].startswith("meets every budget, a tie with folded")
    assert "not compared" in why["stripped"] and "larger" in why["stripped"]
    # the same timings on a sequential run decide, and the other way
    sequential = run(0.41, parallel=False)
    assert timed_beside(sequential) == {}
    assert select(sequential, ["t"]) == {"t": "stripped"}
    # stages from the cache ran in no window of this run
    cached = run(0.41, parallel=True)
    cached["int8"]["stages"] = _stages(("quantize_nodes", 2.5, 5.0), cached=True)
    assert timed_beside(cached) == {}
