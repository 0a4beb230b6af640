"""Whole-model tuning: tune every distinct region of a model, stitch, verify, store.

1. The model (an ONNX file, see :mod:`autofuse.onnx_import`) is cut into regions
   (:mod:`autofuse.regions`); equal regions are tuned once.
2. Every distinct region has an Optuna study of its own in the job's storage, named by
   the region's hash and the target, shared by every model that holds the region: a
   rerun (after a crash, or another model) continues its history.  A new study starts
   from the TVM default plan and, when the plan DB already has a verified plan for the
   region (from an earlier job), from that plan too, then the schedule templates of
   ``PlanSpace.seed_trials`` (all enqueued; every region measures its default before
   any region its second plan).  After that, three trials in four of a region mutate its
   best plan (``LocalMutation``), the others come from the sampler; and when a region
   of the same structure (``regions.structure``: the same ops, other shapes) has found a
   better plan, that plan, carried over, is measured first (label ``similar``).
3. The rest of the trial budget goes, one trial at a time, to the region with the
   highest Ansor-style priority: its share of the model's time (instances x best
   latency) times how much it is still improving (best latency gained over its
   last few trials), plus an optimistic term for regions tried little.
4. The best verified plan of every region (from the DB: this run and earlier ones)
   is stitched into one plan for the whole model, which is built as one Relax
   module, checked against onnxruntime and timed next to the model's default plan;
   both land in the DB as ``final`` measurements of the model's workload, which is
   what ``deploy.load(db, "model.onnx")`` and ``autofuse export`` read.

Every candidate runs in one isolated worker process (a crash costs one trial).
"""

from __future__ import annotations

import json
import logging
import time
import warnings
from dataclasses import asdict, dataclass, field
from typing import Any, Callable

import optuna

optuna.logging.set_verbosity(optuna.logging.WARNING)

from autofuse.db import DEFAULT_URL, PlanDB
from autofuse.job import ALIVE, attach_log_file, fail_orphaned_trials, log_folder, store_result, stored_best_plan
from autofuse.measure import TimingConfig
from autofuse.onnx_import import MODEL_PREFIX, parse_spec
from autofuse.plan import Plan
from autofuse.regions import model_regions, stitch, structure
from autofuse.cost_model import mark_prescreened, prescreen
from autofuse.runner import OK, CandidateLog, IsolatedRunner, pruned_as_repeat, value_of
from autofuse.search import PlanSpace, make_sampler, mutation_for
from autofuse.storage import open_storage
from autofuse.target import Target, host_fingerprint, parse_target, vector_unit
from autofuse.workload import Workload, get_workload

log = logging.getLogger("autofuse.model_job")


@dataclass
class ModelTuneConfig:
    model: str  # model spec (onnx_import.model_spec)
    target: str = "llvm"
    trials: int | None = None  # total region trials this job (None: 4 per distinct region)
    timeout_s: float | None = None
    db_url: str = DEFAULT_URL
    seed: int | None = 0
    sampler: str = "tpe"
    timing: TimingConfig = field(default_factory=lambda: TimingConfig(repeats=5, min_repeat_ms=20, warmup=1))
    final_timing: TimingConfig = field(default_factory=lambda: TimingConfig(repeats=5, min_repeat_ms=50, warmup=2))
    candidate_timeout_s: float = 300.0
    mem_limit_mb: int | None = None
    window: int = 3  # trials over which a region's improvement is measured
    mutation_rate: float = 0.75  # share of a region's trials that mutate its best plan (none with "random"); NOTES 22


def region_spec(model_spec: str, h: str) -> str:
    path, shapes = parse_spec(model_spec)
    return MODEL_PREFIX + json.dumps({"path": path, "shapes": {k: list(v) for k, v in shapes.items()}, "region": h},
                                     sort_keys=True, separators=(",", ":"))


def model_graph_json(w: Workload) -> str:
    """The workload row of a model: its graph plus where it came from (so a name finds the file)."""
    d = w.graph(False).to_json()
    d["model_source"] = w.space.source
    return json.dumps(d, sort_keys=True)


def register_model(w: Workload, db_url: str) -> dict[str, Any]:
    """Put the model and its distinct regions in the plan DB as workloads."""
    rs = model_regions(w)
    db = PlanDB(db_url)
    try:
        db.put_workload(w.hash, w.name, model_graph_json(w))
        for h, rw in rs.workloads.items():
            db.put_workload(rw.hash, rw.name, rw.graph_json())
    finally:
        db.close()
    return {"workload": w.name, "hash": w.hash, "ops": len(w.graph(True).ops), "regions": len(rs.instances),
            "distinct_regions": len(rs.distinct)}


@dataclass
class _RegionState:
    h: str
    w: Workload
    count: int
    study: optuna.Study
    space: PlanSpace
    queued: int = 0
    trials: int = 0
    best_ms: float | None = None
    best_plan: Plan | None = None
    history: list[float] = field(default_factory=list)  # best-so-far after each trial
    default_ms: float | None = None
    candidates: CandidateLog = field(default_factory=CandidateLog)
    structure: tuple = ()  # regions.structure: regions alike hand each other their best plans
    offered: set[str] = field(default_factory=set)  # plan hashes of alike regions already queued here

    def priority(self, window: int, total_trials: int) -> float:
        if self.queued:  # every region's default first, then the rest of every queue in turn
            return float("inf") if self.trials == 0 else 1e12 - self.trials
        if self.best_ms is None:
            return 1e9 - self.trials  # nothing worked yet: keep trying, least tried first
        share = self.count * self.best_ms
        if len(self.history) > window:
            gain = (self.history[-window - 1] - self.history[-1]) / window  # backward gradient
        else:
            gain = self.best_ms  # too few trials to tell: assume it can still improve a lot
        optimistic = self.best_ms / (self.trials + 1)
        return self.count * (0.5 * gain + 0.5 * optimistic) + 1e-6 * share


def tune_model(cfg: ModelTuneConfig, progress: Callable[[dict[str, Any]], None] | None = None) -> dict[str, Any]:
    t_start = time.perf_counter()
    w = get_workload(cfg.model)
    rs = model_regions(w)
    target = parse_target(cfg.target)
    host = host_fingerprint()
    reg = register_model(w, cfg.db_url)
    db = PlanDB(cfg.db_url)
    db.put_target(target.spec, host)
    study_name = f"{w.name}@{target.kind}-{w.hash[:8]}#regions"
    logpath = attach_log_file(log, log_folder(cfg.db_url), study_name)
    log.info("model job start: %s, %d regions (%d distinct), config %s", w.name, len(rs.instances), len(rs.distinct),
             json.dumps(asdict(cfg), default=str))
    storage = open_storage(cfg.db_url)
    states = [_region_state(cfg, storage, db, target, host, h, rw, rs.count(h), i)
              for i, (h, rw) in enumerate(rs.workloads.items())]
    mutation = mutation_for(cfg.sampler, cfg.mutation_rate, cfg.seed)
    if mutation is not None:
        for st in states:
            mutation.use_space(st.study.study_name, st.space)
    if cfg.trials is not None:
        budget: int | None = cfg.trials
    else:  # a timeout alone: trials until it (budget None); neither: a short default job
        budget = None if cfg.timeout_s is not None else 4 * len(states)
    deadline = None if cfg.timeout_s is None else time.time() + cfg.timeout_s
    timing = asdict(cfg.timing)
    done = 0
    curve: list[tuple[float, float]] = []  # (seconds, model estimate) once every region has a best

    def estimate(attr: str = "best_ms") -> float | None:
        vals = [(s.count, getattr(s, attr)) for s in states]
        return None if any(v is None for _, v in vals) else sum(c * v for c, v in vals)

    with IsolatedRunner(cfg.candidate_timeout_s, cfg.mem_limit_mb) as runner:
        while (budget is None or done < budget) and (deadline is None or time.time() < deadline):
            st = max(states, key=lambda s: s.priority(cfg.window, done))
            if not st.queued:
                _offer_similar(st, states)
            trial = st.study.ask()
            label = trial.user_attrs.get("label", "tuned")
            trial.set_user_attr("label", label)
            if st.queued:
                st.queued -= 1
            plan, _ = st.space.suggest(trial)
            trial.set_user_attr("plan", plan.to_json())  # a resumed job compares new candidates against its best
            predicted = None if label != "tuned" or mutation is None else \
                prescreen(mutation.model_for(st.study), trial.params, st.candidates.best_ms)
            if predicted is not None:  # the cost model expects it far slower than the region's best: not built
                mark_prescreened(trial, plan.to_json(), predicted, st.candidates.best_ms)
                st.study.tell(trial, state=optuna.trial.TrialState.PRUNED)
                st.trials += 1
                done += 1
                st.history.append(st.best_ms)
                continue
            res = st.candidates.run(runner, {"space": region_spec(cfg.model, st.h), "plan": plan.to_json(),
                                             "target": target.spec_json, "timing": timing},
                                    plan.hash, cfg.candidate_timeout_s, PlanSpace.hand_picked(label))
            ok = res["status"] == OK
            CandidateLog.mark(trial, plan.hash, res)
            if not res.get("repeat"):  # a repeat was measured before in this region's study: nothing new to store
                store_result(db, st.w.hash, target, host, plan, label, res, kind="trial", study=study_name,
                             trial_number=done)
            if pruned_as_repeat(label, res):
                finished = st.study.tell(trial, state=optuna.trial.TrialState.PRUNED)
            elif ok:
                value = value_of(res)
                finished = st.study.tell(trial, value)
                if st.best_ms is None or value < st.best_ms:
                    st.best_ms, st.best_plan = value, plan
                if label == "default":
                    st.default_ms = value
            else:
                finished = st.study.tell(trial, state=optuna.trial.TrialState.FAIL)
            st.trials += 1
            done += 1
            if st.best_ms is not None:
                st.history.append(st.best_ms)
            if mutation is not None and not st.queued:  # queued in the study, not a priority seed
                mutation(st.study, finished)
            info = {"trial": done, "budget": budget, "region": st.h, "region_index": states.index(st) + 1,
                    "regions": len(states), "instances": st.count, "label": label, "status": res["status"],
                    "ms": res.get("median_ms"), "region_best_ms": st.best_ms, "error": res.get("error"),
                    "model_estimate_ms": estimate(), "model_default_estimate_ms": estimate("default_ms"),
                    "regions_untried": sum(s.trials == 0 for s in states)}
            est = info["model_estimate_ms"]
            if est is not None and (not curve or est < curve[-1][1]):
                curve.append((time.perf_counter() - t_start, est))
            log.info("model tune %s", json.dumps(info, default=str))
            if progress:
                progress(info)

        # ---- stitch the best verified plan of every region (DB: this run and earlier ones)
        plans: dict[str, Plan] = {}
        for st in states:
            best = db.best_plan(st.w.hash, target.spec, host=host)
            if best is not None:
                plans[st.h] = Plan.from_json(best.plan_json)
        stitched = stitch(rs, plans)
        final = {}
        for label, plan in (("default", w.reference_plan("default")), ("stitched", stitched)):
            res = runner.run({"space": cfg.model, "plan": plan.to_json(), "target": target.spec_json,
                              "timing": asdict(cfg.final_timing)})
            store_result(db, w.hash, target, host, plan, label, res, kind="final", study=study_name)
            final[label] = {"plan_hash": plan.hash, "groups": len(plan.groups), "status": res["status"],
                            "median_ms": res.get("median_ms"), "max_rel_err": res.get("max_rel_err"),
                            "error": res.get("error")}
    db.close()
    log.info("model job end: %s", json.dumps(final, default=str))
    d, s = final["default"].get("median_ms"), final["stitched"].get("median_ms")
    return {
        **reg, "study": study_name, "target": target.spec, "trials": done, "budget": budget,
        "wall_s": time.perf_counter() - t_start,
        "regions_detail": [{"hash": st.h, "instances": st.count, "ops": len(st.w.graph(True).ops), "trials": st.trials,
                            "default_ms": st.default_ms, "best_ms": st.best_ms} for st in states],
        "estimate_ms": estimate(), "default_estimate_ms": estimate("default_ms"), "curve": curve,
        "final": final, "speedup_vs_default": (d / s) if d and s else None, "log": str(logpath),
    }


def _offer_similar(st: _RegionState, states: list[_RegionState]) -> None:
    """Queue, carried over to ``st``, the best plan of a region with the same structure (the
    one most improved over its default), once per plan: a schedule that won on one
    conv-BN-activation layer is a good first guess for its siblings of other sizes."""
    donors = [o for o in states if o is not st and o.structure == st.structure and o.best_plan is not None
              and o.best_plan.hash not in st.offered]
    if not donors:
        return
    donor = min(donors, key=lambda o: (o.best_ms or 1.0) / (o.default_ms or o.best_ms or 1.0))
    st.offered.add(donor.best_plan.hash)
    params = st.space.params_like(donor.best_plan, donor.w)
    if params is None or params in [t.params for t in st.study.get_trials(deepcopy=False)]:
        return
    st.study.enqueue_trial(params, user_attrs={"label": "similar"})
    st.queued += 1


def region_study_name(rw: Workload, target: Target) -> str:
    """One Optuna study per region and target, shared by every model holding the region."""
    return f"region-{rw.hash}@{target.tag}"


def _region_state(cfg: ModelTuneConfig, storage: optuna.storages.BaseStorage, db: PlanDB, target: Target,
                  host: dict, h: str, rw: Workload, count: int, i: int) -> _RegionState:
    """The region's study, created or continued: a new one gets the default plan, the DB's best
    and the seed templates queued; a continued one its history back (trials, best, default)
    and its default queued again only if it never completed."""
    sampler = make_sampler(cfg.sampler, None if cfg.seed is None else cfg.seed + i)
    name = region_study_name(rw, target)
    study = optuna.create_study(study_name=name, storage=storage, sampler=sampler, direction="minimize",
                                load_if_exists=True)
    st = _RegionState(h, rw, count, study, PlanSpace(rw), structure=structure(rw))
    st.best_plan = stored_best_plan(db, rw.hash, target, host)  # what alike regions may borrow
    fail_orphaned_trials(study, storage, grace_s=cfg.candidate_timeout_s + 60)  # no live job runs one that long
    trials = study.get_trials(deepcopy=False)
    st.candidates = CandidateLog.from_trials(trials)
    for t in trials:
        if t.state not in (optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.FAIL,
                           optuna.trial.TrialState.PRUNED):
            continue
        st.trials += 1
        if t.state == optuna.trial.TrialState.COMPLETE:
            st.best_ms = t.value if st.best_ms is None else min(st.best_ms, t.value)
            if t.user_attrs.get("label") == "default":
                st.default_ms = t.value
        if st.best_ms is not None:
            st.history.append(st.best_ms)
    labels = {t.user_attrs.get("label") for t in trials if t.state in ALIVE}
    if "default" not in labels:
        study.enqueue_trial(st.space.params_of(rw.reference_plan("default")), user_attrs={"label": "default"})
    if not trials:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # a stored plan outside today's space is skipped
            for params, label in st.space.seed_trials(st.best_plan, vector_unit(target)):
                study.enqueue_trial(params, user_attrs={"label": label})
    st.queued = _waiting(study)
    return st


def _waiting(study: optuna.Study) -> int:
    return len(study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.WAITING,)))

