"""DPDK ranks over net_memif against the DPDK aggregator (memif server), beside kernel-UDP ranks
against the kernel-UDP aggregator, in one network namespace of the run's own (DPDK's memif socket
is abstract: one per namespace): the N ranks as threads of one `ina-bench --local-ranks N`
process sharing one DPDK port (memif client), kept off the aggregator's worker lcore (CPU 1) when
the machine has more CPUs; `--no-huge`. Shared memory, no network: what the bypass path costs in
CPU against the kernel's. Writes results.csv (variant udp | memif) and summary.md. Root, and a
build with -Ddpdk (exit 77 with the reason otherwise)."""
import argparse
import csv
import os
import subprocess
import time

import record
import topo


def wait_for(path, text, proc, seconds):
    end = time.time() + seconds
    while time.time() < end:
        with open(path, errors="replace") as f:
            if text in f.read():
                return True
        if proc.poll() is not None:
            return False
        time.sleep(0.1)
    return False


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build-dir", default="build")
    ap.add_argument("--out", required=True)
    ap.add_argument("-N", "--ranks", type=int, default=4)
    ap.add_argument("--timeout", type=float, default=120)
    a, sizes = ap.parse_known_args(argv)  # the rest: ina-bench's size options
    sizes = record.last_wins(sizes or ["-b", "64K", "-e", "4M", "-f", "4", "-n", "20", "-w", "3"])
    agg_bin = os.path.join(a.build_dir, "aggregator", "ina-aggregator")
    bench = os.path.join(a.build_dir, "testbed", "ina-bench")
    ok, why = topo.can_make_namespaces()
    if not ok:
        print(f"memif: {why}")
        return 77
    if not os.path.exists(os.path.join(a.build_dir, "aggregator", "libina-aggregator-dpdk.so")) \
            or not os.path.exists(os.path.join(a.build_dir, "worker", "libina-dpdk.so")):
        print(f"memif: the DPDK aggregator backend and worker transport are not built in "
              f"{a.build_dir} (-Ddpdk=enabled; meson compile -C {a.build_dir})")
        return 77
    os.makedirs(a.out, exist_ok=True)
    cpus = os.cpu_count() or 1
    rank_cpus = "0" if cpus <= 2 else f"0,2-{cpus - 1}"
    t = topo.Topology(1, 0, prefix="inamf")
    topo.install_signal_teardown(t)
    rows, rc = [], 0
    with t:
        host = t.workers()[0]
        tag = f"{t.prefix}"
        sock = f"/tmp/{tag}.sock"
        for variant in ("udp", "memif"):
            path = os.path.join(a.out, f"{variant}.csv")
            log = os.path.join(a.out, f"{variant}.txt")
            if variant == "udp":  # ina-bench's embedded kernel-UDP aggregator, forked ranks
                argv_ = [bench, "--workers", str(a.ranks), *sizes, "-c", "1", "--csv", path]
                r = t.run(host, ["timeout", str(a.timeout), *argv_], capture_output=True,
                          text=True)
                with open(log, "w") as f:
                    f.write(r.stdout + r.stderr)
                code = r.returncode
            else:
                agg_log = os.path.join(a.out, "memif-aggregator.txt")
                with open(agg_log, "w") as f:
                    agg = t.popen(host, [agg_bin, "--backend", "dpdk", "--world-size",
                                         str(a.ranks), "--ip", "10.79.0.2", "--port", "47474",
                                         "--dpdk-port", "net_memif0", "--stats-interval-ms", "0",
                                         "--", "--no-huge", "-m", "512", "--no-shconf",
                                         "--no-pci", "--no-telemetry", "--file-prefix", tag,
                                         "-l", "0-1" if cpus > 1 else "0", "--vdev",
                                         f"net_memif0,role=server,socket={sock}",
                                         "--log-level=3"], stdout=f, stderr=subprocess.STDOUT)
                if not wait_for(agg_log, "ina-aggregator (dpdk) on port", agg, 15):
                    print(f"memif: the DPDK aggregator did not start (see {agg_log})")
                    rc = 1
                    break
                env = dict(os.environ, INA_TRANSPORT="dpdk", INA_LOCAL_IP="10.79.0.20",
                           INA_TIMEOUT_MS="20000",
                           INA_DPDK_ARGS=f"--no-huge -m 512 --no-shconf --no-pci --no-telemetry "
                                         f"--log-level=3 --file-prefix {tag}-w "
                                         f"--vdev=net_memif0,role=client,socket={sock} "
                                         "--lcores 0@0")
                argv_ = [bench, "--aggregator", "10.79.0.2:47474", "--rank", "0", "--workers",
                         str(a.ranks), "--local-ranks", str(a.ranks), *sizes, "-c", "1",
                         "--csv", path]
                r = t.run(host, ["timeout", str(a.timeout), "taskset", "-c", rank_cpus, *argv_],
                          capture_output=True, text=True, env=env)
                with open(log, "w") as f:
                    f.write(r.stdout + r.stderr)
                code = r.returncode
                agg.terminate()  # the ranks have exited: no traffic left on the port
                try:
                    agg.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    agg.kill()
                    agg.wait()
            print(f"# {variant}: exit {code}", flush=True)
            rc = rc or code
            if os.path.exists(path):
                with open(path, newline="") as f:
                    rows += [{"variant": variant, **r} for r in csv.DictReader(f)]
                os.remove(path)
    for p in (f"/var/run/dpdk/{t.prefix}", f"/var/run/dpdk/{t.prefix}-w"):
        subprocess.run(["rm", "-rf", p])
    if rows:
        with open(os.path.join(a.out, "results.csv"), "w", newline="") as f:
            w = csv.DictWriter(f, list(rows[0]))
            w.writeheader()
            w.writerows(rows)
    by = {}
    for r in rows:
        by.setdefault(int(r["bytes"]), {})[r["variant"]] = float(r["time_us"])
    md = [f"{a.ranks} ranks in one namespace, float32 SUM: kernel-UDP ranks and aggregator (udp) "
          "against DPDK memif ranks and the DPDK aggregator (memif); time per call (us).", "",
          "| bytes | udp | memif | memif/udp |", "|---|---|---|---|"]
    for b, tm in sorted(by.items()):
        ratio = f"{tm['memif'] / tm['udp']:.2f}" if tm.get("udp") and "memif" in tm else "-"
        md.append(f"| {b} | {tm.get('udp', '-')} | {tm.get('memif', '-')} | {ratio} |")
    wrong = sum(int(r["wrong"]) for r in rows if r.get("wrong", "").isdigit())
    md += ["", f"wrong elements: {wrong}"]
    with open(os.path.join(a.out, "summary.md"), "w") as f:
        f.write("\n".join(md) + "\n")
    print("\n".join(md))
    return rc or (1 if wrong else 0)
