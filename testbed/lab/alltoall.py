"""AllToAll(v): INA's host algorithms against Open MPI (MPI_Alltoall(v) over TCP) on loopback,
the tools alternated round by round in one run, so that load from elsewhere on the machine falls
on all of them alike; the table gives each tool's median time per size over the rounds and the
INA/MPI time ratio (below 1: INA is faster).

Variants (--variants, comma-separated):
  ina            ina-bench --coll alltoall(v) --transport host, the cost model's choice
  ina-pairwise   INA_A2A_ALGO=pairwise (likewise ina-bruck, ina-hier; hier needs --group)
  ina-base       the same with another build's ina-bench (--base-bench: e.g. the main branch's)
  mpi            ina-mpi-bench under mpirun (--mca btl tcp,self, loopback)
  gloo           ina-gloo-bench --coll alltoall (gloo::alltoall, TCP; AllToAll only)

Writes --out DIR: machine.txt (CPU, cores, load before and after, revision, command),
results.csv (round,variant,ranks,bytes,time_us,wrong), summary.md (medians and ratios).

options (the alltoall scenario's, or after `--` on testbed/run.py):
       [-N 4,8] [-b 8] [-e 64M] [-f 4] [-n 200] [-w 5] [-B 256M] [--rounds 3] [--coll alltoall|alltoallv] [--zipf 1.2]
       [--variants ina,mpi] [--group G] [--build-dir build] [--base-bench PATH]
       [--timeout 300] --out DIR
"""
import argparse
import csv
import os
import platform
import statistics
import subprocess
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))


def machine(argv):
    cpu = "unknown"
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    rev = subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"],
                         capture_output=True, text=True).stdout.strip()
    dirty = subprocess.run(["git", "-C", ROOT, "status", "--porcelain", "--untracked-files=no"],
                           capture_output=True, text=True).stdout.strip()
    with open("/proc/loadavg") as f:
        load = " ".join(f.read().split()[:3])
    return [f"date: {time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime())}",
            f"machine: {platform.system()} {platform.release()} {platform.machine()}, "
            f"{os.cpu_count()} CPUs, {cpu}",
            f"revision: {rev}{' (with local changes)' if dirty else ''}",
            f"load average at start: {load}",
            "command: " + " ".join(argv)]


def command(a, variant, n, csv_path):
    sizes = ["-b", a.b, "-e", a.e, "-f", str(a.f), "-n", str(a.n), "-w", str(a.w), "-c", "1",
             "--max-bytes-per-size", a.B, "--csv", csv_path, "--coll", a.coll]
    if a.coll == "alltoallv":
        sizes += ["--zipf", str(a.zipf)]
    env = dict(os.environ)
    env.pop("INA_A2A_ALGO", None)
    if a.group:
        env["INA_A2A_GROUP"] = str(a.group)
    if variant == "mpi":
        argv = ["mpirun", "-np", str(n), "--oversubscribe", "--mca", "btl", "tcp,self",
                "--mca", "btl_tcp_if_include", "lo"]
        if os.geteuid() == 0:
            argv.insert(1, "--allow-run-as-root")
        return argv + [os.path.join(a.build_dir, "testbed", "ina-mpi-bench")] + sizes, env
    if variant == "gloo":
        return [os.path.join(a.build_dir, "testbed", "ina-gloo-bench"), "--ranks", str(n)] + \
            sizes, env
    bench = os.path.join(a.build_dir, "testbed", "ina-bench")
    if variant == "ina-base":
        bench = a.base_bench
    elif variant.startswith("ina-"):
        env["INA_A2A_ALGO"] = variant[4:]
    return [bench, "--transport", "host", "--workers", str(n)] + sizes, env


def main(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("-N", default="4,8")
    p.add_argument("-b", default="8")
    p.add_argument("-e", default="64M")
    p.add_argument("-f", type=float, default=4)
    # Calls per size and round (-B caps them at large sizes). 200, not 20: at 8-512 KiB per rank
    # 20 calls last 1-4 ms, and one call that a scheduler hiccup stretches to 1-5 ms (4 or 8
    # ranks on 2 cores) moved a point's mean 1.5-2x between runs, for every tool
    # (testbed/results/alltoall-large-20261206/, "Run-to-run spread").
    p.add_argument("-n", type=int, default=200)
    p.add_argument("-w", type=int, default=5)
    p.add_argument("-B", default="256M")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--coll", choices=["alltoall", "alltoallv"], default="alltoall")
    p.add_argument("--zipf", type=float, default=1.2)
    p.add_argument("--variants", default="ina,mpi")
    p.add_argument("--group", type=int, default=0)
    p.add_argument("--build-dir", default=os.path.join(ROOT, "build"))
    p.add_argument("--base-bench", default="")
    p.add_argument("--timeout", type=int, default=300)
    p.add_argument("--out", required=True)
    a = p.parse_args(argv)
    variants = a.variants.split(",")
    if "ina-base" in variants and not a.base_bench:
        p.error("ina-base needs --base-bench")
    if "gloo" in variants and a.coll != "alltoall":
        p.error("gloo runs AllToAll only (--coll alltoall)")
    os.makedirs(a.out, exist_ok=True)
    info = machine(["testbed/run.py alltoall"] + list(argv))
    rows = []
    failures = []
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(a.rounds):
            for n in [int(x) for x in a.N.split(",")]:
                # The order rotates by round: no variant always runs first (after the previous
                # round's largest run, whose processes may still be releasing their memory).
                for v in variants[r % len(variants):] + variants[:r % len(variants)]:
                    path = os.path.join(tmp, f"{v}-{n}-{r}.csv")
                    cmd, env = command(a, v, n, path)
                    try:
                        res = subprocess.run(cmd, env=env, capture_output=True, text=True,
                                             timeout=a.timeout)
                        ok = res.returncode == 0
                        why = (res.stderr or res.stdout).strip().splitlines()[-1:] if not ok else []
                    except subprocess.TimeoutExpired:
                        ok, why = False, [f"timed out after {a.timeout} s"]
                    if not ok:
                        failures.append(f"round {r} {v} N={n}: {' '.join(why)}")
                    if os.path.exists(path):
                        with open(path) as f:
                            for rec in csv.reader(f):
                                if not rec or not rec[2].isdigit():
                                    continue
                                rows.append({"round": r, "variant": v, "ranks": n,
                                             "bytes": int(rec[2]), "time_us": float(rec[6]),
                                             "wrong": rec[9]})
                    print(f"# round {r} {v} N={n}: {'ok' if ok else 'FAILED'}", flush=True)
    with open("/proc/loadavg") as f:
        info.append("load average at end: " + " ".join(f.read().split()[:3]))
    with open(os.path.join(a.out, "machine.txt"), "w") as f:
        f.write("\n".join(info + [f"failures: {x}" for x in failures]) + "\n")
    with open(os.path.join(a.out, "results.csv"), "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=["round", "variant", "ranks", "bytes", "time_us", "wrong"])
        w.writeheader()
        w.writerows(rows)
    out = [f"# {a.coll}{f' Zipf({a.zipf})' if a.coll == 'alltoallv' else ''}: median time (us) "
           f"over {a.rounds} alternated rounds; ratio = variant / mpi", ""] + \
          [f"- {x}" for x in info] + [""]
    for n in sorted({r["ranks"] for r in rows}):
        out.append(f"## {n} ranks")
        out.append("")
        head = "| bytes per rank | " + " | ".join(variants) + " | " + \
            " | ".join(f"{v}/mpi" for v in variants if v != "mpi") + " |"
        out.append(head)
        out.append("|" + "---|" * (head.count("|") - 1))
        for b in sorted({r["bytes"] for r in rows if r["ranks"] == n}):
            med = {}
            for v in variants:
                t = [r["time_us"] for r in rows if r["ranks"] == n and r["bytes"] == b
                     and r["variant"] == v and r["time_us"] > 0]
                med[v] = statistics.median(t) if t else None
            cells = [f"{med[v]:.1f}" if med[v] else "-" for v in variants]
            ratios = [f"{med[v] / med['mpi']:.2f}" if med[v] and med.get("mpi") else "-"
                      for v in variants if v != "mpi"]
            out.append(f"| {b} | " + " | ".join(cells) + " | " + " | ".join(ratios) + " |")
        out.append("")
    wrong = sum(int(r["wrong"]) for r in rows if r["wrong"].lstrip("-").isdigit()
                and int(r["wrong"]) > 0)
    out.append(f"wrong elements over all runs: {wrong}; failed runs: {len(failures)}")
    with open(os.path.join(a.out, "summary.md"), "w") as f:
        f.write("\n".join(out) + "\n")
    print("\n".join(out))
    return 1 if failures or wrong else 0
