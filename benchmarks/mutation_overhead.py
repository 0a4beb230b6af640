"""What the mutation step costs per trial as a study grows (results/NOTES.md section 68), or
with ``--ask`` what a TPE ask costs (section 69).

    .venv/bin/python benchmarks/mutation_overhead.py mobilenet_block --sizes 1000,4000,16000
    .venv/bin/python benchmarks/mutation_overhead.py mobilenet_block --ask --sizes 250,1000,4000

For each size N: an in-memory study of N random plans of the space (values drawn at random,
the attributes a job writes), then ``--calls`` trials more, one at a time, each followed by
the job's mutation callback (rate 1: it runs after every trial; the queueing itself is left
out, so that every call does the full work). Prints the median and the mean per call (the
mean includes the cost model's refits) and the slowest call. No TVM build, no measurement:
only the search's own bookkeeping, which a long job pays on every trial.  With ``--ask``, each
of the ``--calls`` trials is asked of the job's TPE sampler (``make_sampler("tpe")``) and its
plan drawn, which is what a job pays for every trial TPE proposes.
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
import warnings

import optuna

from autofuse.search import LocalMutation, PlanSpace, make_sampler
from autofuse.workload import get_workload


def random_trials(space: PlanSpace, n: int, seed: int = 0) -> list[optuna.trial.FrozenTrial]:
    """``n`` finished trials of random plans, with the attributes a tuning job writes."""
    source = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=seed))
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        trial = source.ask()
        plan, _ = space.suggest(trial)
        source.tell(trial, state=optuna.trial.TrialState.FAIL)
        out.append(optuna.trial.create_trial(
            params=trial.params, distributions=trial.distributions, value=rng.lognormvariate(0, 0.5),
            user_attrs={"plan_hash": plan.hash, "label": "tuned", "status": "ok"}))
    return out


def per_call_ms(space: PlanSpace, trials: list[optuna.trial.FrozenTrial], n: int, calls: int) -> list[float]:
    study = optuna.create_study()
    study.add_trials(trials[:n])
    study.enqueue_trial = lambda *_a, **_k: None  # nothing stays queued: every call does the full work
    mutation = LocalMutation(rate=1.0, seed=0)
    mutation.use_space(study.study_name, space)
    mutation(study, trials[n - 1])  # the first call reads the whole study and fits the model
    out = []
    for t in trials[n:n + calls]:
        study.add_trial(t)
        t0 = time.perf_counter()
        mutation(study, t)
        out.append((time.perf_counter() - t0) * 1000)
    return out


def per_ask_ms(space: PlanSpace, trials: list[optuna.trial.FrozenTrial], n: int, calls: int) -> list[float]:
    study = optuna.create_study(sampler=make_sampler("tpe", seed=0))
    study.add_trials(trials[:n])
    out = []
    for t in trials[n:n + calls]:
        t0 = time.perf_counter()
        trial = study.ask()
        space.suggest(trial)
        out.append((time.perf_counter() - t0) * 1000)
        study.tell(trial, t.value)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("space")
    ap.add_argument("--sizes", default="1000,4000,16000", help="study sizes, comma-separated")
    ap.add_argument("--calls", type=int, default=40, help="trials added and mutation calls timed per size")
    ap.add_argument("--ask", action="store_true", help="time the job's TPE asks instead of the mutation step")
    args = ap.parse_args()
    warnings.filterwarnings("ignore")
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    space = PlanSpace(get_workload(args.space, False))
    sizes = [int(s) for s in args.sizes.split(",")]
    trials = random_trials(space, max(sizes) + args.calls)
    what, timed = ("TPE ask and plan draw", per_ask_ms) if args.ask else ("mutation callback", per_call_ms)
    print(f"{args.space}: {what} per trial, {args.calls} calls per study size")
    print(f"{'trials':>8} {'median ms':>10} {'mean ms':>8} {'slowest ms':>11}")
    for n in sizes:
        ms = timed(space, trials, n, args.calls)
        print(f"{n:>8} {statistics.median(ms):>10.1f} {statistics.fmean(ms):>8.1f} {max(ms):>11.0f}", flush=True)


if __name__ == "__main__":
    main()
