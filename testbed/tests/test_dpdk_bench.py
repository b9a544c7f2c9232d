#!/usr/bin/python3
"""Smoke test of ina-dpdk-bench (suite dpdk): a short sweep in both modes, the two-process net_memif
mode (generator process vs the aggregator and vs dpdk-testpmd when installed) and the in-process
net_ring mode, at 64 and 1024 elements per packet (1024: 4170-byte frames, beyond memif's 1518-byte
reported maximum). Asserts the bench exits 0, prints one row per size and mode with a positive
aggregator rate (and testpmd rate when it ran), and no UNEXPECTED aggregator counters (exact
aggregation: every block completes); that the aggregator sent its results over memif as chains
(the port transmits them: DpdkOptions::fanout auto); then a float32 run (the float SUM's codec)
with --stages prints its row and the cycles per frame by stage; and --mode tags (the DATA tag
check one frame at a time and a burst at once, and the Engine's work both ways) prints a row per
size with every figure positive and no UNEXPECTED (a genuine tag failed, a round incomplete).
Exits 77 (SKIP) with the reason when not root or the EAL cannot start.

    test_dpdk_bench.py BUILD_DIR
"""
import os
import shutil
import subprocess
import sys


def main():
    build = sys.argv[1]
    bench = os.path.join(build, "testbed", "ina-dpdk-bench")
    if os.geteuid() != 0:
        print("SKIP: needs root (DPDK EAL, memif sockets)")
        return 77
    testpmd = shutil.which("dpdk-testpmd") or "none"
    cmd = [bench, "--mode", "memif,ring", "--elems", "64,1024", "--seconds", "0.3",
           "--testpmd", testpmd]
    print("running:", " ".join(cmd), flush=True)
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                       timeout=240)
    print(p.stdout)
    if p.returncode == 77 or "the EAL cannot start" in p.stdout:
        print("SKIP: the DPDK EAL cannot start here")
        return 77
    assert p.returncode == 0, f"ina-dpdk-bench exited {p.returncode}"
    assert "UNEXPECTED" not in p.stdout, "inexact aggregation counters"
    memif_rows, ring_rows = [], []
    for line in p.stdout.splitlines():
        f = line.split()
        if not f or line.startswith("#") or not f[0].isdigit():
            continue
        (memif_rows if "|" in f else ring_rows).append(f)
    assert [r[0] for r in memif_rows] == ["64", "1024"], memif_rows
    assert [r[0] for r in ring_rows] == ["64", "1024"], ring_rows
    for r in memif_rows:
        assert r[1] == str(42 + 40 + 4 * int(r[0])), f"frame length {r[1]} for {r[0]} elements"
        assert float(r[4]) > 0, f"memif aggregator rate is 0 at {r[0]} elements"
        if testpmd != "none":
            assert float(r[11]) > 0, f"memif testpmd rate is 0 at {r[0]} elements"
        assert r[-1] == "chains", f"memif results sent as {r[-1]}, not chains"
    for r in ring_rows:
        assert float(r[2]) > 0, f"ring aggregator rate is 0 at {r[0]} elements"

    cmd = [bench, "--mode", "memif", "--elems", "256", "--seconds", "0.3", "--testpmd", "none",
           "--dtype", "float32", "--stages"]
    print("running:", " ".join(cmd), flush=True)
    q = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                       timeout=120)
    print(q.stdout)
    assert q.returncode == 0, f"ina-dpdk-bench --dtype float32 exited {q.returncode}"
    assert "UNEXPECTED" not in q.stdout, "inexact aggregation counters (float32)"
    rows = [line.split() for line in q.stdout.splitlines() if line.split()[:1] == ["256"]]
    assert len(rows) == 1 and float(rows[0][4]) > 0, f"float32 memif row: {rows}"
    assert "aggregator cycles per frame by stage: rx burst" in q.stdout, "no --stages line"

    cmd = [bench, "--mode", "tags", "--elems", "64,1024", "--dtype", "float32"]
    print("running:", " ".join(cmd), flush=True)
    t = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                       timeout=120)
    print(t.stdout)
    assert t.returncode == 0 and "UNEXPECTED" not in t.stdout, "ina-dpdk-bench --mode tags"
    rows = [line.split() for line in t.stdout.splitlines()
            if line.split()[:1] in (["64"], ["1024"])]
    assert [r[0] for r in rows] == ["64", "1024"], f"tags rows: {rows}"
    for r in rows:
        assert all(float(x) > 0 for x in r[1:]), f"tags row {r}"
    print("ok: %d memif rows, %d ring rows (testpmd: %s), float32 with stages, tags" %
          (len(memif_rows), len(ring_rows), testpmd))
    return 0


if __name__ == "__main__":
    sys.exit(main())
