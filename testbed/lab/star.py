"""Scenarios on the star of namespaces through `run.py topo run-ina` (topo.py): runner
"star:kill" and "star:cpu".

kill: Kill tests on a star of namespaces (topo.py run-ina): what the workers do when their
aggregator dies mid-run.
  killed-restarted  killed 1 s in, restarted 0.3 s later, fallback armed (INA_STORE): the ranks
                    redo the collective on the host path and return in-network
  killed-fallback   killed 1 s in, never restarted, fallback armed: the run finishes on the host
                    path
  killed-no-store   killed 1 s in, never restarted, no fallback: every rank fails within its
                    deadline with an error naming the aggregator, none hangs
Each case: exit status, the lines that show the outcome, wrong elements. Writes results.csv
(case, expected, status, seconds, outcome) and summary.md.

cpu: CPU seconds per GB reduced, INA against the host ring, on the shaped star (topo.py run-ina's
"# cpu:" line: every rank's and the aggregator's user + system time from wait4).
Each variant runs twice, with 5 and with 15 timed iterations of 16 and 64 MiB (float32 SUM, 1
warm-up, every element checked): the difference is the CPU of 10 x (16 + 64) MiB reduced, free of
the runs' setup, input generation and checks. The kernel's softirq work on packets is charged to
whichever process it interrupts: the split between ranks and aggregator is approximate, the sum
is what the processes caused. Writes results.csv (round, variant, iters, ranks_s, agg_s, wall_s)
and summary.md (CPU s per GB per round and variant)."""
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


def kill(argv=None):
    ap = argparse.ArgumentParser(description="the aggregator killed mid-run")
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


CPU = re.compile(r"^# cpu: ranks ([\d.]+) s .*?(?:aggregator ([\d.]+) s .*?)?; ([\d.]+) s wall",
                 re.M)


def cpu(argv=None):
    ap = argparse.ArgumentParser(description="CPU seconds per GB reduced")
    ap.add_argument("--build-dir", default="build")
    ap.add_argument("--out", required=True)
    ap.add_argument("--rate", default="1gbit")
    ap.add_argument("-N", "--workers", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--iters", default="5,15", help="the two iteration counts")
    ap.add_argument("--sizes", default="16M,64M", help="-b,-e of ina-bench (step 4)")
    a = ap.parse_args(argv)
    if os.geteuid() != 0:
        print("cpu: needs root (network namespaces, tbf)")
        return 77
    lo, hi = (int(x) for x in a.iters.split(","))
    b, e = a.sizes.split(",")
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    size = lambda s: int(s[:-1]) * units[s[-1]] if s[-1] in units else int(s)  # noqa: E731
    per_iter = 0
    s = size(b)
    while s <= size(e):
        per_iter += s
        s *= 4
    gb = (hi - lo) * per_iter / 1e9
    rows, rc = [], 0
    for rnd in range(1, a.rounds + 1):
        for variant in ("ina", "ring"):
            for n in (lo, hi):
                extra = ["--host-path"] if variant == "ring" else []
                bench = ["--algo", "ring"] if variant == "ring" else []
                argv_ = [sys.executable, RUN_PY, "topo", "run-ina", "-N", str(a.workers),
                         "--link-rate", a.rate, *extra, "--build-dir", a.build_dir, "--", "-b", b,
                         "-e", e, "-f", "4", "-n", str(n), "-w", "1", *bench]
                r = subprocess.run(argv_, capture_output=True, text=True)
                out = r.stdout + r.stderr
                with open(os.path.join(a.out, f"{variant}-n{n}-{rnd}.txt"), "w") as f:
                    f.write(" ".join(argv_) + "\n" + out)
                m = CPU.search(out)
                if r.returncode != 0 or not m:
                    print(f"# round {rnd} {variant} n={n}: failed (exit {r.returncode})")
                    rc = 1
                    continue
                rows.append({"round": rnd, "variant": variant, "iters": n, "ranks_s": m.group(1),
                             "agg_s": m.group(2) or "0", "wall_s": m.group(3)})
                print(f"# round {rnd} {variant} n={n}: {m.group(0)}", flush=True)
    if rows:
        with open(os.path.join(a.out, "results.csv"), "w", newline="") as f:
            w = csv.DictWriter(f, list(rows[0]))
            w.writeheader()
            w.writerows(rows)
    md = [f"{a.workers} workers on {a.rate} links (tbf both ends), float32 SUM, {b}..{e}: the CPU "
          f"of {hi - lo} more iterations = {gb:.3f} GB reduced per rank's buffer.", "",
          "| round | variant | ranks (s) | aggregator (s) | CPU s per GB reduced |",
          "|---|---|---|---|---|"]
    for rnd in range(1, a.rounds + 1):
        for variant in ("ina", "ring"):
            pair = {int(r["iters"]): r for r in rows if r["round"] == rnd and r["variant"] == variant}
            if lo in pair and hi in pair:
                dr = float(pair[hi]["ranks_s"]) - float(pair[lo]["ranks_s"])
                da = float(pair[hi]["agg_s"]) - float(pair[lo]["agg_s"])
                md.append(f"| {rnd} | {variant} | {dr:.2f} | {da:.2f} | **{(dr + da) / gb:.1f}** |")
    with open(os.path.join(a.out, "summary.md"), "w") as f:
        f.write("\n".join(md) + "\n")
    print("\n".join(md))
    return rc
