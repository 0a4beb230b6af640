"""Optuna's RDB storage with the parameter writes of a trial batched into one transaction.

A define-by-run trial of autofuse samples 20-200 parameters (fuse decisions and
every group's knobs).  Stock RDBStorage commits each one separately, which on
SQLite made sampling + storage a third of a tuning job's wall time.  Here the
writes of a running trial are buffered in the process that samples it and
flushed in a single transaction before its state changes (tell, fail, prune) or
before anyone reads it back.  A job killed mid-trial loses only that trial's
unsaved parameters: the trial itself is RUNNING in the database and the
heartbeat marks it failed on resume, exactly as without batching.

This leans on two private helpers of ``optuna.storages._rdb`` (pinned: optuna<6).
"""

from __future__ import annotations

import threading
from typing import Any, Sequence

import optuna
from optuna.distributions import BaseDistribution
from optuna.storages._rdb.storage import _create_scoped_session
from optuna.trial import FrozenTrial, TrialState


class BatchedRDBStorage(optuna.storages.RDBStorage):
    """RDBStorage whose per-parameter commits are batched per trial."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._pending: dict[int, list[tuple[str, float, BaseDistribution, BaseDistribution | None]]] = {}
        self._pending_lock = threading.Lock()

    def _set_trial_param(self, trial_id: int, param_name: str, param_value_internal: float,
                         distribution: BaseDistribution, previous_distribution: BaseDistribution | None) -> None:
        with self._pending_lock:
            self._pending.setdefault(trial_id, []).append(
                (param_name, param_value_internal, distribution, previous_distribution))

    def flush(self, trial_id: int) -> None:
        with self._pending_lock:
            items = self._pending.pop(trial_id, None)
        if not items:
            return
        with _create_scoped_session(self.scoped_session) as session:
            for name, value, dist, prev in items:
                self._set_trial_param_without_commit(session, trial_id, name, value, dist, prev)

    def set_trial_state_values(self, trial_id: int, state: TrialState, values: Sequence[float] | None = None) -> bool:
        self.flush(trial_id)
        return super().set_trial_state_values(trial_id, state, values)

    def get_trial(self, trial_id: int) -> FrozenTrial:
        self.flush(trial_id)
        return super().get_trial(trial_id)
