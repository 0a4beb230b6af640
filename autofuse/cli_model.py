"""CLI for real models: ``autofuse import model.onnx``, and ``tune``/``export`` of model files.

``register(group)`` (called at the end of ``autofuse/cli.py``) adds ``import`` and wraps the
existing ``tune`` and ``export`` commands: their SPACE argument may also be an ONNX file (or the
name a model was registered under), with ``--shape NAME=D0,D1,...`` fixing symbolic input dims and
``--name`` naming the workload.  A model is tuned region by region (see autofuse.model_job).
"""

from __future__ import annotations

import json
import sys
from typing import Any

import click

from autofuse.cli_db import db_url_callback
from autofuse.db import DEFAULT_URL, display_url

__all__ = ["register"]

shape_option = click.option("--shape", "shapes", multiple=True, metavar="NAME=D0,D1,...",
                            help="Fix an input's shape (symbolic dims need it), e.g. input=1,3,224,224. Repeatable.")
name_option = click.option("--name", "model_name", default=None, help="Workload name of the model [default: file stem].")


def _model_spec_for(arg: str, shapes: tuple[str, ...], model_name: str | None, db_url: str | None) -> str | None:
    """The model spec when ARG is a model (file or registered name), else None (a space)."""
    from autofuse.onnx_import import model_spec, parse_shape_options, registered_model
    from autofuse.space import space_names

    if arg.endswith(".onnx"):
        return model_spec(arg, parse_shape_options(shapes), model_name)
    if arg not in space_names() and db_url:
        found = registered_model(db_url, arg)
        if found:
            path, reg_shapes = found
            return model_spec(path, {**reg_shapes, **parse_shape_options(shapes)}, model_name or arg)
    if shapes or model_name:
        raise click.UsageError("--shape/--name apply to ONNX models only")
    return None


def _emit(as_json: bool, obj: Any, text: str) -> None:
    click.echo(json.dumps(obj, sort_keys=True, default=str) if as_json else text)


def register(group: click.Group) -> click.Group:
    # ------------------------------------------------------------ import
    @group.command("import")
    @click.argument("model_file", metavar="MODEL.onnx")
    @shape_option
    @name_option
    @click.option("--db", "db_url", default=DEFAULT_URL, show_default=True, metavar="URL", callback=db_url_callback,
                  help="Plan database: an SQLAlchemy URL or an SQLite file path.")
    @click.option("--json", "as_json", is_flag=True, help="Print one JSON object on stdout.")
    def import_cmd(model_file: str, shapes: tuple[str, ...], model_name: str | None, db_url: str, as_json: bool) -> None:
        """Import an ONNX model, check it runs, and register it (and its regions) as workloads."""
        from collections import Counter

        from autofuse.model_job import register_model
        from autofuse.onnx_import import model_spec, parse_shape_options, read_model
        from autofuse.regions import model_regions
        from autofuse.workload import get_workload

        spec = model_spec(model_file, parse_shape_options(shapes), model_name)
        w = get_workload(spec)
        info = register_model(w, db_url)
        onnx_ops = Counter(n.op_type for n in read_model(model_file).graph.node)
        rs = model_regions(w)
        out = {**info, "model": spec, "inputs": [t.as_dict() for t in w.space.activations],
               "params": len(w.space.params), "onnx_ops": dict(onnx_ops), "regions_detail": rs.summary(), "db": display_url(db_url)}
        text = (f"imported {w.name} ({w.hash}): inputs "
                + ", ".join(f"{t.name}{list(t.shape)}" for t in w.space.activations)
                + f", {len(w.space.params)} weights; {info['ops']} ops (weights folded), "
                f"{info['regions']} regions, {info['distinct_regions']} distinct; registered in {display_url(db_url)}\n"
                f"ONNX ops: " + ", ".join(f"{k}×{v}" for k, v in sorted(onnx_ops.items())))
        _emit(as_json, out, text)

    # ------------------------------------------------------------ tune (wrapped)
    orig_tune = group.commands["tune"]

    def tune_callback(**kw: Any) -> None:
        shapes, model_name = kw.pop("shapes"), kw.pop("model_name")
        spec = _model_spec_for(kw["space"], shapes, model_name, kw.get("db_url") or DEFAULT_URL)
        if spec is None:
            return click.get_current_context().invoke(orig_tune.callback, **kw)
        _tune_model(spec, kw)

    group.add_command(click.Command(
        "tune", callback=tune_callback, params=list(orig_tune.params) + [shape_option(lambda: None).__click_params__[0],
                                                                           name_option(lambda: None).__click_params__[0]],
        help=(orig_tune.help or "") + "\n\nSPACE may be an ONNX model file (or a registered model name): the model is "
             "tuned region by region and the stitched whole-model plan is verified against onnxruntime and stored.",
        short_help=orig_tune.short_help))

    # ------------------------------------------------------------ export (wrapped)
    orig_export = group.commands["export"]

    def export_callback(**kw: Any) -> None:
        shapes, model_name = kw.pop("shapes"), kw.pop("model_name")
        spec = _model_spec_for(kw["space"], shapes, model_name, kw.get("db_url") or DEFAULT_URL)
        if spec is not None:
            kw["space"] = spec if (shapes or model_name) else kw["space"]
        return click.get_current_context().invoke(orig_export.callback, **kw)

    group.add_command(click.Command(
        "export", callback=export_callback,
        params=list(orig_export.params) + [shape_option(lambda: None).__click_params__[0],
                                           name_option(lambda: None).__click_params__[0]],
        help=(orig_export.help or "") + "\n\nSPACE may be an ONNX model file or a registered model name.",
        short_help=orig_export.short_help))
    return group


def _tune_model(spec: str, kw: dict[str, Any]) -> None:
    from autofuse.job import parse_duration
    from autofuse.measure import TimingConfig
    from autofuse.model_job import ModelTuneConfig, tune_model

    try:
        timeout_s = parse_duration(kw["timeout_text"]) if kw.get("timeout_text") else None
    except ValueError as e:
        raise click.BadParameter(str(e), param_hint="--timeout") from None
    for unsupported in ("workers", "resume", "study"):
        if kw.get(unsupported) not in (None, False, 1):
            raise click.UsageError(f"--{unsupported} is not supported for models (regions are tuned in one job; "
                                   "a rerun starts every region from its best stored plan)")
    cfg = ModelTuneConfig(model=spec, target=kw["target_text"], trials=kw.get("trials"), timeout_s=timeout_s,
                          db_url=kw.get("db_url") or DEFAULT_URL, seed=kw.get("seed"), sampler=kw["sampler"],
                          timing=TimingConfig(repeats=kw["repeats"], min_repeat_ms=kw["min_repeat_ms"], warmup=1),
                          candidate_timeout_s=kw["candidate_timeout"], mem_limit_mb=kw.get("mem_limit_mb"))
    as_json = kw["as_json"]

    def progress(i: dict[str, Any]) -> None:
        est = i["model_estimate_ms"]
        ms = f"{i['ms']:.4f} ms" if i["ms"] is not None else i["status"]
        click.echo(f"[{i['trial']}/{i['budget'] or 'until timeout'}] region {i['region_index']}/{i['regions']} {i['region']} "
                   f"(x{i['instances']}, {i['label']}): {ms}; region best "
                   f"{'-' if i['region_best_ms'] is None else format(i['region_best_ms'], '.4f')} ms; "
                   f"model estimate {'-' if est is None else format(est, '.4f') + ' ms'}"
                   f" ({i['regions_untried']} regions untried)", err=True)

    res = tune_model(cfg, progress=None if as_json else progress)
    f = res["final"]

    def fmt(d: dict[str, Any]) -> str:
        return f"{d['median_ms']:.4f} ms" if d.get("median_ms") is not None else f"{d['status']} ({d.get('error')})"

    text = (f"{res['workload']} ({res['hash']}): {res['regions']} regions, {res['distinct_regions']} distinct, "
            f"{res['trials']} region trials in {res['wall_s']:.0f} s\n"
            f"whole model: default plan {fmt(f['default'])}, stitched best plan {fmt(f['stitched'])}"
            + (f" ({res['speedup_vs_default']:.2f}× vs default)" if res.get("speedup_vs_default") else "")
            + f"; regions estimate {res['estimate_ms']} ms\nlog: {res['log']}")
    _emit(as_json, res, text)
    if f["stitched"]["status"] != "ok" and f["default"]["status"] != "ok":
        sys.exit(1)
