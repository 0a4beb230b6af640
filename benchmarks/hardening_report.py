"""Measure the hardening figures and write results/hardening.json and results/hardening.md.

    .venv/bin/python benchmarks/hardening_report.py            # fast variants (a few minutes)
    .venv/bin/python benchmarks/hardening_report.py --soak     # soak sizes (longer)

Runs the same scenarios as tests/test_hardening.py (faulty candidates, SIGKILL + resume,
4 workers + a polling reader, the bad-input table) through the real CLI.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
os.environ.setdefault("TVM_NUM_THREADS", "2")

from test_hardening import (FAST_FAULTS, bad_input_cases, concurrency_scenario, fault_scenario,  # noqa: E402
                            kill_scenario, run_bad_input)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--soak", action="store_true", help="soak sizes: more faults, 12 kills, 80 concurrent trials")
    ap.add_argument("--out", default=str(ROOT / "results"), help="directory for hardening.json / hardening.md")
    args = ap.parse_args()
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix="autofuse-hardening-"))
    report: dict = {"mode": "soak" if args.soak else "fast", "host": platform.node(), "cpus": os.cpu_count(),
                    "started": time.strftime("%Y-%m-%dT%H:%M:%S")}

    def step(name: str, fn) -> None:
        t0 = time.time()
        print(f"[hardening] {name} ...", file=sys.stderr, flush=True)
        report[name] = fn()
        report[name]["seconds"] = round(time.time() - t0, 1)
        print(json.dumps({name: report[name]}, default=str), flush=True)

    for d in ("f", "k", "c"):
        (tmp / d).mkdir(exist_ok=True)
    if args.soak:
        from test_soak import SOAK_FAULTS
        step("faults", lambda: fault_scenario(tmp / "f", SOAK_FAULTS, trials=24, seed=5))
        step("kills", lambda: kill_scenario(tmp / "k", kills=12, seed=7))
        step("concurrency", lambda: concurrency_scenario(tmp / "c", trials=80, poll_s=0.2))
    else:
        step("faults", lambda: fault_scenario(tmp / "f", FAST_FAULTS, trials=10))
        step("kills", lambda: kill_scenario(tmp / "k", kills=3, seed=11))
        step("concurrency", lambda: concurrency_scenario(tmp / "c", trials=12))
    def bad_inputs() -> dict:
        rows = []
        for case in bad_input_cases(tmp / "bad"):
            if case.skip:
                rows.append({"name": case.name, "skipped": case.skip})
                continue
            res = run_bad_input(case)
            if case.xfail and not res["clean"]:
                res["known_defect"] = case.xfail
            rows.append(res)
        tried = [r for r in rows if "skipped" not in r]
        return {"inputs_tried": len(tried), "handled_cleanly": sum(r["clean"] for r in tried),
                "known_defects": [r["name"] for r in tried if r.get("known_defect")],
                "skipped": [r["name"] for r in rows if "skipped" in r], "rows": rows}

    step("bad_input", bad_inputs)
    (out_dir / "hardening.json").write_text(json.dumps(report, indent=2, default=str))
    (out_dir / "hardening.md").write_text(markdown(report))
    print(f"wrote {out_dir / 'hardening.json'} and {out_dir / 'hardening.md'}", file=sys.stderr)


def markdown(r: dict) -> str:
    f, k, c, b = r["faults"], r["kills"], r["concurrency"], r["bad_input"]
    lines = [
        f"# autofuse hardening ({r['mode']}, {r['cpus']} CPUs, {r['started']})", "",
        "| check | figure | target |", "|---|---|---|",
        f"| faulty candidates | {f['contained']}/{f['injected']} contained (job rc {f['job_rc']}, "
        f"wrong plan best: {f.get('wrong_plan_best')}) | all contained |",
        f"| SIGKILL + resume | {k['survived']}/{k['kills']} kills survived, {k['completed_trials_lost']} completed "
        f"trials lost, integrity_check all ok: {k['integrity_all_ok']}, best regressions {k['best_regressions']} | "
        "0 lost, all ok |",
        f"| 4 workers + reader | {c.get('finished')}/{c['expected_trials']} trials, 'database is locked' seen by "
        f"user: {c.get('locked_errors_seen_by_user')}, reader errors: {c.get('reader_errors')} "
        f"({c['reader']['ok']} good polls) | 0 / 0 |",
        f"| bad input | {b['handled_cleanly']}/{b['inputs_tried']} handled cleanly"
        + (f" (known defects: {', '.join(b['known_defects'])})" if b["known_defects"] else "") + " | all |",
        "", "## Faults", "", "| trial | kind | state | status | error |", "|---|---|---|---|---|",
    ]
    for x in f.get("faults", []):
        lines.append(f"| {x['trial']} | {x['kind']} | {x['state']} | {x['status']} | {(x['error'] or '')[:90]} |")
    lines += ["", "## Kills", "", "| # | mode | delay s | complete trials before | integrity |", "|---|---|---|---|---|"]
    for x in k["log"]:
        lines.append(f"| {x['kill']} | {x['mode']} | {x['delay_s']} | {x['complete_before']} | {x['integrity']} |")
    lines += ["", "## Bad input", "", "| input | exit | clean | stderr line |", "|---|---|---|---|"]
    for x in b["rows"]:
        if "skipped" in x:
            lines.append(f"| {x['name']} | – | skipped | {x['skipped']} |")
        else:
            flag = "yes" if x["clean"] else ("known defect" if x.get("known_defect") else "NO: " + "; ".join(x["problems"]))
            lines.append(f"| {x['name']} | {x['rc']} | {flag} | `{x['line'][:110]}` |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
