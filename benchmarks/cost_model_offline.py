"""How well autofuse's cost model ranks plans it has not seen, on the trials of finished studies.

    .venv/bin/python benchmarks/cost_model_offline.py sqlite:///results/bench/bench.db

For every study with at least 60 completed trials: fit ``autofuse.cost_model.CostModel`` on
the first 60% (in trial order, as a job would have them), predict the rest, and print the
Spearman rank correlation of predicted and measured times, and for the pre-screen: the share
of the later trials it would not have built (predicted >= 8x the best time so far), and how
many of the later trials within 1.5x of the study's best it would have wrongly skipped.
"""

from __future__ import annotations

import argparse

import numpy as np
import optuna

from autofuse.cost_model import PRESCREEN_FACTOR, CostModel


def _ranks(a: np.ndarray) -> np.ndarray:
    return np.argsort(np.argsort(a))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("db_url")
    ap.add_argument("--train", type=float, default=0.6)
    args = ap.parse_args()
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    print(f"{'study':45s} {'trials':>6s} {'spearman':>8s} {'skipped':>8s} {'good skipped':>12s}")
    for summary in optuna.get_all_study_summaries(args.db_url):
        study = optuna.load_study(study_name=summary.study_name, storage=args.db_url)
        done = [t for t in study.trials if t.state == optuna.trial.TrialState.COMPLETE and t.value]
        if len(done) < 60:
            continue
        k = int(len(done) * args.train)
        model = CostModel()
        model.update(done[:k], [])
        test = done[k:]
        predicted = model.predict_ms([t.params for t in test])
        actual = np.array([t.value for t in test])
        rho = float(np.corrcoef(_ranks(predicted), _ranks(actual))[0, 1])
        best_before = min(t.value for t in done[:k])
        skipped = predicted >= PRESCREEN_FACTOR * best_before
        good = actual <= 1.5 * min(t.value for t in done)
        print(f"{summary.study_name:45s} {len(done):6d} {rho:8.2f} {skipped.mean():8.0%} "
              f"{int((skipped & good).sum()):>5d} of {int(good.sum()):<4d}")


if __name__ == "__main__":
    main()
