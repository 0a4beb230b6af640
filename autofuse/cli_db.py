"""CLI commands that read the plan DB: ``leaderboard``, ``best``, ``export``, ``history``.

Registered on the main group by :func:`register` (see the end of ``autofuse/cli.py``).
Every command opens the database read-only and never creates it: a missing
file is exit 1 with one line on stderr.  Exit codes: 0 ok, 1 nothing found /
runtime failure, 2 bad arguments.
"""

from __future__ import annotations

import csv
import io
import json
import sys
import warnings
from typing import Any, NoReturn

import click

from autofuse.db import DEFAULT_URL, normalize_url

__all__ = ["register"]


def db_url_callback(_ctx: click.Context, _param: click.Parameter, value: str | None) -> str | None:
    return normalize_url(value) if value else value


db_option = click.option("--db", "db_url", default=DEFAULT_URL, show_default=True, metavar="URL", callback=db_url_callback,
                         help="Plan database: an SQLAlchemy URL, or the path of an SQLite file.")
json_option = click.option("--json", "as_json", is_flag=True, help="Print one JSON object on stdout.")
tiny_option = click.option("--tiny", is_flag=True, help="Use the space's tiny-shape variant.")
target_option = click.option("--target", "target_text", required=True,
                             help='llvm, cuda, or target JSON such as \'{"kind":"cuda","arch":"sm_90"}\'.')


def _fail(msg: str, code: int = 1) -> NoReturn:
    click.echo(f"autofuse: error: {msg}", err=True)
    sys.exit(code)


def _open_db(url: str):
    """Read-only, never creating; a missing or broken DB is a one-line exit 1."""
    from autofuse.db import DBError, PlanDB, display_url

    try:
        return PlanDB(url, create=False, readonly=True)
    except DBError as e:
        text = str(e)  # a server's connection error names the URL already
        _fail(text if text.startswith("cannot connect to") else f"cannot open plan database {display_url(url)}: {text}")


def _target_short(target: str | dict) -> str:
    """``llvm znver4`` / ``cuda sm_90`` from canonical target JSON."""
    try:
        spec = json.loads(target) if isinstance(target, str) else target
    except ValueError:
        return str(target)
    if not isinstance(spec, dict):
        return str(target)
    detail = spec.get("mcpu") or spec.get("arch") or ""
    return f"{spec.get('kind', '?')} {detail}".strip()


def _fmt(x: float | None, spec: str = ".4f") -> str:
    return "–" if x is None else format(x, spec)


def _speedup(x: float | None) -> str:
    return "–" if x is None else f"{x:.2f}×"


def _echo_warnings(caught: list[warnings.WarningMessage]) -> list[str]:
    msgs = [str(w.message) for w in caught]
    for m in msgs:
        click.echo(f"autofuse: warning: {m}", err=True)
    return msgs


def register(group: click.Group) -> click.Group:
    """Add ``leaderboard``, ``best``, ``export`` and ``history`` to ``group``."""

    # ------------------------------------------------------------ leaderboard
    @group.command()
    @click.option("--workload", default=None, help="Workload name (e.g. mlp_gelu or mlp_gelu:tiny) or hash prefix.")
    @click.option("--target", "target_filter", default=None, help="Target kind (llvm, cuda) or a substring of its JSON.")
    @click.option("--top", default=1, show_default=True, type=click.IntRange(min=1), help="Plans per workload+target.")
    @click.option("--format", "fmt", default="table", show_default=True,
                  type=click.Choice(["table", "json", "csv"]), help="Output format.")
    @json_option
    @db_option
    def leaderboard(workload: str | None, target_filter: str | None, top: int, fmt: str, as_json: bool,
                    db_url: str) -> None:
        """Best verified plans per workload and target, with speedups over the baselines."""
        if as_json:
            fmt = "json"
        db = _open_db(db_url)
        try:
            rows = db.leaderboard(workload=workload, target=target_filter, top=top)
        finally:
            db.close()
        if not rows:
            what = " and ".join(f for f in (workload and f"workload {workload!r}",
                                            target_filter and f"target {target_filter!r}") if f)
            _fail(f"no tuned plans{' for ' + what if what else ''} in {db.url}")
        from autofuse.deploy import staleness

        stale = [staleness(r) for r in rows]  # tuned with another TVM/autofuse, or on another host
        dicts = []
        for r, reasons in zip(rows, stale):
            d = r.as_dict()
            d.pop("host", None)
            d["stale"] = reasons
            dicts.append(d)
        if fmt == "json":
            click.echo(json.dumps(dicts, indent=2, sort_keys=True))
        elif fmt == "csv":
            buf = io.StringIO()
            writer = csv.DictWriter(buf, fieldnames=list(dicts[0]), lineterminator="\n")
            writer.writeheader()
            writer.writerows([{**d, "stale": "; ".join(d["stale"])} for d in dicts])
            click.echo(buf.getvalue(), nl=False)
        else:
            from rich.table import Table

            t = Table(title=f"autofuse leaderboard ({db.url})",
                      caption="rank ms: what a final re-measurement ranks by, its 75th percentile of runs, or where it saw "
                              "the host's two speed levels, the geometric mean of its median in each (else the median)")
            cols = (["#"] if top > 1 else []) + ["workload", "target", "plan", "median ms ± spread", "rank ms",
                                                 "vs unfused", "vs default", "trials", "tuned at", "TVM", "stale"]
            for c in cols:
                t.add_column(c, no_wrap=c in ("workload", "plan", "target"),
                             justify="right" if c in ("#", "median ms ± spread", "rank ms", "vs unfused", "vs default",
                                                      "trials") else "left")
            for r, reasons in zip(rows, stale):
                cells = [str(r.rank)] if top > 1 else []
                cells += [
                    r.workload,
                    _target_short(r.target),
                    f"{r.plan_hash} ({r.label})",
                    f"{r.median_ms:.4f} ± {_fmt(r.spread_ms)}",
                    _fmt(r.rank_ms),
                    _speedup(r.speedup_vs_unfused),
                    _speedup(r.speedup_vs_default),
                    str(r.trials),
                    r.tuned_at[:19].replace("T", " "),
                    r.tvm_version,
                    ("[yellow]STALE[/]: " + "; ".join(reasons)) if reasons else "",
                ]
                t.add_row(*cells)
            from rich.console import Console

            # piped output: don't squeeze the table into 80 columns
            Console(width=None if sys.stdout.isatty() else 200).print(t)

    # ------------------------------------------------------------ best
    @group.command()
    @click.argument("space")
    @target_option
    @tiny_option
    @db_option
    @json_option
    def best(space: str, target_text: str, tiny: bool, db_url: str, as_json: bool) -> None:
        """Print the best verified plan of SPACE on a target (plan JSON)."""
        from autofuse.deploy import staleness
        from autofuse.target import host_fingerprint, parse_target
        from autofuse.workload import get_workload

        target = parse_target(target_text)
        w = get_workload(space, tiny)
        db = _open_db(db_url)
        try:
            bp = db.best_plan(w.hash, target.spec, host=host_fingerprint())
        finally:
            db.close()
        if bp is None:
            _fail(f"no tuned plan for {w.name} on {target.kind} in {db.url}")
        stale = staleness(bp)
        for m in stale:
            click.echo(f"autofuse: warning: plan {bp.plan_hash} {m}", err=True)
        plan_obj = json.loads(bp.plan_json)
        if as_json:
            d = bp.as_dict()
            d.pop("plan_json")
            d.update(workload=w.name, space=space, tiny=tiny, plan=plan_obj, stale=stale)
            click.echo(json.dumps(d, indent=None, sort_keys=True, default=str))
        else:
            click.echo(json.dumps(plan_obj, indent=2, sort_keys=True))

    # ------------------------------------------------------------ export
    @group.command("export")
    @click.argument("space")
    @target_option
    @click.option("-o", "--output", required=True, type=click.Path(dir_okay=False), help="Library to write (.so).")
    @tiny_option
    @db_option
    @click.option("--strict", is_flag=True, help="Refuse a plan tuned with other versions or on another host.")
    @json_option
    def export_cmd(space: str, target_text: str, output: str, tiny: bool, db_url: str, strict: bool,
                   as_json: bool) -> None:
        """Build the best verified plan of SPACE and export it as a deployable library."""
        from autofuse import deploy
        from autofuse.export import sidecar_path

        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", deploy.StalePlanWarning)
            model = deploy.load(db_url, space, target=target_text, tiny=tiny, strict=strict)
        msgs = _echo_warnings([c for c in caught if issubclass(c.category, deploy.StalePlanWarning)])
        lib = model.export(output)
        params = deploy.params_path(lib) if model.runtime_param_names else None
        out: dict[str, Any] = {
            "space": space, "workload": model.info["workload"], "workload_hash": model.info["workload_hash"],
            "plan_hash": model.plan_hash, "target": model.target.spec, "median_ms": model.info["median_ms"],
            "output": str(lib), "sidecar": str(sidecar_path(lib)), "params": None if params is None else str(params),
            "inputs": model.input_names, "warnings": msgs,
        }
        if as_json:
            click.echo(json.dumps(out, indent=None, sort_keys=True, default=str))
        else:
            extra = f" and {params}" if params else ""
            click.echo(f"exported {model.info['workload']} plan {model.plan_hash} "
                       f"(tuned median {model.info['median_ms']:.4f} ms) for {_target_short(model.target.spec)} "
                       f"→ {lib} (+ {sidecar_path(lib)}{extra})")

    # ------------------------------------------------------------ history
    @group.command()
    @click.argument("space")
    @target_option
    @click.option("-o", "--output", required=True, type=click.Path(dir_okay=False), help="PNG to write.")
    @tiny_option
    @db_option
    @json_option
    def history(space: str, target_text: str, output: str, tiny: bool, db_url: str, as_json: bool) -> None:
        """Plot the tuning history of SPACE on a target (best-so-far latency per trial and over time)."""
        from autofuse.history import history_series, plot_history
        from autofuse.db import normalize_url
        from autofuse.storage import trial_scores
        from autofuse.target import parse_target
        from autofuse.workload import get_workload

        target = parse_target(target_text)
        w = get_workload(space, tiny)
        db = _open_db(db_url)
        try:
            rows = db.measurements(w.hash, target.spec)
        finally:
            db.close()
        trials = [r for r in rows if r.kind == "trial"]
        if not trials:
            _fail(f"no tuning trials for {w.name} on {target.kind} in {db.url}")
        scores = trial_scores(normalize_url(db_url), {r.study for r in trials if r.study})
        path = plot_history(trials, output, title=f"{w.name} on {_target_short(target.spec)}", scores=scores)
        series = history_series(trials, scores)
        bests = [h.best for h in series if h.best is not None]
        out = {
            "space": space, "workload": w.name, "workload_hash": w.hash, "target": target.spec,
            "output": str(path), "trials": len(trials),
            "studies": {h.study: {"trials": h.trials, "failed": len(h.failed_trial), "best_ms": h.best}
                        for h in series},
            "best_ms": min(bests) if bests else None,
        }
        if as_json:
            click.echo(json.dumps(out, indent=None, sort_keys=True, default=str))
        else:
            click.echo(f"wrote {path}: {len(trials)} trials in {len(series)} "
                       f"stud{'y' if len(series) == 1 else 'ies'}, best {_fmt(out['best_ms'])} ms")

    return group
