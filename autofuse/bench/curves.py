"""Best-so-far curves of a tuning study, and what they say about the search: when it got
within 5% of its final best, and how it compares with random sampling at equal trials."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class _Point:
    """One finished trial of a study, from its first verified plan on."""

    seconds: float  # since the study's first trial started
    measured: int  # candidates measured so far, this one included
    built: bool  # whether this trial was one (not a repeat or a pre-screened plan)
    best: Any  # the best trial so far (an optuna FrozenTrial)


class StudyHistory:
    """A study's best-so-far after each finished trial, read from storage once: the bench asks
    it for curves and for the best plan at several moments of the same study."""

    def __init__(self, db_url: str, study_name: str):
        import optuna

        study = optuna.load_study(study_name=study_name, storage=db_url)
        trials = sorted((t for t in study.trials if t.datetime_complete), key=lambda t: t.datetime_complete)
        self.points: list[_Point] = []
        self._trials = trials
        if not trials:
            return
        t0 = self._t0 = min(t.datetime_start for t in trials)
        best, measured = None, 0
        for t in trials:
            built = "seconds" in t.user_attrs
            measured += built
            if t.state == optuna.trial.TrialState.COMPLETE and (best is None or t.value < best.value):
                best = t
            if best is not None:
                self.points.append(_Point((t.datetime_complete - t0).total_seconds(), measured, built, best))

    def curves(self) -> tuple[list[tuple[float, float]], list[tuple[int, float]]]:
        """Best-so-far ms, in the order the trials finished, against two clocks: seconds since
        the first trial started, and candidates measured so far.

        Measured: the candidates built and run (timed out and failed ones too: their time was
        spent), as tuners count measurement trials. Not measured: a plan suggested again (its
        earlier result is reused) and one the cost model skipped; both take milliseconds, and
        the guided search makes many more of them than random sampling does."""
        by_time = [(p.seconds, p.best.value) for p in self.points]
        by_measured = [(p.measured, p.best.value) for p in self.points if p.built]
        return by_time, by_measured

    def best_plan_after(self, n: int | None = None, seconds: float | None = None) -> str | None:
        """Plan JSON of the best-so-far after ``n`` measured candidates, or ``seconds`` after
        the first trial started (None before any verified plan)."""
        plan = None
        for p in self.points:
            if (n is not None and p.measured > n) or (seconds is not None and p.seconds > seconds):
                break
            plan = p.best.user_attrs.get("plan")
        return plan

    def complete_before(self, seconds: float) -> list[Any]:
        """The trials (optuna FrozenTrials) completed with a value within ``seconds`` of the
        first trial's start: what a job of that budget would have had when its search ended."""
        import optuna

        return [t for t in self._trials if t.state == optuna.trial.TrialState.COMPLETE and t.value is not None
                and (t.datetime_complete - self._t0).total_seconds() <= seconds]


def search_curves(db_url: str, study_name: str) -> tuple[list[tuple[float, float]], list[tuple[int, float]]]:
    """:meth:`StudyHistory.curves` of one study."""
    return StudyHistory(db_url, study_name).curves()


def best_at(curve: list[tuple[int, float]] | list[list[float]], n: int) -> float | None:
    """The best-so-far after ``n`` measured candidates (None before the first verified plan)."""
    best = None
    for k, v in curve:
        if k > n:
            break
        best = v
    return best


def random_kind(vs_random: dict[str, Any] | None) -> str:
    """"plain" or "seeded": which random search a report row's ``search_vs_random`` compared
    with (rows of reports older than the mark were seeded)."""
    return "seeded" if (vs_random or {}).get("random_seeded", True) else "plain"


def search_vs_random(guided: list[tuple[int, float]], rand: list[tuple[int, float]]) -> dict[str, Any]:
    """Guided search (TPE, mutations, cost model) against random sampling of the same space,
    both from the same reference plans (seeded: and seed plans), given their best-so-far per candidates
    measured: the best each had after the same number of measured candidates (the smaller
    of the two counts), and at the end of the same wall-clock budget.  These are each job's
    own scores, anchored in its own first minutes; the bench also times the two plans at
    equal trials side by side (``side_by_side``), which is the comparison to read."""
    out: dict[str, Any] = {"autofuse_trial_curve": guided, "random_trial_curve": rand}
    if guided and rand:
        n = min(guided[-1][0], rand[-1][0])
        g, r = best_at(guided, n), best_at(rand, n)
        out["search_vs_random"] = {
            "equal_trials": n, "guided_ms": g, "random_ms": r,
            "random_over_guided": (r / g) if g and r else None,
            "guided_trials": guided[-1][0], "random_trials": rand[-1][0],
            "same_budget_random_over_guided": rand[-1][1] / guided[-1][1]}
    return out


def reached_95pct_at(curve: list[tuple[float, float]]) -> float | None:
    """Seconds until the best-so-far first came within 5% of the final best (None: no curve)."""
    if not curve:
        return None
    final = curve[-1][1]
    return next((t for t, v in curve if v <= final / 0.95), None)
