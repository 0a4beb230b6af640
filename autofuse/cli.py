"""The ``autofuse`` command line. Every command takes ``--json`` for scripts."""

from __future__ import annotations

import json
import sys
from typing import Any, Callable

import click

from autofuse import __version__
from autofuse.cli_db import db_url_callback


def _emit(as_json: bool, obj: Any, render: Callable[[], None]) -> None:
    if as_json:
        click.echo(json.dumps(obj, indent=None, sort_keys=True, default=str))
    else:
        render()


def _console():
    from rich.console import Console

    # piped output (logs, CI) gets wide tables instead of columns squeezed to 80
    return Console() if sys.stdout.isatty() else Console(width=200)


class AutofuseGroup(click.Group):
    """Turns known errors into one line on stderr and an exit code; --debug shows tracebacks."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except (click.exceptions.Exit, click.exceptions.Abort, click.ClickException, SystemExit):
            raise
        except KeyboardInterrupt:
            click.echo("autofuse: interrupted", err=True)
            sys.exit(130)
        except Exception as e:
            from autofuse.errors import classify

            if ctx.obj and ctx.obj.get("debug"):
                raise
            code = classify(e)
            if code is None:
                click.echo(f"autofuse: internal error: {type(e).__name__}: {e} (rerun with --debug for the traceback)", err=True)
                sys.exit(1)
            from autofuse.errors import storage_error

            msg = storage_error(e) or (str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__)
            click.echo(f"autofuse: error: {msg}", err=True)
            sys.exit(code)


@click.group(cls=AutofuseGroup)
@click.version_option(__version__, prog_name="autofuse")
@click.option("--debug", is_flag=True, help="Show full tracebacks on errors.")
@click.pass_context
def main(ctx: click.Context, debug: bool) -> None:
    """Search fusion partitions and kernel schedules for the fastest plan on your hardware."""
    from autofuse.measure import steady_allocations

    steady_allocations()  # bench and run time plans in this process too
    ctx.obj = {"debug": debug}


json_option = click.option("--json", "as_json", is_flag=True, help="Print one JSON object on stdout.")
tiny_option = click.option("--tiny", is_flag=True, help="Use the space's tiny-shape variant (fast checks).")


# ---------------------------------------------------------------- spaces
@main.command()
@json_option
@tiny_option
def spaces(as_json: bool, tiny: bool) -> None:
    """List the search spaces with their inputs and ops."""
    from autofuse.space import space_names
    from autofuse.workload import get_workload

    rows = []
    for name in space_names():
        w = get_workload(name, tiny)
        g = w.graph(True)
        info = w.space.summary()
        info.update(workload=w.hash, ops=[f"{op.func}" for op in g.ops], kinds=[op.kind.name.lower() for op in g.ops])
        rows.append(info)

    def render() -> None:
        from rich.table import Table

        t = Table(title="autofuse search spaces" + (" (tiny)" if tiny else ""))
        for col in ("space", "inputs", "ops (params folded)", "workload"):
            t.add_column(col)
        for r in rows:
            ins = ", ".join(f"{i['name']}{list(i['shape'])}" for i in r["activations"])
            if r["params"]:
                ins += f" + {len(r['params'])} params"
            t.add_row(r["name"], ins, " → ".join(r["ops"]), r["workload"])
        _console().print(t)

    _emit(as_json, {"spaces": rows}, render)


# ---------------------------------------------------------------- partitions
@main.command()
@click.argument("space")
@json_option
@tiny_option
@click.option("--list", "list_", is_flag=True, help="List every legal partition (up to --limit).")
@click.option("--limit", default=50, show_default=True, help="How many partitions --list prints.")
@click.option("--cap", default=100_000, show_default=True, help="Stop counting at this many.")
@click.option("--unfolded", is_flag=True, help="Partition the graph with parameters as inputs (not folded).")
def partitions(space: str, as_json: bool, tiny: bool, list_: bool, limit: int, cap: int, unfolded: bool) -> None:
    """Count (and list) the legal fusion partitions of a space."""
    from itertools import islice

    from autofuse.graph import default_partition
    from autofuse.partition import count_partitions, decisions, enumerate_partitions, space_size, unfused
    from autofuse.workload import get_workload

    w = get_workload(space, tiny)
    g = w.graph(not unfolded)
    dag = g.dag()
    count, exact = count_partitions(dag, cap)
    names = [op.name for op in g.ops]

    def named(p) -> list[list[str]]:
        return [[names[i] for i in grp] for grp in p]

    out: dict[str, Any] = {
        "space": space, "workload": w.hash, "ops": len(g.ops), "decisions": len(decisions(dag)),
        "decision_space": space_size(dag), "count": count, "exact": exact,
        "unfused": named(unfused(dag)), "default": named(default_partition(g)),
    }
    if list_:
        out["partitions"] = [named(p) for p in islice(enumerate_partitions(dag), limit)]

    def render() -> None:
        c = _console()
        c.print(f"[bold]{space}[/]: {len(g.ops)} ops, {out['decisions']} fuse/cut decisions "
                f"(2^{out['decisions']} = {out['decision_space']} choice vectors)")
        c.print(f"legal partitions: {'' if exact else '≥ '}{count}")
        for op in g.ops:
            c.print(f"  {op.name:8s} {op.func:24s} {op.kind.name.lower():18s} {list(op.shape)}")
        c.print(f"unfused: {len(out['unfused'])} kernels   default (TVM FuseOps): {out['default']}")
        for i, p in enumerate(out.get("partitions", [])):
            c.print(f"  #{i}: " + " | ".join("+".join(grp) for grp in p))

    _emit(as_json, out, render)


# ---------------------------------------------------------------- run / build
target_option = click.option("--target", "target_text", default="llvm", show_default=True,
                             help='llvm, cuda, or target JSON such as \'{"kind":"cuda","arch":"sm_90"}\'.')
plan_option = click.option("--plan", "plan_text", default="default", show_default=True,
                           help="unfused, default, or a plan JSON file.")


def _plan_command_args(f: Callable) -> Callable:
    """SPACE, --plan, --target, --json, --tiny: what `run` and `build` share."""
    for option in reversed((click.argument("space"), plan_option, target_option, json_option, tiny_option)):
        f = option(f)
    return f


@main.command()
@_plan_command_args
@click.option("--repeats", default=10, show_default=True, help="Timed repeats (median reported).")
@click.option("--min-repeat-ms", default=50, show_default=True, help="Minimum duration of one repeat.")
@click.option("--cache-flush", is_flag=True, help="Flush CPU caches between repeats.")
def run(space: str, plan_text: str, target_text: str, as_json: bool, tiny: bool, repeats: int,
        min_repeat_ms: int, cache_flush: bool) -> None:
    """Build a plan with TVM, check it against the NumPy reference, and time it."""
    from autofuse.measure import TimingConfig
    from autofuse.runner import evaluate_plan
    from autofuse.target import parse_target
    from autofuse.workload import get_workload

    target = parse_target(target_text)
    if target.kind != "llvm":
        raise click.UsageError("run needs a target this machine can execute (llvm); use `autofuse build` for cuda")
    w = get_workload(space, tiny)
    plan = w.resolve_plan(plan_text)
    cfg = TimingConfig(repeats=repeats, min_repeat_ms=min_repeat_ms, cache_flush=cache_flush)
    res = evaluate_plan(w, plan, target, cfg)
    out = {"space": space, "workload": w.hash, "plan": plan.hash, "label": plan.label or plan_text,
           "target": target.spec, "groups": len(plan.groups), **res}

    def render() -> None:
        c = _console()
        status = "[green]correct[/]" if res["correct"] else "[red]WRONG[/]"
        c.print(f"{space} plan {plan.hash} ({out['label']}) on {target}: {len(plan.groups)} kernels, {status}, "
                f"max_rel_err {res['max_rel_err']:.2e}")
        if res.get("median_ms") is not None:
            c.print(f"median {res['median_ms']:.4f} ms  (min {res['min_ms']:.4f}, max {res['max_ms']:.4f}, "
                    f"spread {res['spread_ms']:.4f} ms over {res['repeats']} repeats); build {res['build_s']:.2f} s")
        if res.get("error"):
            c.print(f"[red]{res['error']}[/]")

    _emit(as_json, out, render)
    if not res["correct"]:
        sys.exit(1)


@main.command()
@_plan_command_args
@click.option("-o", "--output", required=True, type=click.Path(dir_okay=False), help="Library to write (.so).")
def build(space: str, plan_text: str, target_text: str, as_json: bool, tiny: bool, output: str) -> None:
    """Build a plan into a library without running it (e.g. for a GPU this machine lacks)."""
    import time

    from autofuse import build as af_build
    from autofuse.export import export_library
    from autofuse.target import parse_target
    from autofuse.workload import get_workload

    target = parse_target(target_text)
    w = get_workload(space, tiny)
    plan = w.resolve_plan(plan_text)
    t0 = time.perf_counter()
    ex = af_build.build(w.graph(plan.fold_params), plan, target)
    build_s = time.perf_counter() - t0
    export_library(ex, output, sidecar={"workload": w.hash, "space": space, "plan": json.loads(plan.to_json()),
                                        "plan_hash": plan.hash, "target": target.spec})
    device_modules = [m.kind for m in af_build._imports(ex)]
    out = {"space": space, "plan": plan.hash, "target": target.spec, "groups": len(plan.groups),
           "output": output, "device_modules": device_modules, "build_s": build_s}
    _emit(as_json, out, lambda: _console().print(
        f"built {space} plan {plan.hash} ({len(plan.groups)} kernels) for {target} in {build_s:.2f} s → {output}"
        + (f" (device modules: {', '.join(device_modules)})" if device_modules else "")))


# ---------------------------------------------------------------- tune
@main.command()
@click.argument("space")
@target_option
@click.option("--trials", type=click.IntRange(min=1), default=None, help="Total finished trials in the study (default 100 without --timeout).")
@click.option("--timeout", "timeout_text", default=None, help="Wall-clock bound for this job: 8h, 10m, 90s, 1h30m.")
@click.option("--db", "db_url", default=None, callback=db_url_callback,
              help="Trials and plans: an SQLAlchemy URL or an SQLite file path [default: sqlite:///results/autofuse.db].")
@click.option("--study", default=None, help="Study name [default: derived from workload and target].")
@click.option("--sampler", type=click.Choice(["tpe", "random", "cmaes", "gp"]), default="tpe", show_default=True)
@click.option("--seed", type=int, default=None, help="Sampler seed (reproducible sampling).")
@click.option("--workers", type=click.IntRange(min=1), default=1, show_default=True, help="Processes tuning the same study.")
@click.option("--resume", is_flag=True, help="Continue an existing study (it must exist).")
@click.option("--no-warm-start", "no_warm_start", is_flag=True,
              help="A new study does not measure the DB's best stored plan for this workload first.")
@click.option("--top-k", type=click.IntRange(min=1), default=3, show_default=True, help="Plans re-measured at the end.")
@click.option("--candidate-timeout", type=float, default=300.0, show_default=True, help="Seconds before a candidate's worker is killed (an upper bound: once 5 candidates have "
                   "worked, the limit is 5x the 90th percentile of their times, at least 5 s).")
@click.option("--mem-limit-mb", type=int, default=None, help="Memory limit of the candidate worker process.")
@click.option("--heartbeat", type=click.IntRange(min=1), default=10, show_default=True,
              help="Seconds between trial heartbeats; a trial silent for 2x this is failed on resume.")
@click.option("--repeats", type=click.IntRange(min=1), default=5, show_default=True, help="Timed repeats per trial.")
@click.option("--min-repeat-ms", type=click.IntRange(min=0), default=20, show_default=True)
@tiny_option
@json_option
def tune(space: str, target_text: str, trials: int | None, timeout_text: str | None, db_url: str | None, study: str | None,
         sampler: str, seed: int | None, workers: int, resume: bool, no_warm_start: bool, top_k: int,
         candidate_timeout: float,
         mem_limit_mb: int | None, heartbeat: int, repeats: int, min_repeat_ms: int, tiny: bool, as_json: bool) -> None:
    """Tune a space: search partitions and schedules, store every measured plan."""
    from autofuse.db import DEFAULT_URL
    from autofuse.job import JobConfig, parse_duration, run_job
    from autofuse.measure import TimingConfig
    from autofuse.search import make_sampler
    from autofuse.target import parse_target
    from autofuse.workload import get_workload

    try:
        timeout_s = parse_duration(timeout_text) if timeout_text else None
    except ValueError as e:
        raise click.BadParameter(str(e), param_hint="--timeout") from None
    if trials is None and timeout_s is None:
        trials = 100
    parse_target(target_text)
    get_workload(space, tiny)  # unknown space: fail before creating anything
    make_sampler(sampler, seed)  # sampler availability
    cfg = JobConfig(space=space, target=target_text, tiny=tiny, trials=trials, timeout_s=timeout_s,
                    db_url=db_url or DEFAULT_URL, study=study, sampler=sampler, seed=seed, workers=workers,
                    resume=resume, warm_start=not no_warm_start, top_k=top_k, candidate_timeout_s=candidate_timeout,
                    mem_limit_mb=mem_limit_mb,
                    timing=TimingConfig(repeats=repeats, min_repeat_ms=min_repeat_ms, warmup=1),
                    heartbeat_s=heartbeat, progress=not as_json)
    result = run_job(cfg, progress_factory=None if as_json else _tune_progress)
    out = result.as_dict()

    def render() -> None:
        c = _console()
        b = result.best
        c.print(f"study [bold]{result.study}[/]: {result.trials_this_job} trials this job ({result.trials_total} total; "
                f"{result.complete} ok, {result.failed} failed, {result.pruned} pruned (rejected, prescreened or suggested again); "
                f"{result.measured} plans built and measured, {result.repeats} repeats) in {result.wall_s:.0f} s"
                + ("  [yellow](interrupted: resume with the same command)[/]" if result.interrupted else ""))
        if b:
            ups = ", ".join(f"{v:.2f}× vs {k.removeprefix('speedup_vs_')}" for k, v in b.items()
                            if k.startswith("speedup_vs_") and v)
            ranked_by = ""
            if b.get("rank_ms"):
                how = (f"both speed levels, {b['slow_runs']} of {len(b['runs_ms'])} runs slow" if b.get("slow_runs")
                       else f"p75 of {len(b['runs_ms'])} runs")
                ranked_by = f", ranked by {b['rank_ms']:.4f} ms ({how})"
            c.print(f"best plan {b['plan_hash']} ({b['label']}): median {b['median_ms']:.4f} ms{ranked_by}"
                    + (f"  ({ups})" if ups else ""))
        o = result.overhead
        c.print(f"time: sampler+storage {o['sampler_and_storage_s']:.1f} s ({100 * o['sampler_and_storage_share']:.0f}%), "
                f"build {o['build_s']:.1f} s, measure {o['measure_s']:.1f} s, worker/IPC {o['worker_ipc_and_setup_s']:.1f} s, "
                f"plan DB {o['plan_db_s']:.1f} s; log: {result.log}")

    _emit(as_json, out, render)


def best_text(score_ms: float | None, side_by_side_ms: float | None) -> str:
    """The best so far as a progress line shows it: its score, and what the plan ran at in
    its latest comparisons where that differs, since on a noisy host the score can stand
    far from it (a score of 2.93 ms for a plan the final timed at 7.06, NOTES 56)."""
    if score_ms is None:
        return "-"
    if side_by_side_ms is None or abs(side_by_side_ms / score_ms - 1) < 0.005:
        return f"{score_ms:.4f} ms"
    return f"{score_ms:.4f} ms (runs {side_by_side_ms:.4f} side by side)"


class _tune_progress:
    """A rich progress bar fed with the study after each trial: trials/s, best so far (its
    score, and what it runs at side by side), ETA."""

    def __init__(self, cfg, before: int):
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

        self.cfg = cfg
        self.before = before
        self.progress = Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                                 TextColumn("{task.fields[rate]}"), TextColumn("best {task.fields[best]}"),
                                 TimeElapsedColumn(), TextColumn("eta"), TimeRemainingColumn(), transient=False)

    def __enter__(self):
        import time

        import optuna

        from autofuse.runner import CandidateLog

        total = self.cfg.trials
        self.t0 = time.time()
        self.progress.start()
        self.task = self.progress.add_task(f"tuning {self.cfg.space}", total=total, completed=self.before,
                                           rate="", best="-")
        states = (optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.PRUNED, optuna.trial.TrialState.FAIL)
        log, seen = CandidateLog(), set()  # the job's view of its trials, kept up as they finish

        def update(study) -> None:
            done = study.get_trials(deepcopy=False, states=states)
            for t in done:
                if t.number not in seen:
                    seen.add(t.number)
                    log.add_trial(t)
            rate = (len(done) - self.before) / max(1e-9, time.time() - self.t0)
            self.progress.update(self.task, completed=len(done), rate=f"{rate:.2f} trials/s",
                                 best=best_text(log.best_ms, log.side_by_side_ms()))

        return update

    def __exit__(self, *exc) -> None:
        self.progress.stop()

    def final_started(self, seconds: float, wait_s: float) -> None:
        self.progress.console.print(
            f"final re-measurement of the best plans and the references, interleaved: {seconds:.0f} s, "
            f"up to {wait_s:.0f} s until it has seen both of the host's speed levels")


# ---------------------------------------------------------------- bench
@main.command()
@click.argument("spaces", nargs=-1)
@target_option
@click.option("--budget", "budget_text", default="10m", show_default=True,
              help="Tuning wall-clock budget per space, the same for autofuse and MetaSchedule.")
@click.option("-o", "--output", "out_dir", default="results/bench", show_default=True, type=click.Path(file_okay=False))
@click.option("--rounds", type=click.IntRange(min=1), default=5, show_default=True, help="Interleaved timing rounds.")
@click.option("--repeats", type=click.IntRange(min=1), default=3, show_default=True, help="Repeats per column per round.")
@click.option("--min-repeat-ms", type=click.IntRange(min=1), default=50, show_default=True)
@click.option("--columns", default=",".join(["unfused", "tvm-default", "tvm-metaschedule", "onnxruntime", "numpy", "autofuse"]),
              show_default=True, help="Which columns to run (comma-separated).")
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--compare-random", is_flag=True,
              help="Also run random search with the same budget: curves at equal trials, and its best plan timed "
                   "in the same rounds as autofuse's (the random-search column).")
@click.option("--random-seeded", is_flag=True,
              help="Implies --compare-random: random search first measures autofuse's seed templates too, so the "
                   "comparison shows what the sampler and mutations add on their own (default: plain random "
                   "sampling after the two reference plans).")
@click.option("--append", is_flag=True,
              help="Keep the spaces of the report already in --output that this run does not measure (a long "
                   "bench split over several runs; the budget must be the same). Table, geomeans and charts cover all.")
@tiny_option
@json_option
def bench(spaces: tuple[str, ...], target_text: str, budget_text: str, out_dir: str, rounds: int, repeats: int,
          min_repeat_ms: int, columns: str, seed: int, compare_random: bool, random_seeded: bool, append: bool,
          tiny: bool, as_json: bool) -> None:
    """autofuse's best plan vs unfused, TVM (default, MetaSchedule), onnxruntime, NumPy and the roofline."""
    from pathlib import Path

    from autofuse.bench import (COLUMNS, cell, paired_cell, paired_peers, peer_geomeans, random_cell, report_columns,
                                roofline_cell, run_bench)
    from autofuse.job import parse_duration
    from autofuse.space import space_names
    from autofuse.target import parse_target
    from autofuse.workload import get_workload

    target = parse_target(target_text)
    if target.kind != "llvm":
        raise click.UsageError("bench runs on this machine's CPU: use --target llvm")
    try:
        budget = parse_duration(budget_text)
    except ValueError as e:
        raise click.BadParameter(str(e), param_hint="--budget") from None
    cols = tuple(c.strip() for c in columns.split(",") if c.strip())
    unknown = set(cols) - set(COLUMNS)
    if unknown:
        raise click.BadParameter(f"unknown column(s) {sorted(unknown)}; choose from {', '.join(COLUMNS)}", param_hint="--columns")
    compare_random = compare_random or random_seeded or "random-search" in cols
    if compare_random and "autofuse" not in cols:
        raise click.BadParameter("random search is compared with autofuse: include the autofuse column",
                                 param_hint="--compare-random")
    names = list(spaces) or space_names()
    for n in names:
        get_workload(n, tiny)
    console = _console()
    say = (lambda s: None) if as_json else (lambda s: console.print(f"[dim]{s}[/]"))
    report = run_bench(names, target, budget, Path(out_dir), tiny=tiny, rounds=rounds, repeats=repeats,
                       min_repeat_ms=min_repeat_ms, seed=seed, include=cols, progress=say,
                       compare_random=("seeded" if random_seeded else "plain") if compare_random else None,
                       append=append)

    def render() -> None:
        from rich.table import Table

        t = Table(title=f"autofuse bench: median ms (×: peer time / autofuse time), budget {budget:.0f} s, "
                        f"{report['threads']} threads, {report['date']}")
        t.add_column("space")
        shown = report_columns(report)
        for c in shown:
            t.add_column(c, justify="right")
        t.add_column("roofline", justify="right")
        t.add_column("autofuse / roofline", justify="right")
        vs_random = any("search_vs_random" in r for r in report["spaces"])
        if vs_random:
            t.add_column("random search / autofuse (best ms)", justify="right")
        for r in report["spaces"]:
            row = [r["space"]]
            row += [cell(r, c, markdown=False) for c in shown]
            row.append(f"{r['roofline_ms']:.3f}" if r.get("roofline_ms") else "")
            row.append(f"{r['autofuse_over_roofline']:.2f}×" if r.get("autofuse_over_roofline") else "")
            if vs_random:
                row.append(random_cell(r.get("search_vs_random")))
            t.add_row(*row)
        console.print(t)
        paired = paired_peers(report)
        by_space = {r["space"]: [f"{p} {c}" for p in paired if (c := paired_cell(r, p, markdown=False))]
                    + [f"autofuse/roofline {c}" for c in [roofline_cell(r, markdown=False)] if c]
                    for r in report["spaces"]}
        if any(by_space.values()):
            console.print("back to back with autofuse (peer time / autofuse time, autofuse time / its floor's; "
                          "quartiles): " + "; ".join(f"{space}: {', '.join(cells)}" for space, cells in by_space.items() if cells))
        if peers := peer_geomeans(report):
            console.print("geomean speedup of autofuse: " + ", ".join(f"{k} {v:.2f}×" for k, v in peers.items()))
        console.print(f"peaks: {report['peaks']['peak_gflops']:.0f} GFLOP/s ({report['peaks']['peak_source']} SGEMM 2048³), "
                      f"{report['peaks']['bandwidth_gbs']:.1f} GB/s (copy); JSON {report['json']}; charts {', '.join(report['charts'])}")

    _emit(as_json, report, render)


from autofuse.cli_db import register as _register_db_commands  # noqa: E402
_register_db_commands(main)
from autofuse.cli_model import register as _register_model_commands  # noqa: E402
_register_model_commands(main)

if __name__ == "__main__":
    main()
