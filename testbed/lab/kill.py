"""Kill tests on a star of namespaces (topo.py run-ina): what the workers do when their
aggregator dies mid-run.
  killed-restarted  killed 1 s in, restarted 0.3 s later, fallback armed (INA_STORE): the ranks
                    redo the collective on the host path and return in-network
  killed-fallback   killed 1 s in, never restarted, fallback armed: the run finishes on the host
                    path
  killed-no-store   killed 1 s in, never restarted, no fallback: every rank fails within its
                    deadline with an error naming the aggregator, none hangs
Each case: exit status, the lines that show the outcome, wrong elements. Writes results.csv
(case, expected, status, seconds, outcome) and summary.md."""
import argparse
import csv
import os
import re
import subprocess
import sys
import time

RUN_PY = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "run.py")
SIZES = ["-b", "8", "-e", "64", "-f", "8", "-n", "150", "-w", "1", "--timeout-ms", "1500"]
CASES = {
    "killed-restarted": (["--fallback", "--kill-agg-after", "1", "--restart-after", "0.3"], "ok"),
    "killed-fallback": (["--fallback", "--kill-agg-after", "1"], "ok"),
    "killed-no-store": (["--kill-agg-after", "1"], "error"),
}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build-dir", default="build")
    ap.add_argument("--out", required=True)
    ap.add_argument("-N", "--workers", type=int, default=4)
    ap.add_argument("--cases", default=",".join(CASES))
    ap.add_argument("--timeout", type=float, default=90)
    a = ap.parse_args(argv)
    if os.geteuid() != 0:
        print("kill: needs root (network namespaces)")
        return 77
    rows, bad = [], 0
    for case in a.cases.split(","):
        if case not in CASES:
            ap.error(f"--cases: unknown {case!r} (expected some of {','.join(CASES)})")
        flags, expected = CASES[case]
        # rank 0 delayed 20 ms per call: the run outlasts the kill on any machine
        argv_ = [sys.executable, RUN_PY, "topo", "run-ina", "-N", str(a.workers), "--delay",
                 "0=20000", *flags, "--build-dir", a.build_dir, "--timeout", str(a.timeout),
                 "--", *SIZES]
        t0 = time.monotonic()
        try:
            r = subprocess.run(argv_, capture_output=True, text=True, timeout=a.timeout + 30)
            out, rc = r.stdout + r.stderr, r.returncode
        except subprocess.TimeoutExpired as e:
            out, rc = (e.stdout or "") + "\n# hung: killed by the scenario", 124
        dt = time.monotonic() - t0
        with open(os.path.join(a.out, f"{case}.txt"), "w") as f:
            f.write(" ".join(argv_) + "\n" + out)
        keep = [l for l in out.splitlines() if l.startswith("# killing") or
                l.startswith("# restarting") or "host path" in l or "Out of bounds" in l or
                "exited with status" in l or "UNAVAILABLE" in l or "DEADLINE_EXCEEDED" in l]
        status = "ok" if rc == 0 else ("error" if rc not in (124, 137) else "hang")
        if expected == "ok":  # finished, every element right
            good = status == "ok" and "Out of bounds values : 0 OK" in out
        else:  # every rank failed with an error that names the aggregator, none hung
            named = [l for l in out.splitlines() if re.search(r"rank \d+: .*(UNAVAILABLE|"
                                                              r"DEADLINE_EXCEEDED).*aggregator", l)]
            good = status == "error" and len(named) >= a.workers
        bad += not good
        outcome = "; ".join(dict.fromkeys(l.strip()[:120] for l in keep))[:600]
        rows.append({"case": case, "expected": expected, "status": status,
                     "as_expected": "yes" if good else "NO", "seconds": f"{dt:.1f}",
                     "outcome": outcome})
        print(f"# {case}: {status} in {dt:.1f} s (expected {expected}): "
              f"{'as expected' if good else 'NOT as expected'}", flush=True)
    with open(os.path.join(a.out, "results.csv"), "w", newline="") as f:
        w = csv.DictWriter(f, list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    md = [f"{a.workers} workers on a star of namespaces, the aggregator killed 1 s into 150 small "
          "AllReduces (rank 0 delayed 20 ms each); each case's output is in CASE.txt.", "",
          "| case | expected | status | as expected | seconds |", "|---|---|---|---|---|"]
    md += [f"| {r['case']} | {r['expected']} | {r['status']} | {r['as_expected']} | "
           f"{r['seconds']} |" for r in rows]
    with open(os.path.join(a.out, "summary.md"), "w") as f:
        f.write("\n".join(md) + "\n")
    return 1 if bad else 0
