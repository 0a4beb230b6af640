"""A learned cost model: a plan's time predicted from its trial parameters.

Measuring a candidate costs a TVM build and timed runs (0.3-5 s); predicting costs
microseconds.  As in Ansor and MetaSchedule, a gradient-boosted tree model (XGBoost),
refit as trials complete, decides what is worth measuring:

- the mutation step draws many neighbours of the best plans and measures the one the
  model ranks fastest (instead of one neighbour at random);
- a plan the sampler suggests that the model predicts to be ``PRESCREEN_FACTOR`` times
  slower than the best is not built (the trial is pruned, with the prediction as reason).

Features are Optuna's own parameters (fuse decisions and per-group knobs, named by op, see
``autofuse.search``): tiles and unroll steps on a log scale, flags as 0/1, a parameter the
plan does not have as missing.  Offline, on the trials of a 2-minute bench (results/NOTES.md
section 11), a model fit on the first 60% of a study ranked the rest with Spearman 0.5-0.9
on six of eight spaces.
"""

from __future__ import annotations

import math
import re
import zlib
from typing import Any

import numpy as np
import optuna

MIN_TRIALS = 20  # measured trials (completed or timed out) before the model is fit at all
MIN_COMPLETED = 5  # of which completed: the scale that timeouts are learned against
REFIT_EVERY = 8  # new measured trials between refits (a new timeout refits at once) ...
REFIT_SHARE = 100  # ... or this share of those it was fit on, if more: a refit costs the whole study
PRESCREEN_FACTOR = 8.0
TIMEOUT_PENALTY = 10.0  # a timed-out candidate is learned as this many times the slowest completed one
_LOG_SCALE = re.compile(r":(t\d+|r\d+|unroll|reduce_vector)$")


def available() -> bool:
    try:
        import xgboost  # noqa: F401
    except ImportError:
        return False
    return True


def _value(name: str, v: Any) -> float:
    if isinstance(v, bool):
        return float(v)
    if isinstance(v, (int, float)):
        return math.log2(v) if v > 0 and _LOG_SCALE.search(name) else float(v)
    return float(zlib.crc32(str(v).encode()) % 1024)


class CostModel:
    """Predicts log milliseconds of a study's plans from their parameters."""

    def __init__(self, seed: int = 0):
        self.seed = seed
        self.names: list[str] = []
        self._booster: Any = None
        self._fitted_on = 0  # trials (completed + timed out) in the last fit
        self._killed_on = 0  # timed-out trials in the last fit
        self._ids: dict[str, int] = {}  # every parameter name learned from, numbered as first seen
        self._rows: dict[int, tuple[dict[str, Any], np.ndarray, np.ndarray]] = {}  # trial number -> its encoding

    @property
    def ready(self) -> bool:
        return self._booster is not None

    def encode(self, params_list: list[dict[str, Any]]) -> np.ndarray:
        col = {n: i for i, n in enumerate(self.names)}
        x = np.full((len(params_list), len(self.names)), np.nan, dtype=np.float32)
        for r, params in enumerate(params_list):
            for name, v in params.items():
                if name in col:
                    x[r, col[name]] = _value(name, v)
        return x

    def _encode_trials(self, trials: list[optuna.trial.FrozenTrial]) -> np.ndarray:
        """``encode`` of the trials' params, setting ``names`` to the params they have.  Each
        trial's values are computed once and kept (its name ids and values, about 1 KB): a
        refit reads the whole study again, and encoding 1000 mobilenet_block trials anew took
        a quarter of a second: about 40% of the mutation step's time (NOTES 70)."""
        rows = []
        for t in trials:
            row = self._rows.get(t.number)
            if row is None or row[0] is not t.params:  # new, or another study's trial of that number
                params = t.params
                ids = np.fromiter((self._ids.setdefault(n, len(self._ids)) for n in params), np.int64, len(params))
                values = np.fromiter((_value(n, v) for n, v in params.items()), np.float32, len(params))
                row = self._rows[t.number] = (params, ids, values)
            rows.append(row)
        present = np.unique(np.concatenate([ids for _, ids, _ in rows])) if rows else np.array([], np.int64)
        by_id = {i: n for n, i in self._ids.items()}
        self.names = sorted(by_id[int(i)] for i in present)
        column = np.full(len(self._ids), -1, np.int64)
        column[[self._ids[n] for n in self.names]] = np.arange(len(self.names))
        x = np.full((len(rows), len(self.names)), np.nan, dtype=np.float32)
        for r, (_, ids, values) in enumerate(rows):
            x[r, column[ids]] = values
        return x

    def update(self, done: list[optuna.trial.FrozenTrial], killed: list[optuna.trial.FrozenTrial]) -> bool:
        """Refit when enough new trials arrived; True if the model is usable. ``done``: the
        study's completed trials, ``killed``: those stopped at the time limit (``measured``
        splits a list of trials; the mutation step keeps both up to date as trials finish).

        Candidates killed at the time limit are learned too, as ``TIMEOUT_PENALTY`` times the
        slowest completed plan (Ansor and MetaSchedule record failures as very slow): the
        sampler does not learn from failed trials and keeps suggesting their neighbours, each
        costing a full time limit, unless the pre-screen has learned to skip them. So a
        timeout counts toward the first fit, and each new one refits at once: a refit costs
        a fraction of a second, another timeout costs the whole limit. Otherwise the model is
        refit every ``REFIT_EVERY`` new trials, or every ``1/REFIT_SHARE`` of the trials it
        was fit on once that is more, so that in a long job refits cost the same per trial
        (on a 16000-trial mobilenet_block study a refit took 1.5 s, NOTES 68)."""
        seen = len(done) + len(killed)
        if len(done) < MIN_COMPLETED or seen < MIN_TRIALS:
            return self.ready
        due = max(REFIT_EVERY, self._fitted_on // REFIT_SHARE)
        if self.ready and seen - self._fitted_on < due and len(killed) == self._killed_on:
            return True
        import xgboost as xgb

        penalty = TIMEOUT_PENALTY * max(t.value for t in done)
        x = self._encode_trials(done + killed)
        y = np.log([t.value for t in done] + [penalty] * len(killed))
        params = {"max_depth": 4, "eta": 0.1, "subsample": 0.9, "nthread": 1, "seed": self.seed, "verbosity": 0}
        self._booster = xgb.train(params, xgb.DMatrix(x, label=y), num_boost_round=150)
        self._fitted_on, self._killed_on = seen, len(killed)
        return True

    def predict_ms(self, params_list: list[dict[str, Any]]) -> np.ndarray:
        return np.exp(self._booster.inplace_predict(self.encode(params_list)))


def _completed(t: optuna.trial.FrozenTrial) -> bool:
    return t.state == optuna.trial.TrialState.COMPLETE and t.value is not None and t.value > 0


def _killed(t: optuna.trial.FrozenTrial) -> bool:
    return t.state == optuna.trial.TrialState.FAIL and t.user_attrs.get("status") == "timeout"


def measured(trials: list[optuna.trial.FrozenTrial]) -> tuple[list[optuna.trial.FrozenTrial], list[optuna.trial.FrozenTrial]]:
    """The trials the model learns from (``CostModel.update``): those completed, and those
    killed at the time limit."""
    return [t for t in trials if _completed(t)], [t for t in trials if _killed(t)]


def prescreen(model: CostModel | None, params: dict[str, Any], best_ms: float | None) -> float | None:
    """The predicted time when it is ``PRESCREEN_FACTOR`` times the best or more (do not
    measure), else None (measure)."""
    if model is None or not model.ready or best_ms is None:
        return None
    predicted = float(model.predict_ms([params])[0])
    return predicted if predicted >= PRESCREEN_FACTOR * best_ms else None


def mark_prescreened(trial: Any, plan_json: str, predicted_ms: float, best_ms: float) -> str:
    """Record on an Optuna trial that the cost model kept its plan from being built (the same
    attributes in tuning jobs and model regions, so `trials` and `leaderboard` show why);
    returns the reason."""
    why = (f"not measured: the cost model predicts {predicted_ms:.4g} ms, over "
           f"{PRESCREEN_FACTOR:g}x the best {best_ms:.4g} ms")
    trial.set_user_attr("plan", plan_json)
    trial.set_user_attr("status", "prescreened")
    trial.set_user_attr("predicted_ms", round(predicted_ms, 6))
    trial.set_user_attr("error", why)
    return why
