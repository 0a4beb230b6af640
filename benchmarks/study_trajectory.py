"""How a tuning study's best score moved, one line per new best, in order of completion:
python benchmarks/study_trajectory.py sqlite:///results/bench_10m_znver3/bench.db STUDY

Per new best: seconds from the study's first trial to the trial's completion, the trial, its
label (a seed's template, or "mutation"), its score, and the parameters that differ from
the previous best (what the step changed; a seed's are its whole schedule, so only the
count is shown).  NOTES quotes it to say when a knob first reached the best plan."""

import sys

import optuna


def trajectory(storage: str, study_name: str, max_changes: int = 8) -> list[str]:
    study = optuna.load_study(study_name=study_name, storage=storage)
    done = [t for t in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,))
            if t.datetime_complete is not None and t.value is not None]
    if not done:
        return []
    t0 = min(t.datetime_start or t.datetime_complete for t in done)
    lines, best = [], None
    for t in sorted(done, key=lambda t: t.datetime_complete):
        if best is not None and t.value >= best.value:
            continue
        at = (t.datetime_complete - t0).total_seconds()
        label = t.user_attrs.get("label", "mutation")
        line = f"{at:6.0f} s  trial {t.number:5d}  {label:28s} {t.value:.4f}"
        if best is not None:
            changed = sorted(k for k in t.params.keys() | best.params.keys()
                             if t.params.get(k) != best.params.get(k))
            if len(changed) > max_changes:
                line += f"  ({len(changed)} parameters changed)"
            elif changed:
                line += "  " + ", ".join(f"{k}: {best.params.get(k)} -> {t.params.get(k)}" for k in changed)
        lines.append(line)
        best = t
    return lines


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit("usage: python benchmarks/study_trajectory.py STORAGE_URL STUDY")
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    print("\n".join(trajectory(sys.argv[1], sys.argv[2])))
