#!/usr/bin/env python3
"""The simulator's models give the values their formulas promise (testbed/sim/inasim.py).

  sim_model.py SOURCE_ROOT

The closed forms at points worked by hand (ring, single-level INA, the CPU-bound model and what
bounds it), and that the CLI's cpu and alltoall tables print and refuse bad input.
"""
import math
import os
import subprocess
import sys

root = sys.argv[1]
sim_path = os.path.join(root, "testbed", "sim")
sys.path.insert(0, sim_path)
import inasim  # noqa: E402

failures = []


def check(cond, what):
    if not cond:
        failures.append(what)


def close(a, b, rel=1e-9):
    return math.isclose(a, b, rel_tol=rel)


p = inasim.Params(alpha=10e-6, beta=1e-9, c_pkt=1e-7, payload=1000, header=40)
# ring: 2(N-1) a + 2(N-1)/N D b at N = 4, D = 1 MB.
check(close(inasim.t_ring(4, 1e6, p), 6 * 10e-6 + 1.5e6 * 1e-9), "ring closed form")
# inc at N = 4: 2 (ai + c) + D' bi + N p c with p = 1000 packets, D' = 1.04 MB.
check(close(inasim.t_inc(4, 1e6, p), 2 * (10e-6 + 1e-7) + 1.04e6 * 1e-9 + 4 * 1000 * 1e-7),
      "single-level INA closed form")

q = inasim.CpuParams(ranks=4.0, aggregator=2.0, ring=3.0, m=4, cores=1, threads=8, fan_in=32,
                     alpha=0.0)
# A worker's cost 1 s/GB, the aggregator's 0.5 s/GB per stream, a ring rank's 0.75 s/GB at 4.
ring, rb, hier, hb = inasim.cpu_times(4, 1e9, q)
check(rb == "link" and close(ring, 1.5 * 8), f"ring at 1 Gbit/s is link-bound: {ring} {rb}")
check(hb == "link" and close(hier, 8.0), f"hier at 1 Gbit/s is link-bound: {hier} {hb}")
ring, rb, hier, hb = inasim.cpu_times(4, 100e9, q)
check(rb == "rank CPU" and close(ring, 0.75), f"ring at 100 Gbit/s: {ring} {rb}")
check(hb == "rank CPU" and close(hier, 1.0), f"hier at 100 Gbit/s, 4 children: {hier} {hb}")
ring, rb, hier, hb = inasim.cpu_times(64, 100e9, q)
check(hb == "aggregator CPU" and close(hier, 32 * 0.5 / 8), f"hier at 64 ranks: {hier} {hb}")
check(close(ring, 0.75 * (63 / 64) / (3 / 4)), f"ring rank's cost scaled to 64 ranks: {ring}")
try:
    inasim.CpuParams(m=1)
    check(False, "M = 1 accepted")
except ValueError:
    pass

sim = os.path.join(sim_path, "inasim.py")
out = subprocess.run([sys.executable, sim, "cpu", "--ranks", "2.9", "--aggregator", "2.5",
                      "--ring", "2.4", "-M", "4"], capture_output=True, text=True)
check(out.returncode == 0 and "| 1024 | 100 Gbit/s |" in out.stdout and "assumptions" in out.stdout,
      f"inasim.py cpu: rc {out.returncode}: {out.stderr.strip()}")
out = subprocess.run([sys.executable, sim, "cpu", "--threads", "0"], capture_output=True,
                     text=True)
check(out.returncode != 0 and "positive" in out.stderr, "inasim.py cpu --threads 0 refused")
out = subprocess.run([sys.executable, sim, "alltoall", "-N", "64", "-G", "8"], capture_output=True,
                     text=True)
check(out.returncode == 0 and "hierarchical faster" in out.stdout, "inasim.py alltoall prints")

for f in failures:
    print("FAIL:", f)
print(f"{'FAIL' if failures else 'OK'}: simulator models")
sys.exit(1 if failures else 0)
