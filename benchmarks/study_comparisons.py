"""Every side-by-side comparison a tuning study made (``CandidateLog.confirm``), one per line:
python benchmarks/study_comparisons.py sqlite:///results/bench_10m_znver5/bench.db STUDY

Per comparison: the trial, seconds since the study's first trial, the candidate's plan, its
score, the plan it was timed against, both medians in those rounds, the verdict, and for a
comparison that was run twice (the incumbent ran far above its recent time) the incumbent's
recent time and whether the second run was disturbed too.  Then how many were run twice."""

import sys

import optuna


def comparisons(storage: str, study_name: str) -> list[str]:
    study = optuna.load_study(study_name=study_name, storage=storage)
    trials = study.get_trials(deepcopy=False)
    if not trials:
        return []
    t0 = trials[0].datetime_start
    lines, twice = [], 0
    for t in trials:
        c = t.user_attrs.get("confirm")
        if not c or t.datetime_start is None:
            continue
        head = f"trial {t.number:5d} {(t.datetime_start - t0).total_seconds():6.0f} s  {t.user_attrs.get('plan_hash', '?')}"
        if "error" in c:
            lines.append(f"{head}  comparison failed: {c['error']}")
            continue
        verdict = "faster" if c["faster"] else "tie"
        line = (f"{head}  score {t.value:.4f}  vs {c['vs']}: {c['candidate_ms']:.4f} vs {c['incumbent_ms']:.4f} ms, "
                f"{verdict}")
        if "first" in c:  # a win, replicated: the line above is the replicate
            line += f"  (replicating a win of {c['first']['candidate_ms']:.4f} vs {c['first']['incumbent_ms']:.4f} ms"
            line += f"; the replicate failed: {c['replicate_error']})" if "replicate_error" in c else ")"
        if c.get("attempts", 1) > 1:
            twice += 1
            line += f"  (run twice, recent {c['recent_ms']:.4f} ms, {'disturbed' if c['disturbed'] else 'clean'} the second time)"
        lines.append(line)
    lines.append(f"{len(lines)} comparisons, {twice} run twice")
    return lines


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit("usage: python benchmarks/study_comparisons.py STORAGE_URL STUDY")
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    print("\n".join(comparisons(sys.argv[1], sys.argv[2])))
