"""Optuna-guided search over plans, define-by-run.

A trial first picks the graph variant (parameters folded or not), then one
fuse/cut decision per candidate pair of ops (repaired into a legal partition),
then every group's schedule knobs.  Parameter names are stable across trials --
decisions are named by their ops, knobs by the group's anchor op -- so that the
sampler learns which choice helps which kernel whatever the rest of the plan is.
"""

from __future__ import annotations

import bisect
import itertools
import random
import warnings
from collections.abc import Container, Iterable, Iterator
from dataclasses import replace
from typing import Any

import numpy as np
import optuna
from optuna.samplers._tpe import sampler as _tpe_sampler
from optuna.trial import TrialState

from autofuse import cost_model
from autofuse.build import anchor_op, group_anchor, group_shape, partition_of
from autofuse.graph import Graph, default_partition
from autofuse.partition import Decision, choices_for, decisions, epilogues_apart, most_fused, partition_from_choices
from autofuse.plan import Plan, PlanError
from autofuse.schedule import SEED_TEMPLATES, LoopNest, knob_space, resolve_knobs, seed_schedule
from autofuse.target import VectorUnit
from autofuse.workload import REFERENCE_PLANS, Workload

SAMPLERS = ("tpe", "random", "cmaes", "gp")
# Heartbeats, constant_liar and friends are "experimental" in Optuna; they are what jobs rely on.
warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)
warnings.filterwarnings("ignore", message=".*warn_independent_sampling.*", category=FutureWarning)


class SamplerUnavailable(Exception):
    """The requested sampler needs a package that is not installed."""


class SpaceChanged(Exception):
    """The study was created with other choices for a parameter (by an autofuse whose search
    space differed): Optuna cannot continue it."""


def _pick(trial: optuna.Trial, name: str, values: list[Any]) -> Any:
    try:
        return trial.suggest_categorical(name, values)
    except ValueError as e:
        if "dynamic value space" not in str(e):
            raise
        raise SpaceChanged(
            f"study {trial.study.study_name!r} holds parameter {name!r} with other choices than this "
            f"autofuse's {values}: it was made with another search space; tune into a new study "
            "(--study NAME, or another --db); the best plans already stored still warm-start it") from None


def _variant(fold: bool) -> str:
    return "F" if fold else "U"


def decision_param(g: Graph, fold: bool, d: Decision) -> str:
    sep = ">" if d.kind == "edge" else "~"
    return f"{_variant(fold)}:fuse:{g.ops[d.a].name}{sep}{g.ops[d.b].name}"


def knob_param(g: Graph, fold: bool, anchor: int, knob: str) -> str:
    return f"{_variant(fold)}:{g.ops[anchor].name}:{knob}"


_DEFAULT = object()  # a choice left at its default (see PlanSpace.complete)


class PlanSpace:
    """The search space of one workload: how a trial samples a plan, and the params of a given plan."""

    def __init__(self, workload: Workload, overrides: dict[str, Any] | None = None):
        self.workload = workload
        self.overrides = overrides if overrides is not None else workload.space.knobs
        self._group_spaces: dict[tuple[bool, tuple[int, ...]], tuple[int, LoopNest, dict[str, list[Any]]]] = {}

    def suggest(self, trial: optuna.Trial) -> tuple[Plan, list[str]]:
        """Sample a plan; returns it with the list of fuse decisions the repair had to cut."""
        return self._plan(lambda name, values: _pick(trial, name, values))

    def complete(self, params: dict[str, Any]) -> dict[str, Any]:
        """The full params of the plan that ``params`` describe, what they lack at its default:
        a fuse decision as in the default partition, a knob at the group's default.  A
        mutation that turns a fuse decision makes a group whose knobs the best plan never
        had; enqueued without them, the sampler drew them, so the same partial params looked
        new each time they were drawn and the same plan was queued again and again (NOTES 22).
        The params unchanged when a default is outside this space."""
        def given(name: str, _values: list[Any]) -> Any:
            return params.get(name, _DEFAULT)

        try:
            return self.params_of(self._plan(given)[0])
        except PlanError:
            return dict(params)

    def _plan(self, pick: Any) -> tuple[Plan, list[str]]:
        """The plan named by ``pick(param name, choices)``; a pick of ``_DEFAULT`` leaves
        that choice at its default."""
        fold = pick("fold_params", [True, False])
        fold = True if fold is _DEFAULT else fold
        g = self.workload.graph(fold)
        fast = pick("fast_math", [False, True]) if g.uses_transcendentals else False
        fast = False if fast is _DEFAULT else fast
        dag = g.dag()
        choices = [pick(decision_param(g, fold, d), [False, True]) for d in decisions(dag)]
        if _DEFAULT in choices:
            default = choices_for(dag, partition_of(g, self.workload.reference_plan("default", fold)))
            choices = [dc if c is _DEFAULT else c for c, dc in zip(choices, default)]
        part, repairs = partition_from_choices(dag, choices)
        schedules = []
        for group in part:
            a, _, space = self._group_space(fold, group)
            picked = {k: pick(knob_param(g, fold, a, k), values) for k, values in space.items()}
            schedules.append({k: v for k, v in picked.items() if v is not _DEFAULT})
        return self.workload.partition_plan(part, fold, "tuned", schedules, fast), repairs

    def params_of(self, plan: Plan) -> dict[str, Any]:
        """Trial params that make ``suggest`` return ``plan`` (to enqueue reference plans)."""
        fold = plan.fold_params
        g = self.workload.graph(fold)
        dag = g.dag()
        idx = g.index()
        part = tuple(tuple(sorted(idx[o] for o in grp)) for grp in plan.groups)
        params: dict[str, Any] = {"fold_params": fold}
        if g.uses_transcendentals:
            params["fast_math"] = plan.fast_math
        for d, c in zip(decisions(dag), choices_for(dag, part)):
            params[decision_param(g, fold, d)] = c
        for group, sched in zip(part, plan.schedules):
            a, nest, space = self._group_space(fold, group)
            for k, v in resolve_knobs(nest, sched).items():
                if k in space:
                    if v not in space[k]:
                        raise PlanError(f"knob {k}={v!r} of group {g.ops[a].name} is outside the search space")
                    params[knob_param(g, fold, a, k)] = v
        return params

    def params_like(self, plan: Plan, source: Workload) -> dict[str, Any] | None:
        """Params of the plan of ``source`` carried over to this workload, which has the same
        ops wired the same way (see ``regions.structure``) but other shapes: groups mapped op
        by op, each knob kept where this space has its value, a tile too large for a loop
        here shrunk to the largest candidate that fits.  None when the plan does not carry over."""
        fold = plan.fold_params
        g_src, g = source.graph(fold), self.workload.graph(fold)
        if len(g_src.ops) != len(g.ops):
            return None
        pos = g_src.index()
        groups = tuple(tuple(sorted(pos[o] for o in grp)) for grp in plan.groups if all(o in pos for o in grp))
        if len(groups) != len(plan.groups):
            return None
        schedules = []
        for group, sched in zip(groups, plan.schedules):
            _, _, space = self._group_space(fold, group)
            kept = {}
            for k, v in sched.items():
                values = space.get(k)
                if not values:
                    continue
                if v in values:
                    kept[k] = v
                elif isinstance(v, int) and not isinstance(v, bool):
                    fits = [c for c in values if isinstance(c, int) and not isinstance(c, bool) and c <= v]
                    if fits:
                        kept[k] = max(fits)
            schedules.append(kept)
        try:
            return self.params_of(self.workload.partition_plan(groups, fold, "similar", schedules, plan.fast_math))
        except PlanError:
            return None

    def seed_trials(self, stored_best: Plan | None = None, vectors: VectorUnit | None = None,
                    templates: bool = True) -> list[tuple[dict[str, Any], str]]:
        """(params, label) of the plans a new study measures right after its baselines: the
        best plan already stored for this workload and target (a warm start); the default
        partition under schedule templates that often win (see ``seed_schedule``); and the
        most-fused partition (``partition.most_fused``) and the default partition with its
        epilogues apart (``partition.epilogues_apart``), where they differ from the default,
        with default schedules and the same templates.  ``vectors``: the target's vector unit,
        which the templates' register tiles are sized to fit.  ``templates=False``: the stored
        best only (a plain random-search baseline samples the space without this knowledge)."""
        w = self.workload
        seeds: list[tuple[dict[str, Any], str]] = []
        if stored_best is not None:
            try:
                seeds.append((self.params_of(stored_best), "db-best"))
            except PlanError as e:  # stored under an older space: skipped, not fatal
                warnings.warn(f"stored best plan not reused: {e}", stacklevel=2)
        g = w.graph(True)
        default = default_partition(g)
        dag = g.dag()
        partitions = ((default, "seed"), (most_fused(dag), "seed:most-fused"),
                      (epilogues_apart(dag, default), "seed:epilogue-apart")) if templates else ()
        for part, label in partitions:
            nests = [group_anchor(g, grp)[1] for grp in part]
            plans = [w.partition_plan(part, True, label)]  # on the default partition: the default plan, dropped below
            plans += [w.partition_plan(part, True, f"{label}:{name}", [seed_schedule(n, name, vectors) for n in nests])
                      for name in SEED_TEMPLATES]
            if g.uses_transcendentals:  # libm's exp/tanh/erf are scalar calls: the approximations vectorize
                # with the templates too, on the default partition: a plan with both otherwise waits
                # for a mutation to flip the flag (mlp_gelu: 66 s in one run, 420 s in the next;
                # the flip alone was worth 20%, NOTES 35)
                with_templates = plans[1:] if label == "seed" else []
                plans.append(w.partition_plan(part, True, f"{label}:fast_math", fast_math=True))
                plans += [replace(p, label=f"{p.label}:fast_math", fast_math=True) for p in with_templates]
            for plan in plans:
                try:
                    seeds.append((self.params_of(plan), plan.label))
                except PlanError:
                    continue
        known = [self.params_of(w.reference_plan(label)) for label in REFERENCE_PLANS]
        unique = []
        for params, label in seeds:  # a template that changes nothing here is not measured twice
            if params not in known:
                known.append(params)
                unique.append((params, label))
        return unique

    @staticmethod
    def hand_picked(label: str) -> bool:
        """Whether a trial's label names one of ``seed_trials``' plans (a seed template or the
        stored best), rather than a baseline, a sampler's suggestion or a mutation."""
        return label == "db-best" or label == "seed" or label.startswith("seed:")

    def _group_space(self, fold: bool, group: tuple[int, ...]) -> tuple[int, LoopNest, dict[str, list[Any]]]:
        """(the op naming the group's knobs, the anchor's loop nest, the knobs' candidate values).
        Kept per group: every trial and every mutation (``complete``, dozens per trial) asks
        for the same few groups, and working one out hashes the group's PrimFuncs."""
        key = (fold, group)
        if key not in self._group_spaces:
            g = self.workload.graph(fold)
            a, nest = group_anchor(g, group)
            if a < 0:  # an opaque kernel: no knobs
                self._group_spaces[key] = (anchor_op(g, group), nest, {})
            else:
                shape = group_shape(g, group)
                space = knob_space(nest, self.overrides, producers=shape.producers, epilogue=shape.epilogue,
                                   side_reductions=shape.side_reductions, weight=shape.weight,
                                   winograd=shape.winograd)
                self._group_spaces[key] = (anchor_op(g, group), nest, space)
        return self._group_spaces[key]


POOL_SIZE = 32  # neighbours of the best plan the cost model chooses from
EXPLORE = 0.1  # share of mutations taken at random from the pool even when the model is ready
SWEEP = 0.5  # share of model-guided mutations drawn from all the best plan's one-knob neighbours
TOP_PARENTS = 8  # the next-best plans mutated once the best's near neighbourhood is measured


def side_by_side_ratio(trial: optuna.trial.FrozenTrial) -> float:
    """The trial's median over the incumbent's when the two were timed side by side and it
    tied (``CandidateLog.confirm``); 1.0 for the incumbent itself (a winner or a first plan).
    In a disturbed comparison the incumbent's recent time stands for its own."""
    c = trial.user_attrs.get("confirm") or {}
    incumbent_ms = c.get("recent_ms") if c.get("disturbed") else c.get("incumbent_ms")
    if "candidate_ms" not in c or c.get("faster") or not incumbent_ms:
        return 1.0
    return float(c["candidate_ms"]) / float(incumbent_ms)


def parent_of(trials: list[optuna.trial.FrozenTrial]) -> optuna.trial.FrozenTrial | None:
    """The plan mutations start from: the best-scored trial, and among trials tied with it
    (a tie is scored exactly the incumbent's value), the one that ran fastest side by side.
    Optuna's ``best_trial`` takes the first of a tie, which is often the unfused seed plan:
    on resnet_block the default plan and 17 mutations tied with it for 400 s (up to 3%
    faster side by side, not in every round) while every mutation started from the
    13-kernel unfused plan (NOTES 23)."""
    done = [t for t in trials if t.state == optuna.trial.TrialState.COMPLETE and t.value is not None]
    if not done:
        return None
    best = min(t.value for t in done)
    tied = [t for t in done if t.value <= best * (1 + 1e-9)]
    return min(tied, key=lambda t: (side_by_side_ratio(t), t.number))


def runners_up(ranked: Iterable[optuna.trial.FrozenTrial], best: optuna.trial.FrozenTrial,
               k: int) -> list[optuna.trial.FrozenTrial]:
    """The ``k`` fastest plans after ``best``, one trial per plan, from completed trials
    ``ranked`` fastest first (``_TrialIndex.ranked``): only as many are read as it takes."""
    best_plan = best.user_attrs.get("plan_hash", best.number)
    out: dict[Any, optuna.trial.FrozenTrial] = {}
    for t in ranked:
        plan = t.user_attrs.get("plan_hash", t.number)
        if plan != best_plan:
            out.setdefault(plan, t)
            if len(out) == k:
                break
    return list(out.values())


class _TrialIndex:
    """What the mutation step reads from a study's trials, kept up to date as trials finish,
    so that a call costs the trials new since the last one rather than the whole study: the
    parameters of every finished trial (plans measured or tried), the completed trials
    ranked by value, and the trials the cost model learns from. Read anew on every call,
    they made a mutation cost 1003 ms per trial on a 16000-trial mobilenet_block study, more
    than measuring a candidate; 21 ms kept up (``benchmarks/mutation_overhead.py``, NOTES 68)."""

    def __init__(self) -> None:
        self.upto = 0  # trials[:upto] are finished and indexed
        self._beyond: set[int] = set()  # finished trials past ``upto`` indexed already
        self.finished_keys: set[tuple] = set()
        self._ranked: list[tuple[float, int, optuna.trial.FrozenTrial]] = []
        self.done: list[optuna.trial.FrozenTrial] = []  # what the cost model learns from (cost_model.measured)
        self.killed: list[optuna.trial.FrozenTrial] = []

    def update(self, trials: list[optuna.trial.FrozenTrial]) -> list[optuna.trial.FrozenTrial]:
        """Index the trials finished since the last call; returns the unfinished ones (running
        or waiting), whose parameters can still change."""
        unfinished, new = [], []
        for t in trials[self.upto:]:
            if not t.state.is_finished():
                unfinished.append(t)
            elif t.number not in self._beyond:
                self._beyond.add(t.number)
                new.append(t)
        while self.upto < len(trials) and trials[self.upto].state.is_finished():
            self._beyond.discard(trials[self.upto].number)
            self.upto += 1
        ranked = [(t.value, t.number, t) for t in new if t.state == TrialState.COMPLETE and t.value is not None]
        if len(ranked) > 64:  # a study read for the first time: one sort
            self._ranked = sorted(self._ranked + ranked)
        else:
            for r in ranked:
                bisect.insort(self._ranked, r)  # numbers differ: trials themselves are never compared
        self.finished_keys.update(_key(t.params) for t in new)
        done, killed = cost_model.measured(new)
        self.done += done
        self.killed += killed
        return unfinished

    def ranked(self) -> Iterator[optuna.trial.FrozenTrial]:
        """Completed trials, fastest first (ties by trial number)."""
        return (t for _, _, t in self._ranked)

    def tied_with_best(self) -> list[optuna.trial.FrozenTrial]:
        """The completed trials whose value ties the best's (``parent_of`` picks among them)."""
        if not self._ranked:
            return []
        limit = self._ranked[0][0] * (1 + 1e-9)
        return list(itertools.takewhile(lambda t: t.value <= limit, self.ranked()))


class _Seen:
    """Membership in either of two sets of parameter keys, without copying the large one."""

    def __init__(self, finished: set[tuple], pending: set[tuple]):
        self.finished, self.pending = finished, pending

    def __contains__(self, key: object) -> bool:
        return key in self.finished or key in self.pending


def _sampler_repeated(trial: optuna.trial.FrozenTrial | None) -> bool:
    """Whether ``trial`` was the sampler suggesting a plan measured before (pruned as a
    repeat): the sampler is going round measured plans, so a mutation takes the next trial."""
    return (trial is not None and trial.state == optuna.trial.TrialState.PRUNED
            and bool(trial.user_attrs.get("repeat")))


class LocalMutation:
    """Study callback: after a trial, with probability ``rate``, enqueue the best trial's
    (``parent_of``) parameters with one or two of them changed (a tile to its neighbour, a
    flag flipped, a fusion decision turned).  TPE over 50-150 categorical parameters is slow
    to refine a good plan one knob at a time; this is the mutation step of an evolutionary
    search (Ansor's), riding on Optuna's queue so that every worker and the storage see it as
    a normal trial.

    Once a study has enough trials for its cost model (``autofuse.cost_model``), the mutation
    queued is the one the model predicts fastest among ``POOL_SIZE`` unmeasured neighbours
    (a random one with probability ``EXPLORE``).  With probability ``SWEEP`` that pool is
    instead every one-knob neighbour of the best plan not measured yet, so the search walks
    the whole neighbourhood in the model's order rather than drawing from it at random: each
    of an attention job's ten-minute steps was one knob away from a measured plan, found
    after 2-34 of its 134 one-knob neighbours had been measured (NOTES 59).

    Once every neighbour drawn of the best plan has been measured, the pool is drawn from the
    ``TOP_PARENTS`` next-best plans' neighbours instead, and after the sampler suggested a
    plan measured before, a mutation takes the next trial whatever ``rate`` draws: in a
    converged layernorm_residual job the pool was empty for most trials, and half of TPE's
    suggestions were plans it had measured (NOTES 66)."""

    def __init__(self, rate: float = 0.5, seed: int | None = None, max_trials: int | None = None,
                 use_model: bool = True):
        self.rate = rate
        self.rng = random.Random(seed)
        self.seed = seed or 0
        self.max_trials = max_trials  # the study's budget: nothing is queued past it
        self.use_model = use_model and cost_model.available()
        self.models: dict[str, cost_model.CostModel] = {}
        self.spaces: dict[str, PlanSpace] = {}  # by study name: completes mutated params (PlanSpace.complete)
        self._neighbours: dict[str, tuple[int, list[dict[str, Any]]]] = {}  # by study: (parent's number, its sweep)
        self._indexes: dict[str, _TrialIndex] = {}  # by study

    def use_space(self, study_name: str, space: PlanSpace) -> None:
        """Mutations in this study are completed by ``space`` before they are compared with
        what was measured and queued (without it they stay partial, as in a plain study)."""
        self.spaces[study_name] = space

    def model_for(self, study: optuna.Study) -> cost_model.CostModel | None:
        """The study's cost model (fit as trials complete), or None when models are off."""
        if not self.use_model:
            return None
        if study.study_name not in self.models:
            self.models[study.study_name] = cost_model.CostModel(self.seed)
        return self.models[study.study_name]

    def __call__(self, study: optuna.Study, trial: optuna.trial.FrozenTrial | None) -> None:
        if self.rng.random() >= self.rate and not _sampler_repeated(trial):
            return
        trials = study.get_trials(deepcopy=False)  # one storage read for all the checks below
        index = self._indexes.setdefault(study.study_name, _TrialIndex())
        unfinished = index.update(trials)
        if any(t.state == TrialState.WAITING for t in unfinished):
            return  # baselines, seeds or an earlier mutation still queued
        if self.max_trials is not None and len(trials) >= self.max_trials:
            return
        best = parent_of(index.tied_with_best())
        if best is None:  # nothing completed yet
            return
        model = self.model_for(study)
        ready = model is not None and model.update(index.done, index.killed)
        seen = _Seen(index.finished_keys, {_key(t.params) for t in unfinished})
        space = self.spaces.get(study.study_name)
        pool: list[dict[str, Any]] = []
        sweep = ready and self.rng.random() < SWEEP
        if sweep:
            pool = [p for p in self.neighbours(study.study_name, best, space) if _key(p) not in seen]
            sweep = bool(pool)  # else the neighbourhood is spent: draw as below
        if not pool:
            pool = self._draw([best], seen, space, ready)
        if not pool:  # the best's near neighbourhood is spent: the next-best plans' (Ansor's population)
            pool = self._draw(runners_up(index.ranked(), best, TOP_PARENTS), seen, space, ready)
        if not pool:
            return
        attrs: dict[str, Any] = {"label": "mutation", **({"sweep": True} if sweep else {})}
        choice = self.rng.choice(pool) if sweep else pool[0]  # the drawn pool is in random order already
        if ready and self.rng.random() >= EXPLORE:
            predicted = model.predict_ms(pool)
            i = int(predicted.argmin())
            choice, attrs["predicted_ms"] = pool[i], round(float(predicted[i]), 6)
        study.enqueue_trial(choice, user_attrs=attrs)

    def _draw(self, parents: list[optuna.trial.FrozenTrial], seen: Container[tuple], space: PlanSpace | None,
              ready: bool) -> list[dict[str, Any]]:
        """Plans not measured yet, one or two knobs away from one of ``parents`` each: up to
        ``POOL_SIZE`` for the cost model to choose from, one at random without it."""
        pool: list[dict[str, Any]] = []
        if not parents:
            return pool
        for _ in range(2 * POOL_SIZE if ready else 8):  # a few tries for plans not measured yet
            parent = parents[0] if len(parents) == 1 else self.rng.choice(parents)
            params = self.mutate(parent.params, parent.distributions)
            if params is None:
                continue
            if space is not None:
                params = space.complete(params)
            if _key(params) not in seen and params not in pool:
                pool.append(params)
                if not ready or len(pool) == POOL_SIZE:
                    break
        return pool

    def neighbours(self, study_name: str, best: optuna.trial.FrozenTrial,
                   space: PlanSpace | None) -> list[dict[str, Any]]:
        """Every plan one knob away from ``best`` (each other choice of each parameter),
        completed by the study's space; kept while ``best`` stays the parent, since
        completing a hundred plans takes a tenth of a second."""
        cached = self._neighbours.get(study_name)
        if cached is not None and cached[0] == best.number:
            return cached[1]
        out: dict[tuple, dict[str, Any]] = {}
        for name, dist in best.distributions.items():
            if not isinstance(dist, optuna.distributions.CategoricalDistribution):
                continue
            for choice in dist.choices:
                if choice != best.params[name]:
                    params = {**best.params, name: choice}
                    params = space.complete(params) if space is not None else params
                    out.setdefault(_key(params), params)
        out.pop(_key(best.params), None)
        self._neighbours[study_name] = (best.number, list(out.values()))
        return self._neighbours[study_name][1]

    def mutate(self, params: dict[str, Any], dists: dict[str, Any]) -> dict[str, Any] | None:
        names = [n for n, d in dists.items()
                 if isinstance(d, optuna.distributions.CategoricalDistribution) and len(d.choices) > 1]
        if not names:
            return None
        out = dict(params)
        for name in self.rng.sample(names, k=min(len(names), self.rng.choice((1, 1, 2)))):
            choices = list(dists[name].choices)
            i = choices.index(out[name])
            near = [c for j, c in enumerate(choices) if abs(j - i) == 1]
            numeric = all(isinstance(c, int) and not isinstance(c, bool) for c in choices)
            if numeric and near and self.rng.random() < 0.7:  # tiles, unroll steps: the next size up or down
                out[name] = self.rng.choice(near)
            else:
                out[name] = self.rng.choice([c for c in choices if c != out[name]])
        return out


def _key(params: dict[str, Any]) -> tuple:
    """A hashable stand-in for a trial's params (their values are bools, ints and strings)."""
    return tuple(sorted(params.items()))


def mutation_for(sampler: str, rate: float, seed: int | None, max_trials: int | None = None) -> LocalMutation | None:
    """The mutation step of a job, or None: random search stays a pure baseline."""
    return LocalMutation(rate, seed, max_trials) if sampler != "random" and rate > 0 else None


TPE_HISTORY = 1000  # finished trials TPE learns from; a 10-minute job has about 1000-1500
TPE_KEEP_BEST = 100  # of which always the best: TPE's "good" trials are at most its 25 best


class _StudyView:
    """A study as a sampler sees it: only the trials given, everything else the study's own."""

    def __init__(self, study: optuna.Study, trials: list[optuna.trial.FrozenTrial]):
        self._study = study
        self._trials = trials

    def __getattr__(self, name: str) -> Any:
        return getattr(self._study, name)

    def _get_trials(self, deepcopy: bool = False, states: Any = None, use_cache: bool = False) -> list[optuna.trial.FrozenTrial]:
        """The one call through which TPE and its search spaces read a study's trials."""
        return [t for t in self._trials if states is None or t.state in states]


class BoundedTPE(optuna.samplers.BaseSampler):
    """TPE that learns from a study's best trials and its most recent ones, ``history`` in all.

    Every TPE ask rebuilds its estimators in Python passes over the whole history, one per
    knob outside the params all trials share: at 8000 trials of layernorm_residual's space an
    ask took 1121 ms (76 bounded), at 4000 of mobilenet_block's 1907 ms (375 bounded; NOTES
    67), so an overnight job would slow down hour by hour.  TPE's own weights already fade
    its older trials; keeping the best ones keeps its "good" set exact.  Running trials are
    kept for the constant liar."""

    def __init__(self, history: int = TPE_HISTORY, keep_best: int = TPE_KEEP_BEST, **tpe_kwargs: Any):
        self._tpe = optuna.samplers.TPESampler(**tpe_kwargs)
        self._history = history
        self._keep_best = keep_best
        self._view: tuple[int, int, Any] | None = None  # (study id, trial number, view)
        self._split: tuple[int, int, _IndependentSplit | None] | None = None  # the same, for its split

    def _seen(self, study: optuna.Study, trial: optuna.trial.FrozenTrial) -> Any:
        if self._view is not None and self._view[:2] == (study._study_id, trial.number):
            return self._view[2]
        # The cached list TPE itself reads (a private Optuna call, as in TPESampler).
        trials = study._get_trials(deepcopy=False, use_cache=True)
        done = [t for t in trials if t.state in (TrialState.COMPLETE, TrialState.PRUNED)]
        view: Any = study
        if len(done) > self._history:
            complete = [t for t in done if t.state == TrialState.COMPLETE and t.value is not None]
            kept = {t.number for t in sorted(complete, key=lambda t: t.value)[:self._keep_best]}  # type: ignore[arg-type,return-value]
            for t in reversed(done):  # then the latest, up to ``history``
                if len(kept) == self._history:
                    break
                kept.add(t.number)
            view = _StudyView(study, [t for t in trials if t.number in kept or t.state == TrialState.RUNNING])
        self._view = (study._study_id, trial.number, view)
        return view

    def infer_relative_search_space(self, study: optuna.Study, trial: optuna.trial.FrozenTrial) -> dict[str, Any]:
        return self._tpe.infer_relative_search_space(self._seen(study, trial), trial)

    def sample_relative(self, study: optuna.Study, trial: optuna.trial.FrozenTrial, search_space: dict[str, Any]) -> dict[str, Any]:
        return self._tpe.sample_relative(self._seen(study, trial), trial, search_space)

    def sample_independent(self, study: optuna.Study, trial: optuna.trial.FrozenTrial, param_name: str,
                           param_distribution: Any) -> Any:
        view = self._seen(study, trial)
        split = self._split_once(study, view, trial)
        if split is None:  # TPE's start-up trials: random sampling
            return self._tpe.sample_independent(view, trial, param_name, param_distribution)
        return split.sample(param_name, param_distribution)

    def _split_once(self, study: optuna.Study, view: Any, trial: optuna.trial.FrozenTrial) -> _IndependentSplit | None:
        if self._split is None or self._split[:2] != (study._study_id, trial.number):
            self._split = (study._study_id, trial.number, _IndependentSplit.of(self._tpe, view, trial))
        return self._split[2]

    def before_trial(self, study: optuna.Study, trial: optuna.trial.FrozenTrial) -> None:
        self._tpe.before_trial(study, trial)

    def after_trial(self, study: optuna.Study, trial: optuna.trial.FrozenTrial, state: TrialState,
                    values: Any) -> None:
        self._tpe.after_trial(study, trial, state, values)

    def reseed_rng(self) -> None:
        self._tpe.reseed_rng()


class _IndependentSplit:
    """One ask's split of the trials into TPE's "good" and "bad" ones, for every knob it samples
    on its own.

    A plan's knobs depend on its partition, so most of them lie outside the params all trials
    share, and multivariate TPE samples each of those by itself: about 90 per ask on
    mobilenet_block's space.  Optuna's TPE splits the whole history anew for each of them, the
    same split every time, then keeps the trials that have the knob: at 1000 trials an ask
    took 350-500 ms (NOTES 69).  This makes the split once per ask and samples each knob as
    TPESampler._sample does, through the same calls in the same order, so a seeded study draws
    the same plans (tests/test_tune.py checks it).  It reads TPE's private parts, which is why
    pyproject.toml pins Optuna's minor version."""

    def __init__(self, tpe: optuna.samplers.TPESampler, below: list[dict[str, Any]], above: list[dict[str, Any]]):
        self._tpe = tpe
        self._below = below  # the params of TPE's good trials, in trial order
        self._above = above

    @classmethod
    def of(cls, tpe: optuna.samplers.TPESampler, view: Any, trial: optuna.trial.FrozenTrial) -> _IndependentSplit | None:
        """The split ``tpe`` would make for ``trial``; None while TPE still samples at random."""
        finished = view._get_trials(deepcopy=False, states=(TrialState.COMPLETE, TrialState.PRUNED), use_cache=True)
        if len(finished) < tpe._n_startup_trials:
            return None
        liar = tpe._constant_liar
        states = (TrialState.COMPLETE, TrialState.PRUNED) + ((TrialState.RUNNING,) if liar else ())
        trials = view._get_trials(deepcopy=False, states=states, use_cache=not liar)
        if liar:
            trials = [t for t in trials if t.number != trial.number]
        gamma = tpe._gamma if tpe._gamma is not None else _tpe_sampler.default_gamma
        n = sum(t.state != TrialState.RUNNING for t in trials)
        below, above = _tpe_sampler._split_trials(view, trials, gamma(n))
        return cls(tpe, [tpe._get_params(t, view) for t in below], [tpe._get_params(t, view) for t in above])

    def sample(self, name: str, distribution: Any) -> Any:
        tpe = self._tpe
        space = {name: distribution}

        def estimator(part: list[dict[str, Any]]) -> Any:
            # TPESampler._build_parzen_estimator of a single-objective study, with the knob's
            # values read from params fetched once per ask rather than once per knob.
            seen = np.asarray([distribution.to_internal_repr(p[name]) for p in part if name in p])
            return tpe._parzen_estimator_cls({name: seen}, space, tpe._parzen_estimator_parameters)

        mpe_below, mpe_above = estimator(self._below), estimator(self._above)
        samples = mpe_below.sample(tpe._rng.rng, tpe._n_ei_candidates)
        best = tpe._compare(samples, tpe._compute_acquisition_func(samples, mpe_below, mpe_above))
        return distribution.to_external_repr(best[name])


def make_sampler(name: str, seed: int | None, workers: int = 1) -> optuna.samplers.BaseSampler:
    """TPE (default), random, CMA-ES or GP. Categorical knobs: CMA-ES and GP fall back to
    independent sampling for them, which Optuna warns about once; we silence that."""
    if name == "tpe":
        return BoundedTPE(seed=seed, multivariate=True, constant_liar=workers > 1, n_startup_trials=10)
    if name == "random":
        return optuna.samplers.RandomSampler(seed=seed)
    if name == "cmaes":
        try:
            import cmaes  # noqa: F401
        except ImportError:
            raise SamplerUnavailable("--sampler cmaes needs the 'cmaes' package (pip install cmaes)") from None
        return optuna.samplers.CmaEsSampler(seed=seed, warn_independent_sampling=False)
    if name == "gp":
        try:
            import torch  # noqa: F401
        except ImportError:
            raise SamplerUnavailable("--sampler gp needs PyTorch: pip install 'autofuse[gp]'") from None
        return optuna.samplers.GPSampler(seed=seed)
    raise SamplerUnavailable(f"unknown sampler {name!r}; choose one of {', '.join(SAMPLERS)}")
