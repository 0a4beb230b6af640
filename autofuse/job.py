"""Tuning jobs: the loop that runs overnight, survives kills, and can share a study.

One job = one Optuna study (trials in Optuna's RDB storage) + the plan database
(every measured plan, on the same URL).  Each trial samples a plan, measures it in
an isolated worker process, and records the result in both.  ``workers`` > 1 runs
that loop in several processes on the same study.  At the end the top plans and
the two reference plans are re-measured together, interleaved, and only those
final measurements decide which plan is best: by the 75th percentile of each plan's
runs, so a plan that is fast in quiet minutes and much slower in busy ones does not win,
or, where the final saw both of the host's speed levels, by its time in each
(:func:`final_rank_ms`).
"""

from __future__ import annotations

import json
import logging
import math
import multiprocessing as mp
import os
import re
import signal
import statistics
import time
from collections.abc import Container
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import optuna

import autofuse
from autofuse.db import DEFAULT_URL, PlanDB, display_url, sqlite_file
from autofuse.measure import TimingConfig
from autofuse.plan import Plan
from autofuse.cost_model import mark_prescreened, prescreen
from autofuse.runner import OK, REJECTED, CandidateLog, IsolatedRunner, pruned_as_repeat, round_numbers, value_of
from autofuse.search import PlanSpace, make_sampler, mutation_for, side_by_side_ratio
from autofuse.storage import open_storage
from autofuse.target import Target, host_fingerprint, parse_target, vector_unit
from autofuse.workload import REFERENCE_PLANS, get_workload

FINISHED = (optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.PRUNED, optuna.trial.TrialState.FAIL)
log = logging.getLogger("autofuse.job")


@dataclass
class JobConfig:
    space: str
    target: str = "llvm"
    tiny: bool = False
    trials: int | None = 100
    timeout_s: float | None = None
    db_url: str = DEFAULT_URL
    study: str | None = None
    sampler: str = "tpe"
    seed: int | None = None
    workers: int = 1
    resume: bool = False
    warm_start: bool = True  # a new study measures the DB's best plan for the workload early
    seed_templates: bool = True  # ... and the seed templates (PlanSpace.seed_trials); off: a plain random baseline
    mutation_rate: float = 0.75  # share of trials that mutate the best plan (none with sampler "random"); NOTES 22
    timing: TimingConfig = field(default_factory=lambda: TimingConfig(repeats=5, min_repeat_ms=20, warmup=1))
    # the final re-measurement: many short runs spread over its rounds rather than a few long
    # ones, so that each plan's 75th percentile of runs sees the machine's busy minutes too
    final_timing: TimingConfig = field(default_factory=lambda: TimingConfig(repeats=3, min_repeat_ms=50, warmup=1))
    candidate_timeout_s: float = 300.0
    mem_limit_mb: int | None = None
    top_k: int = 3
    final_rounds: int = 8  # at least; more while the final has not yet lasted FINAL_SHARE of the job
    heartbeat_s: int = 10
    progress: bool = True
    log_dir: str | None = None  # None: beside the SQLite database (results/ for the default one); results/ for a server

    def target_obj(self) -> Target:
        return parse_target(self.target)

    def study_name(self) -> str:
        if self.study:
            return self.study
        w = get_workload(self.space, self.tiny)
        return f"{w.name}@{self.target_obj().tag}-{w.hash[:8]}"


class JobError(Exception):
    """The job cannot start (e.g. --resume of a study that does not exist)."""


def parse_duration(text: str) -> float:
    """'8h', '10m', '90s', '1h30m', or plain seconds."""
    text = text.strip().lower()
    if re.fullmatch(r"\d+(\.\d+)?", text):
        return float(text)
    m = re.fullmatch(r"(?:(\d+)h)?(?:(\d+)m)?(?:(\d+(?:\.\d+)?)s)?", text)
    if not text or not m or not any(m.groups()):
        raise ValueError(f"bad duration {text!r}: use e.g. 8h, 10m, 90s or 1h30m")
    h, mi, s = m.groups()
    return int(h or 0) * 3600 + int(mi or 0) * 60 + float(s or 0)


def storage_for(cfg: JobConfig) -> optuna.storages.RDBStorage:
    return open_storage(cfg.db_url, cfg.heartbeat_s)


class _StopFlag:
    """SIGINT/SIGTERM: finish the trial in flight, then stop; a second Ctrl-C aborts."""

    def __init__(self) -> None:
        self.requested = False

    def install(self) -> None:
        def handler(signum: int, _frame: Any) -> None:
            if self.requested and signum == signal.SIGINT:
                raise KeyboardInterrupt
            self.requested = True
            log.warning("signal %s: stopping after the trial in flight", signal.Signals(signum).name)

        signal.signal(signal.SIGINT, handler)
        signal.signal(signal.SIGTERM, handler)


@dataclass
class Timers:
    """Where a worker's wall time goes (seconds)."""

    suggest: float = 0.0  # sampling the plan (sampler + storage reads)
    evaluate: float = 0.0  # the isolated worker: build + measure + IPC
    build: float = 0.0
    measure: float = 0.0
    record: float = 0.0  # plan-DB writes + trial attrs
    trials: int = 0


def _fault_plan() -> dict[int, str]:
    """AUTOFUSE_INJECT='3:segfault,5:hang' (tests only; needs AUTOFUSE_FAULT_INJECTION=1)."""
    spec = os.environ.get("AUTOFUSE_INJECT", "")
    out = {}
    for item in filter(None, spec.split(",")):
        n, kind = item.split(":")
        out[int(n)] = kind
    return out


def worker_loop(cfg: JobConfig, worker_id: int = 0, progress: Any = None, stop: _StopFlag | None = None) -> Timers:
    """Run trials on the shared study until the trial budget, the timeout, or a stop request."""
    w = get_workload(cfg.space, cfg.tiny)
    target = cfg.target_obj()
    host = host_fingerprint()
    space = PlanSpace(w)
    storage = storage_for(cfg)
    study = optuna.load_study(study_name=cfg.study_name(), storage=storage,
                              sampler=make_sampler(cfg.sampler, None if cfg.seed is None else cfg.seed + worker_id, cfg.workers))
    db = PlanDB(cfg.db_url)
    timers = Timers()
    faults = _fault_plan()
    stop = stop or _StopFlag()
    deadline = None if cfg.timeout_s is None else time.time() + cfg.timeout_s
    timing = asdict(cfg.timing)
    candidates = CandidateLog.from_trials(study.get_trials(deepcopy=False))
    mutation = mutation_for(cfg.sampler, cfg.mutation_rate, None if cfg.seed is None else cfg.seed + 1000 * worker_id,
                            max_trials=cfg.trials)
    if mutation is not None:
        mutation.use_space(study.study_name, space)

    def objective(trial: optuna.Trial) -> float:
        t0 = time.perf_counter()
        plan, repairs = space.suggest(trial)
        label = trial.user_attrs.get("label", "tuned")
        if label == "tuned":  # the sampler's own suggestion (not a baseline, seed or mutation)
            model = None if mutation is None else mutation.model_for(study)
            predicted = prescreen(model, trial.params, candidates.best_ms)
            if predicted is not None:
                why = mark_prescreened(trial, plan.to_json(), predicted, candidates.best_ms)
                timers.suggest += time.perf_counter() - t0
                log.info("trial %d [%s] prescreened plan %s groups=%d %s", trial.number, label, plan.hash,
                         len(plan.groups), why)
                if stop.requested or (deadline is not None and time.time() > deadline):
                    study.stop()
                raise optuna.TrialPruned(why)
        t1 = time.perf_counter()
        task = {"space": cfg.space, "tiny": cfg.tiny, "plan": plan.to_json(), "target": target.spec_json,
                "timing": timing, "inject": faults.get(trial.number)}
        res = candidates.run(runner, task, plan.hash, cfg.candidate_timeout_s, PlanSpace.hand_picked(label))
        t2 = time.perf_counter()
        timers.suggest += t1 - t0
        timers.evaluate += t2 - t1
        timers.build += res.get("build_s") or 0.0
        timers.measure += res.get("run_s") or 0.0
        timers.trials += 1
        trial.set_user_attr("plan", plan.to_json())
        trial.set_user_attr("groups", len(plan.groups))
        if repairs:
            trial.set_user_attr("repairs", repairs[:20])
        CandidateLog.mark(trial, plan.hash, res)
        if not res.get("repeat"):  # a repeat was measured before in this study: nothing new to store
            store_result(db, w.hash, target, host, plan, label, res, kind="trial", study=study.study_name,
                         trial_number=trial.number)
        timers.record += time.perf_counter() - t2
        log.info("trial %d [%s] %s plan %s groups=%d %s%s%s", trial.number, label, res["status"], plan.hash,
                 len(plan.groups), f"{res['median_ms']:.4f} ms" if res["status"] == OK else res.get("error", ""),
                 " (plan measured before, not again)" if res.get("repeat") else
                 " (one run: far slower than the best)" if res["status"] == OK and res.get("repeats") == 1 else "",
                 _confirm_text(res))
        if stop.requested or (deadline is not None and time.time() > deadline):
            study.stop()
        if pruned_as_repeat(label, res):
            raise optuna.TrialPruned("plan measured before")
        if res["status"] == REJECTED:
            raise optuna.TrialPruned(res.get("error", "rejected"))
        if res["status"] != OK:
            raise _CandidateFailed(f"{res['status']}: {res.get('error', '')}")
        return value_of(res)

    callbacks: list[Any] = [mutation] if mutation is not None else []
    if progress is not None:
        callbacks.append(lambda st, _t: progress(st))
    if cfg.trials is not None:
        callbacks.append(optuna.study.MaxTrialsCallback(cfg.trials, states=FINISHED))
    with IsolatedRunner(cfg.candidate_timeout_s, cfg.mem_limit_mb) as runner:
        if not _budget_left(study, cfg):
            return timers
        study.optimize(objective, timeout=cfg.timeout_s, callbacks=callbacks, catch=(_CandidateFailed,))
    db.close()
    return timers


def _confirm_text(res: dict[str, Any]) -> str:
    c = res.get("confirm")
    if res.get("repeat"):
        return ""
    if not c:
        sc = res.get("scaled")
        return "" if not sc else (f"; not compared (the best runs {sc['best_side_by_side_ms']:.4f} ms side by side), "
                                  f"scored {res['value_ms']:.4f} ms on the scale of its {sc['best_ms']:.4f}")
    if "error" in c:
        return f"; timing it against the best failed ({c['error']}), its own median counts"
    verdict = "new best" if c["faster"] else "not faster"
    if c.get("disturbed"):
        verdict += f" than the best's recent {c['recent_ms']:.4f} ms (the best ran far above that in both comparisons)"
    elif c.get("attempts", 1) > 1:
        verdict += " (timed twice: the best ran far above its recent time the first time)"
    if "first" in c:
        verdict += (f" in the replicate of a win ({c['first']['candidate_ms']:.4f} vs {c['first']['incumbent_ms']:.4f} ms"
                    + (f"; the replicate failed: {c['replicate_error']}" if "replicate_error" in c else "") + ")")
    return (f"; against the best {c['vs']} side by side: {c['candidate_ms']:.4f} vs {c['incumbent_ms']:.4f} ms, "
            f"{verdict}, scored {res['value_ms']:.4f} ms")


class _CandidateFailed(Exception):
    """A candidate crashed, hung, failed to build or computed a wrong result: the trial FAILs."""


def _budget_left(study: optuna.Study, cfg: JobConfig) -> bool:
    if cfg.trials is None:
        return True
    return len(study.get_trials(deepcopy=False, states=FINISHED)) < cfg.trials


def _tvm_version() -> str:
    import tvm

    return tvm.__version__


def store_result(db: PlanDB, workload_hash: str, target: Target, host: dict, plan: Plan, label: str,
                 res: dict[str, Any], *, kind: str, study: str, trial_number: int | None = None) -> None:
    """A candidate's result (``runner`` result dict) in the plan DB: its plan, then the measurement."""
    plan_id = db.put_plan(workload_hash, target.spec, host, plan.hash, plan.to_json(), label)
    db.add_measurement(plan_id, median_ms=res.get("median_ms"), min_ms=res.get("min_ms"), max_ms=res.get("max_ms"),
                       std_ms=res.get("std_ms"), repeats=res.get("repeats") or 0, correct=res["status"] == OK,
                       max_rel_err=res.get("max_rel_err"), error=res.get("error"), kind=kind,
                       tvm_version=_tvm_version(), autofuse_version=autofuse.__version__, study=study,
                       trial_number=trial_number)


def _spawned_worker(cfg_json: str, worker_id: int) -> None:
    cfg = _cfg_from_json(cfg_json)
    _setup_logging(cfg)
    stop = _StopFlag()
    stop.install()
    worker_loop(cfg, worker_id, stop=stop)


def _cfg_to_json(cfg: JobConfig) -> str:
    return json.dumps(asdict(cfg))


def _cfg_from_json(text: str) -> JobConfig:
    d = json.loads(text)
    d["timing"] = TimingConfig(**d["timing"])
    d["final_timing"] = TimingConfig(**d["final_timing"])
    return JobConfig(**d)


def log_folder(db_url: str, log_dir: str | None = None) -> Path:
    """Where a job's log goes (``log_dir`` unless None): beside its SQLite database, so that a job
    on ``/data/x.db`` does not leave a ``results/`` folder in whatever directory it was started
    from; ``results/`` for a server database."""
    if log_dir:
        return Path(log_dir)
    db_file = sqlite_file(db_url)
    return Path(db_file).parent if db_file else Path("results")


def attach_log_file(logger: logging.Logger, folder: Path, study: str) -> Path:
    """Send ``logger`` (INFO and up) to ``folder/tune-STUDY.log``, appending: a resumed job
    continues its log.  One job per file: a process that runs several jobs (bench) moves on."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"tune-{re.sub(r'[^A-Za-z0-9_.@-]+', '_', study)}.log"
    for h in list(logger.handlers):
        if isinstance(h, logging.FileHandler) and h.baseFilename != str(path.resolve()):
            logger.removeHandler(h)
            h.close()
    if not any(isinstance(h, logging.FileHandler) for h in logger.handlers):
        h = logging.FileHandler(path)
        h.setFormatter(logging.Formatter(f"%(asctime)s pid={os.getpid()} %(levelname)s %(message)s"))
        logger.addHandler(h)
    logger.setLevel(logging.INFO)
    return path


def _setup_logging(cfg: JobConfig) -> Path:
    path = attach_log_file(log, log_folder(cfg.db_url, cfg.log_dir), cfg.study_name())
    # failed candidates are expected (and logged, with their reason): no Optuna tracebacks
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    return path


def prepare_study(cfg: JobConfig) -> optuna.Study:
    """Create (or load) the study; a new one gets the two reference plans enqueued first."""
    w = get_workload(cfg.space, cfg.tiny)
    target = cfg.target_obj()
    db = PlanDB(cfg.db_url)  # first: creates the file with WAL on, and our tables
    db.put_workload(w.hash, w.name, w.graph_json())
    db.put_target(target.spec, host_fingerprint())
    db.close()
    storage = storage_for(cfg)
    name = cfg.study_name()
    exists = name in {s.study_name for s in optuna.get_all_study_summaries(storage)}
    if cfg.resume and not exists:
        raise JobError(f"--resume: no study named {name!r} in {display_url(cfg.db_url)}")
    study = optuna.create_study(study_name=name, storage=storage, direction="minimize", load_if_exists=True)
    if not exists:
        study.set_user_attr("workload", w.hash)
        study.set_user_attr("space", cfg.space)
        study.set_user_attr("target", target.spec_json)
        space = PlanSpace(w)
        for label in REFERENCE_PLANS:
            study.enqueue_trial(space.params_of(w.reference_plan(label)), user_attrs={"label": label})
        stored = None
        if cfg.warm_start:
            with PlanDB(cfg.db_url) as db:
                stored = stored_best_plan(db, w.hash, target, host_fingerprint())
        for params, label in space.seed_trials(stored, vector_unit(target), cfg.seed_templates):
            study.enqueue_trial(params, user_attrs={"label": label})
    else:
        fail_orphaned_trials(study, storage, grace_s=2 * cfg.heartbeat_s)
        labels = {t.user_attrs.get("label") for t in study.get_trials(deepcopy=False, states=ALIVE)}
        space = PlanSpace(w)
        for label in REFERENCE_PLANS:  # a baseline killed before it ran is measured again
            if label not in labels:
                study.enqueue_trial(space.params_of(w.reference_plan(label)), user_attrs={"label": label})
    return study


def stored_best_plan(db: PlanDB, workload_hash: str, target: Target, host: dict) -> Plan | None:
    """The best plan any earlier job stored for this workload and target (a warm start);
    a stored plan that no longer parses is skipped with a warning, never fatal."""
    best = db.best_plan(workload_hash, target.spec, host=host)
    if best is None:
        return None
    try:
        return Plan.from_json(best.plan_json)
    except Exception as e:  # noqa: BLE001 - stale or damaged stored plan
        log.warning("workload %s: stored best plan not usable: %s", workload_hash, e)
        return None


ALIVE = (optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.RUNNING, optuna.trial.TrialState.WAITING)


def fail_orphaned_trials(study: optuna.Study, storage: optuna.storages.RDBStorage, grace_s: float) -> None:
    """RUNNING trials of a killed job that never got a heartbeat (killed between the
    trial's creation and its first beat, or a model job's trials, which have none):
    Optuna's stale-trial check only looks at trials *with* a heartbeat, so these would
    stay RUNNING forever."""
    import datetime

    import sqlalchemy

    with storage.engine.connect() as con:
        beating = {row[0] for row in con.execute(sqlalchemy.text("SELECT trial_id FROM trial_heartbeats"))}
    now = datetime.datetime.now()
    for t in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,)):
        started = t.datetime_start or now
        if t._trial_id not in beating and (now - started).total_seconds() > grace_s:
            storage.set_trial_state_values(t._trial_id, optuna.trial.TrialState.FAIL)
            log.warning("trial %d: RUNNING without a heartbeat since %s (its job was killed); marked failed",
                        t.number, started)


@dataclass
class JobResult:
    study: str
    workload: str
    target: str
    trials_total: int
    trials_this_job: int
    complete: int
    failed: int
    pruned: int
    wall_s: float
    best: dict[str, Any] | None
    reference: dict[str, float | None]
    final: list[dict[str, Any]]
    overhead: dict[str, float]
    interrupted: bool
    log: str
    measured: int = 0  # trials whose plan was built and measured (the rest: repeats, prescreened, rejected)
    repeats: int = 0  # trials answered from an earlier trial of the same plan
    prescreened: int = 0  # trials the cost model kept from being built

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def run_job(cfg: JobConfig, progress_factory: Any = None) -> JobResult:
    """The whole job: study setup, K workers, final re-measurement, summary."""
    logpath = _setup_logging(cfg)
    study = prepare_study(cfg)
    before = len(study.get_trials(deepcopy=False, states=FINISHED))
    log.info("job start: study %s, %d trials already, config %s", study.study_name, before, _cfg_to_json(cfg))
    t0 = time.perf_counter()
    stop = _StopFlag()
    stop.install()
    procs = []
    ctx = mp.get_context("spawn")
    for k in range(1, cfg.workers):
        p = ctx.Process(target=_spawned_worker, args=(_cfg_to_json(cfg), k))
        p.start()
        procs.append(p)
    progress_cm = progress_factory(cfg, before) if progress_factory else None
    try:
        if progress_cm is not None:
            with progress_cm as update:
                timers = worker_loop(cfg, 0, progress=update, stop=stop)
        else:
            timers = worker_loop(cfg, 0, stop=stop)
    finally:
        for p in procs:
            if stop.requested and p.is_alive():
                p.terminate()  # forwards the stop: the worker finishes its trial in flight
            p.join()
    wall = time.perf_counter() - t0
    final = []
    if not stop.requested:
        announce = getattr(progress_cm, "final_started", None)  # a progress display may say what comes next
        if announce is not None:
            announce(final_seconds(wall), final_wait_seconds(wall))
        final = final_remeasure(cfg, study, job_wall_s=wall, stop=stop)
    return _summarize(cfg, study, before, wall, timers, final, stop.requested, logpath)


def final_candidates(complete: list[optuna.trial.FrozenTrial], top_k: int) -> dict[str, tuple[str, str]]:
    """plan hash -> (plan JSON, label) of the plans a job re-measures at its end: the
    ``top_k`` best-scored plans (whatever found them: sampler, seed, mutation; among plans
    tied with one score, those that ran fastest side by side with the incumbent, as
    ``parent_of`` takes them), the last ``top_k`` plans that won their side-by-side
    comparison with the best (the incumbents: one win in a slow stretch can score a slower
    plan below every earlier best and push them out of the top k; mobilenet_block's
    3-minute final lost its fastest plan so, NOTES 44), each of those incumbents' closest
    tie (the plan that ran fastest beside it without winning: once a later win sets a new
    score it falls out of the top k; mobilenet_block's 10-minute final lost its fastest
    plan so, NOTES 61), and the references, whatever their rank (and named so if the
    search re-found them)."""
    chosen: dict[str, tuple[str, str]] = {}

    def take(t: optuna.trial.FrozenTrial) -> None:
        chosen.setdefault(t.user_attrs["plan_hash"], (t.user_attrs["plan"], t.user_attrs.get("label", "tuned")))

    ranked = [t for t in sorted(complete, key=lambda t: (t.value, side_by_side_ratio(t)))
              if t.user_attrs.get("plan_hash") and t.user_attrs.get("label") not in REFERENCE_PLANS]
    for t in ranked:
        if len(chosen) == top_k:
            break
        take(t)
    incumbents = [t for t in sorted(ranked, key=lambda t: t.number) if (t.user_attrs.get("confirm") or {}).get("faster")]
    for t in incumbents[-top_k:]:
        take(t)
        ties = [u for u in ranked if (u.user_attrs.get("confirm") or {}).get("vs") == t.user_attrs["plan_hash"]
                and side_by_side_ratio(u) < 1.0]
        if ties:
            take(min(ties, key=lambda u: (side_by_side_ratio(u), u.number)))
    for t in complete:
        label = t.user_attrs.get("label")
        if label in REFERENCE_PLANS:
            chosen[t.user_attrs["plan_hash"]] = (t.user_attrs["plan"], label)
    return chosen


def runs_p75(run_medians: list[float]) -> float:
    """The 75th percentile of a plan's per-run medians: the time it keeps in three runs of
    four.  On this shared machine, in one experiment, some plans ran 7% faster than the
    default plan by the median and 17% slower by this, as they slowed down far more in the
    machine's slow stretches (mobilenet_block, NOTES 33): a median of all samples picks
    them, this does not."""
    if len(run_medians) == 1:
        return run_medians[0]
    return statistics.quantiles(run_medians, n=4, method="inclusive")[2]


# The final re-measurement goes on for this share of the job's time (at most FINAL_MAX_S): the
# machine's slow stretches (a few seconds each) came about every 20 s in two 2-minute
# experiments (NOTES 33), and eight quick rounds can fall between two of them.
FINAL_SHARE = 0.1
FINAL_MAX_S = 120.0

# The host's two speed levels (NOTES 45, 48): stretches of seconds to minutes in which kernels
# that wait on memory run up to 1.6x slower.  Plans can tie in one level and differ by 1.4x in
# the other (ew_chain's tie in the slow level, mobilenet_block's in the fast one), so a final
# that has seen one level goes on, up to FINAL_WAIT_SHARE of the job (at most
# FINAL_WAIT_MAX_S), until it has LEVEL_ROUNDS rounds in each; the unfused plan, whose
# intermediates all go through memory, tells the levels apart.
LEVEL_RATIO = 1.25  # the unfused plan's runs: 1.6x apart across the levels, within 10% inside one
LEVEL_ROUNDS = 3
FINAL_WAIT_SHARE = 0.25
FINAL_WAIT_MAX_S = 300.0
LEVEL_MARKERS = ("unfused", "default")  # the first of these a final times marks the levels


def slow_rounds(marker_rounds: list[int], marker_runs: list[float]) -> set[int] | None:
    """The rounds of a final that fell in the host's slow level, by the marker plan's run
    median in each (``marker_runs[i]`` was timed in round ``marker_rounds[i]``), split at the
    geometric mean of its fastest and slowest run; None unless the final has seen both levels:
    runs LEVEL_RATIO apart, and LEVEL_ROUNDS of them in each."""
    if not marker_runs:
        return None
    lo, hi = min(marker_runs), max(marker_runs)
    if hi < LEVEL_RATIO * lo:
        return None
    cut = math.sqrt(lo * hi)
    slow = {r for r, m in zip(marker_rounds, marker_runs) if m >= cut}
    if min(len(slow), len(marker_runs) - len(slow)) < LEVEL_ROUNDS:
        return None
    return slow


@dataclass
class FinalTiming:
    """One plan's runs in a final re-measurement: the samples of each run."""

    runs: list[list[float]] = field(default_factory=list)
    rounds: list[int] = field(default_factory=list)  # the round of each run
    error: str | None = None
    dropped: bool = False  # the final stopped timing it, clearly behind the leader (:func:`narrowed`)

    @property
    def samples(self) -> list[float]:
        return [x for run in self.runs for x in run]

    @property
    def run_medians(self) -> list[float]:
        return [statistics.median(run) for run in self.runs]

    @property
    def p75(self) -> float | None:
        """:func:`runs_p75` of its runs; None for a failed or untimed plan."""
        return runs_p75(self.run_medians) if self.error is None and self.runs else None

    def level_ms(self, slow: set[int]) -> float | None:
        """The geometric mean of its median run in the fast and in the slow rounds (``slow``):
        both levels weigh the same, however long the final spent in each; None where it
        lacks runs in either."""
        fast_runs = [m for r, m in zip(self.rounds, self.run_medians) if r not in slow]
        slow_runs = [m for r, m in zip(self.rounds, self.run_medians) if r in slow]
        if self.error is not None or not fast_runs or not slow_runs:
            return None
        return math.sqrt(statistics.median(fast_runs) * statistics.median(slow_runs))

    def beside(self, other: FinalTiming, rounds: Container[int] | None = None) -> list[tuple[float, float]]:
        """(this plan's run, the other's) in each round both were timed in (of ``rounds``, if
        given): side by side in a round, both ran at the host's level of that round."""
        theirs = dict(zip(other.rounds, other.run_medians))
        return [(m, theirs[r]) for r, m in zip(self.rounds, self.run_medians)
                if r in theirs and (rounds is None or r in rounds)]

    def ratio_to(self, other: FinalTiming) -> float | None:
        """The median of this plan's run over the other's in the rounds both ran (:meth:`beside`)."""
        ratios = [m / theirs for m, theirs in self.beside(other)]
        return statistics.median(ratios) if ratios else None


def level_marker(chosen: dict[str, tuple[str, str]], timed: dict[str, FinalTiming]) -> str | None:
    """The plan whose runs tell the final's speed levels apart: the first of LEVEL_MARKERS
    timed without error."""
    for label in LEVEL_MARKERS:
        for h, (_plan, lab) in chosen.items():
            if lab == label and timed[h].error is None and timed[h].runs:
                return h
    return None


def final_levels(chosen: dict[str, tuple[str, str]], timed: dict[str, FinalTiming]) -> set[int] | None:
    """The final's slow rounds (:func:`slow_rounds`) by its level marker, or None."""
    marker = level_marker(chosen, timed)
    return None if marker is None else slow_rounds(timed[marker].rounds, timed[marker].run_medians)


def final_rank_ms(timed: dict[str, FinalTiming], slow: set[int] | None) -> dict[str, float]:
    """What a final ranks its timed plans by (lower is better): where it saw both speed
    levels (``slow``: :func:`final_levels`), each plan's :meth:`FinalTiming.level_ms` (a
    plan 1.4x slower in one level loses, whichever level the final saw most of), else its
    :func:`runs_p75`.  A plan the final dropped early (:func:`narrowed`), or one without runs
    in both levels where the final saw both, is ranked at the best such plan's rank times
    its :meth:`FinalTiming.ratio_to` that plan (its runs, perhaps all in one level, are not
    comparable with that plan's own), and never ahead of it: the final stopped timing it
    because it was behind, or has not seen it in one of the levels."""
    out = {}
    for h, t in timed.items():
        v = None if t.dropped else t.level_ms(slow) if slow is not None else t.p75
        if v is not None:
            out[h] = v
    if out:
        best = min(out, key=out.__getitem__)
        for h, t in timed.items():
            ratio = t.ratio_to(timed[best]) if h not in out and t.error is None else None
            if ratio is not None:
                out[h] = out[best] * max(ratio, DROPPED_BEHIND)
    return out


# A final narrows (NOTES 61): from round NARROW_AFTER on, before each round, it stops timing
# the plans that lost to the leader in so many of their rounds side by side that two plans of
# one speed would do so with a chance of DROP_P at most (all 3 of 3 rounds, 5 of 6, 7 of 9): a
# sign test, which the host's level of each round does not move.  Its rounds then go to the
# near-ties it has to tell apart (2-5% apart, while one plan's runs spread 10-40% on this host)
# rather than to references and seeds far behind.
NARROW_AFTER = 3
DROP_P = 0.125
DROPPED_BEHIND = 1.001  # a dropped plan ranks at least this far behind the best kept one


def _lost_clearly(pairs: list[tuple[float, float]]) -> bool:
    """A sign test over (plan, leader) runs side by side: at least NARROW_AFTER of them, and
    so few won that plans of one speed would win no more with a chance of DROP_P at most."""
    won = sum(m < lm for m, lm in pairs)
    chance = sum(math.comb(len(pairs), i) for i in range(won + 1)) / 2 ** len(pairs)
    return len(pairs) >= NARROW_AFTER and chance <= DROP_P


def clearly_behind(t: FinalTiming, leader: FinalTiming, slow: set[int] | None = None) -> bool:
    """Whether plan ``t`` lost to ``leader`` in so many of the rounds both ran that plans of
    one speed would rarely (:func:`_lost_clearly`); where the final has seen both speed levels
    (``slow``), in the rounds of each level: plans that tie in one level can be 1.6x apart in
    the other (a mobilenet_block final dropped every plan in the fast level, then kept a
    leader that ran 0.52 ms in the slow one, where the plan it had dropped at 3 minutes ran
    0.36 ms, NOTES 68)."""
    if slow is None:
        return _lost_clearly(t.beside(leader))
    fast = set(t.rounds) - slow
    return _lost_clearly(t.beside(leader, fast)) and _lost_clearly(t.beside(leader, slow))


def narrowed(chosen: dict[str, tuple[str, str]], timed: dict[str, FinalTiming]) -> list[str]:
    """The plans a final goes on timing: those not dropped but those :func:`clearly_behind`
    the leader (by rank so far), which are marked dropped, never the level marker; and once
    the final has seen both speed levels, the dropped plans no longer clearly behind in both
    of them (dropped in one level, they are timed in the other)."""
    active = [h for h in chosen if not timed[h].dropped]
    slow = final_levels(chosen, timed)
    rank = final_rank_ms({h: timed[h] for h in active}, slow)
    if not rank:
        return active
    leader = min(rank, key=rank.__getitem__)
    marker = level_marker(chosen, timed)
    for h in chosen:
        t = timed[h]
        if h in (leader, marker) or t.error is not None:
            continue
        behind = clearly_behind(t, timed[leader], slow)
        if not t.dropped and behind:
            t.dropped = True
        elif t.dropped and slow is not None and not behind:
            t.dropped = False
    return [h for h in chosen if not timed[h].dropped]


def time_final(cfg: JobConfig, chosen: dict[str, tuple[str, str]], seconds: float,
               stop: _StopFlag | None = None, wait_s: float = 0.0) -> dict[str, FinalTiming]:
    """Time the ``chosen`` plans (hash -> (plan JSON, label)) in one worker, interleaved
    over at least ``final_rounds`` rounds and ``seconds`` (whole rounds), and on, up to
    ``wait_s`` in all, while it has not seen both speed levels (:func:`final_levels`).
    From NARROW_AFTER rounds on, plans clearly behind the leader are dropped (:func:`narrowed`).
    Each round links every plan anew but the references of LEVEL_MARKERS: where a build's
    buffers land moves its time by up to 1.4x for as long as it lives (NOTES 62), which a
    plan's median over its rounds sees through only if each round has its own build; the
    markers keep one build, so that their changes over the rounds are the host's levels.
    A plan that fails once is not timed again; a stop (Ctrl-C) ends it at once, keeping
    the runs made."""
    target = cfg.target_obj()
    timed = {h: FinalTiming() for h in chosen}
    timing = asdict(cfg.final_timing)
    with IsolatedRunner(cfg.candidate_timeout_s, cfg.mem_limit_mb) as runner:
        active = list(chosen)
        start = time.perf_counter()

        def waiting() -> bool:
            return time.perf_counter() < start + wait_s and final_levels(chosen, timed) is None

        for k in round_numbers(cfg.final_rounds, until=start + seconds, more=waiting):
            if k >= NARROW_AFTER:
                active = narrowed(chosen, timed)
            for h in active if k % 2 == 0 else reversed(active):  # A B C, then C B A (runner.interleaved)
                if all(t.error for t in timed.values()) or (stop is not None and stop.requested):
                    return timed
                if timed[h].error:
                    continue
                res = runner.run({"space": cfg.space, "tiny": cfg.tiny, "plan": chosen[h][0],
                                  "target": target.spec_json, "timing": timing,
                                  "fresh_build": chosen[h][1] not in LEVEL_MARKERS})
                if res["status"] == OK:
                    timed[h].runs.append(list(res["samples_ms"]))
                    timed[h].rounds.append(k)
                else:
                    timed[h].error = f"{res['status']}: {res.get('error', '')}"
    return timed


def final_seconds(job_wall_s: float) -> float:
    """How long a job of ``job_wall_s`` re-measures its final candidates."""
    return min(FINAL_MAX_S, FINAL_SHARE * job_wall_s)


def final_wait_seconds(job_wall_s: float) -> float:
    """How long, at most, that final goes on waiting to see both speed levels."""
    return max(final_seconds(job_wall_s), min(FINAL_WAIT_MAX_S, FINAL_WAIT_SHARE * job_wall_s))


def final_remeasure(cfg: JobConfig, study: optuna.Study, job_wall_s: float = 0.0,
                    stop: _StopFlag | None = None) -> list[dict[str, Any]]:
    """Re-measure the top-k plans and the references together (:func:`time_final`, for
    ``FINAL_SHARE`` of the job's time, longer until it has seen both speed levels), store
    the results, and return them best first, by :func:`final_rank_ms` (stored as the
    measurement's ``rank_ms``, what the leaderboard ranks finals by)."""
    w = get_workload(cfg.space, cfg.tiny)
    target = cfg.target_obj()
    host = host_fingerprint()
    chosen = final_candidates(study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,)), cfg.top_k)
    if not chosen:
        return []
    log.info("final re-measurement of %d plans: %.0f s, up to %.0f s until both speed levels are seen",
             len(chosen), final_seconds(job_wall_s), final_wait_seconds(job_wall_s))
    timed = time_final(cfg, chosen, final_seconds(job_wall_s), stop, final_wait_seconds(job_wall_s))
    slow = final_levels(chosen, timed)
    rank = final_rank_ms(timed, slow)
    db = PlanDB(cfg.db_url)
    out = []
    for h, (plan_json, label) in chosen.items():
        s, err = timed[h].samples, timed[h].error
        if not s and not err:
            continue  # the job was stopped before this plan was timed: nothing to store
        ok = err is None
        rank_ms = rank.get(h)
        median_ms = statistics.median(s) if ok else None
        plan_id = db.put_plan(w.hash, target.spec, host, h, plan_json, label)
        db.add_measurement(plan_id, median_ms=median_ms, min_ms=min(s) if ok else None,
                           max_ms=max(s) if ok else None, std_ms=statistics.pstdev(s) if ok else None, rank_ms=rank_ms,
                           repeats=len(s), correct=ok, error=err, kind="final",
                           tvm_version=_tvm_version(), autofuse_version=autofuse.__version__, study=study.study_name)
        out.append({"plan_hash": h, "label": label, "correct": ok, "median_ms": median_ms,
                    "rank_ms": rank_ms, "spread_ms": (max(s) - min(s)) if ok else None, "repeats": len(s),
                    "runs_ms": [round(x, 6) for x in timed[h].run_medians], "error": err,
                    "dropped": timed[h].dropped,
                    "slow_runs": None if slow is None else sum(r in slow for r in timed[h].rounds)})
    db.close()
    out.sort(key=lambda r: (not r["correct"], math.inf if r["rank_ms"] is None else r["rank_ms"]))
    log.info("final re-measurement: %s", json.dumps(out))
    return out


def choice_of_shorter_job(cfg: JobConfig, complete: list[optuna.trial.FrozenTrial],
                          job_wall_s: float) -> tuple[str | None, dict[str, Any]]:
    """The plan JSON a job of ``job_wall_s`` would have returned, given the trials it had
    completed when its search ended (``complete``): its final re-measurement over them, for
    its share of that time, nothing stored.  The bench asks this of the first 3 minutes of
    a 10-minute job: a 3-minute job ends in the same final as a 10-minute one, and the best
    score alone is not what it returns (NOTES 34).  Returns (plan JSON or None, details)."""
    chosen = final_candidates(complete, cfg.top_k)
    timed = time_final(cfg, chosen, final_seconds(job_wall_s), wait_s=final_wait_seconds(job_wall_s)) if chosen else {}
    slow = final_levels(chosen, timed)
    ranked = sorted((v, h) for h, v in final_rank_ms(timed, slow).items())
    details = {"candidates": list(chosen), "rank_ms": {h: round(v, 6) for v, h in ranked},
               "rounds": max((len(t.runs) for t in timed.values()), default=0),
               "slow_rounds": None if slow is None else len(slow)}
    return (chosen[ranked[0][1]][0] if ranked else None), details


def _summarize(cfg: JobConfig, study: optuna.Study, before: int, wall: float, timers: Timers,
               final: list[dict[str, Any]], interrupted: bool, logpath: Path) -> JobResult:
    trials = study.get_trials(deepcopy=False)
    by_state = {s: sum(t.state == s for t in trials) for s in FINISHED}
    ref = {}
    for label in REFERENCE_PLANS:
        f = [r for r in final if r["label"] == label and r["correct"]]
        if f:
            ref[label] = f[0]["median_ms"]
        else:
            t = [t for t in trials if t.user_attrs.get("label") == label and t.state == optuna.trial.TrialState.COMPLETE]
            ref[label] = t[0].value if t else None
    best = None
    if final and final[0]["correct"]:
        best = dict(final[0])
    elif by_state[optuna.trial.TrialState.COMPLETE]:
        bt = study.best_trial
        best = {"plan_hash": bt.user_attrs.get("plan_hash"), "label": bt.user_attrs.get("label", "tuned"),
                "median_ms": bt.value, "trial": bt.number}
    if best and best.get("median_ms"):
        for label, v in ref.items():
            best[f"speedup_vs_{label}"] = (v / best["median_ms"]) if v else None
    eval_other = max(0.0, timers.evaluate - timers.build - timers.measure)
    sampler_storage = max(0.0, wall - timers.evaluate - timers.record) if cfg.workers == 1 else timers.suggest
    overhead = {
        "wall_s": wall, "trials_by_this_process": timers.trials,
        "sampler_and_storage_s": sampler_storage, "build_s": timers.build, "measure_s": timers.measure,
        "worker_ipc_and_setup_s": eval_other, "plan_db_s": timers.record,
        "sampler_and_storage_share": sampler_storage / wall if wall else 0.0,
    }
    return JobResult(
        study=study.study_name, workload=get_workload(cfg.space, cfg.tiny).hash, target=cfg.target_obj().spec_json,
        trials_total=len(trials), trials_this_job=sum(t.state in FINISHED for t in trials) - before,
        complete=by_state[optuna.trial.TrialState.COMPLETE], failed=by_state[optuna.trial.TrialState.FAIL],
        pruned=by_state[optuna.trial.TrialState.PRUNED], wall_s=wall, best=best, reference=ref, final=final,
        overhead=overhead, interrupted=interrupted, log=str(logpath),
        measured=sum("seconds" in t.user_attrs for t in trials), repeats=sum(bool(t.user_attrs.get("repeat")) for t in trials),
        prescreened=sum(t.user_attrs.get("status") == "prescreened" for t in trials),
    )
