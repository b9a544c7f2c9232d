"""The comparison sweep (scenarios smoke, compare, latency, loss, linkbound, dpdk, af_xdp): INA (in-network, kernel UDP aggregator; on loopback and across veth links
between network namespaces), INA's host algorithms (ring, tree, halving-doubling), Open MPI (TCP)
and Gloo (TCP), in one run, at N = 2, 4, 8, sizes 8 B .. 64 MiB, with and without injected loss.

Each run happens in a fresh network namespace of its own (its loopback carries the traffic; with
loss, an nft `numgen random` rule drops that percent of the packets it receives), or, for
`ina-veth`, in a topology of topo.py (workers and the aggregator in namespaces on one
bridge, the loss on every host's input). Without root, runs use the machine's loopback and the
lossy rows are skipped with a note.

Writes --out DIR (testbed/run.py gives it), and nothing outside it:
  machine.txt   CPU model, cores, kernel, load, date, git rev, the command line
  results.csv   variant,coll,ranks,loss_pct,bytes,count,dtype,op,time_us,algbw,busbw,wrong
  runs.csv      one row per run: variant,coll,ranks,loss_pct,status,seconds,note
  tables.txt    every tool's nccl-tests table, as printed
  summary.md    one nccl-tests style table per variant and N, lossless and lossy
then the report (report.py: plots, simulator calibration, DIR/REPORT.md) unless --no-report.
--link-rate R[,R...]: every peer across namespaces on worker links shaped to R (linksweep.py;
ratecheck.csv too); a start at a load above the core count is refused unless --force.

options (a scenario's args, or after `--` on testbed/run.py): [--quick] [-N 2,4,8] [-b 8] [-e 64M] [-f 2] [--loss 0,0.1,1]
                          [--loss-stepfactor 8] [--variants LIST] [--backends kernel]
                          [-n 20] [-w 5] [-B 256M] [--timeout 180] [--budget-min 20]
                          [--build-dir build] [--out DIR] [--no-report]
Variants: ina ina-veth host-ring host-tree host-hd mpi gloo, and alltoall rows (host-alltoall,
mpi-alltoall) when the benches' --help shows --coll; a variant that cannot run is listed with
the reason. The full sweep (the default) starts no run after 20 minutes (--budget-min) and
gives each run 180 s, so it ends within ~23 minutes; see README.md for the estimate of its
length. --quick takes about 1 minute.
"""
import argparse
import csv
import io
import os
import platform
import shutil
import signal
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
import linkbound  # noqa: E402
import linksweep  # noqa: E402
import record  # noqa: E402
import report  # noqa: E402
import topo  # noqa: E402

RUN_PY = os.path.join(os.path.dirname(HERE), "run.py")

ALL_VARIANTS = ["ina", "ina-veth", "host-ring", "host-tree", "host-hd", "mpi", "gloo",
                "host-alltoall", "mpi-alltoall"]
LINK_VARIANTS = linksweep.LINK_VARIANTS
CSV_FIELDS = ["variant", "coll", "ranks", "loss_pct", "bytes", "count", "dtype", "op", "time_us",
              "algbw", "busbw", "wrong", "link_rate", "block_bytes", "build", "round"]
RUNS_FIELDS = ["variant", "coll", "ranks", "loss_pct", "status", "seconds", "note", "link_rate",
               "dtype", "build"]


def parse_size(s):
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    t = s.strip().upper()
    try:
        return int(t[:-1]) * mult[t[-1]] if t and t[-1] in mult else int(t)
    except ValueError:
        raise argparse.ArgumentTypeError(f"size {s!r}: expected bytes with an optional K/M/G")


def parse_list(kind, conv):
    def p(s):
        try:
            return [conv(x) for x in s.split(",") if x]
        except ValueError as e:
            raise argparse.ArgumentTypeError(f"{kind} {s!r}: expected a comma-separated list "
                                             f"({e})")
    return p


def help_text(argv):
    try:
        r = subprocess.run(argv + ["--help"], capture_output=True, text=True, timeout=10)
        return r.stdout + r.stderr
    except (OSError, subprocess.TimeoutExpired):
        return ""


def load_check(force):
    """(ok, line): refuses a start at a 1-minute load above the core count unless forced."""
    load1 = os.getloadavg()[0]
    cores = os.cpu_count() or 1
    if load1 <= cores:
        return True, f"load check: {load1:.2f} <= {cores} cores: ok"
    if force:
        return True, (f"load check: FORCED: started at load {load1:.2f} above the {cores} cores "
                      "(--force); figures are not from an idle machine")
    return False, (f"load check: load average {load1:.2f} is above the {cores} cores: the "
                   "figures would measure the other jobs; run refused (wait, or --force to run "
                   "anyway, marked as forced)")


def machine_description(argv, load_line=""):
    cpu = "unknown CPU"
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    argv = os.environ.get("INA_TESTBED_COMMAND", "").split() or argv
    rev = subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"], capture_output=True,
                         text=True).stdout.strip() or "unknown"
    dirty = subprocess.run(["git", "-C", ROOT, "status", "--porcelain"], capture_output=True,
                           text=True).stdout.strip()
    load = open("/proc/loadavg").read().split()[:3] if os.path.exists("/proc/loadavg") else []
    return "\n".join([
        f"cpu: {cpu}",
        f"cores: {os.cpu_count()}",
        f"kernel: {platform.system()} {platform.release()} {platform.machine()}",
        f"date: {time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime())}",
        f"git: {rev}{' (with local changes)' if dirty else ''}",
        f"load average at start: {' '.join(load)}",
        f"command: {' '.join(argv)}",
    ] + ([load_line] if load_line else [])) + "\n"


def run_child(argv, env, timeout):
    """(status, output) of argv; on timeout or interrupt it gets SIGTERM first (so topo.py can
    tear its namespaces down), SIGKILL 10 s later."""
    p = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                         text=True)
    try:
        out, _ = p.communicate(timeout=timeout)
        return p.returncode, out
    except BaseException as e:
        p.terminate()
        try:
            out, _ = p.communicate(timeout=10)
        except subprocess.TimeoutExpired:
            p.kill()
            out, _ = p.communicate()
        if isinstance(e, subprocess.TimeoutExpired):
            return 124, (out or "") + f"\n# timed out after {timeout:.0f}s\n"
        raise


class Box:
    """A network namespace of one run: lo up, optional loss on what lo delivers."""

    def __init__(self, loss, use_netns):
        self.loss, self.use_netns = loss, use_netns
        self.name = None

    def __enter__(self):
        if self.use_netns:
            self.name = f"inatb-{os.getpid() % 100000}-h{time.monotonic_ns() % 100000}"
            subprocess.run(["ip", "netns", "add", self.name], check=True)
            subprocess.run(["ip", "netns", "exec", self.name, "ip", "link", "set", "lo", "up"],
                           check=True)
            if self.loss > 0:
                subprocess.run(["ip", "netns", "exec", self.name, "nft", "-f", "-"], check=True,
                               text=True, input=f"table inet {topo.NFT_TABLE} {{\n"
                               f"{topo.loss_rules(self.loss, 'input')}}}\n")
        return self

    def argv(self, argv):
        return (["ip", "netns", "exec", self.name] + argv) if self.name else argv

    def __exit__(self, *exc):
        if self.name:
            r = subprocess.run(["ip", "netns", "pids", self.name], capture_output=True, text=True)
            for pid in r.stdout.split():  # only this run's processes are in this namespace
                try:
                    os.kill(int(pid), 9)
                except (ProcessLookupError, ValueError):
                    pass
            subprocess.run(["ip", "netns", "del", self.name], capture_output=True)
            self.name = None


class Harness:
    def __init__(self, a):
        self.a = a
        self.builds = [os.path.abspath(b) for b in (a.builds or [a.build_dir])]
        self.labels = record.build_labels(self.builds) if len(self.builds) == 2 else [""]
        self.use(self.builds[0])
        self.root_ok, self.root_why = topo.can_make_namespaces()
        ina_help = help_text([self.bin["ina"]]) if os.access(self.bin["ina"], os.X_OK) else ""
        mpi_help = help_text([self.bin["mpi"]]) if os.access(self.bin["mpi"], os.X_OK) else ""
        self.ina_transport_flag = "--transport" in ina_help and "--algo" in ina_help
        self.ina_coll_flag = "--coll" in ina_help
        self.agg_help = help_text([self.bin["agg"]]) if os.access(self.bin["agg"], os.X_OK) else ""
        self.mpi_coll_flag = "--coll" in mpi_help
        self.out = os.path.abspath(a.out)
        self.notes = []
        self.port = 29500 + os.getpid() % 2000

    def use(self, build):
        """The binaries of this build directory from now on."""
        self.build = build
        self.bin = {k: os.path.join(self.build, *v) for k, v in {
            "ina": ("testbed", "ina-bench"), "agg": ("aggregator", "ina-aggregator"),
            "mpi": ("testbed", "ina-mpi-bench"), "gloo": ("testbed", "ina-gloo-bench"),
            "nccl-net": ("testbed", "ina-nccl-net-bench")}.items()}

    def ab_points(self, i):
        """(round, build label) of each run of the i-th point, the binaries switched before
        each: one run without --builds; with two builds, --ab-rounds rounds of A then B or B
        then A (the order flips from point to point and from round to round)."""
        if len(self.builds) == 1:
            yield 0, ""
            return
        for r in range(self.a.ab_rounds):
            for k in ((0, 1) if (i + r) % 2 == 0 else (1, 0)):
                self.use(self.builds[k])
                yield r + 1, self.labels[k]

    # What can run, and why not.
    def unavailable(self, variant):
        exe = lambda k: os.access(self.bin[k], os.X_OK)  # noqa: E731
        if variant in ("ina", "host-ring", "host-tree", "host-hd", "host-alltoall") and not exe("ina"):
            return f"{self.bin['ina']} is not built"
        if variant == "ina-veth":
            if not self.root_ok:
                return self.root_why
            if not exe("agg"):
                return f"{self.bin['agg']} is not built"
        if variant.startswith("mpi"):
            if not exe("mpi"):
                return f"{self.bin['mpi']} is not built (libopenmpi-dev, -Dmpi=enabled)"
            if shutil.which("mpirun") is None:
                return "mpirun is not installed (openmpi-bin)"
        if variant == "gloo" and not exe("gloo"):
            return f"{self.bin['gloo']} is not built (libgloo-dev)"
        if variant == "nccl-net" and not exe("nccl-net"):
            return f"{self.bin['nccl-net']} is not built"
        if variant == "nccl-net" and getattr(self.a, "coll", "allreduce") != "alltoall":
            return "ina-nccl-net-bench runs AllToAll only (--coll alltoall)"
        if variant == "host-alltoall" and not self.ina_coll_flag:
            return "ina-bench --help shows no --coll (alltoall mode not merged yet)"
        if variant == "mpi-alltoall" and not self.mpi_coll_flag:
            return "ina-mpi-bench --help shows no --coll (alltoall mode not merged yet)"
        return None

    def sizes_args(self, loss):
        f = self.a.stepfactor if loss == 0 else self.a.loss_stepfactor
        return ["-b", str(self.a.minbytes), "-e", str(self.a.maxbytes), "-f", str(f),
                "-n", str(self.a.iters), "-w", str(self.a.warmup), "-c", "1",
                "--max-bytes-per-size", str(self.a.cap)]

    def command(self, variant, n, tmpcsv):
        """(argv, env) of one run on loopback (not ina-veth)."""
        common = self.sizes_args(self.cur_loss) + ["--csv", tmpcsv]
        # The variant decides the path: none of the caller's path settings leak in.
        env = {k: v for k, v in os.environ.items()
               if k not in ("INA_TRANSPORT", "INA_STORE", "INA_ALGO", "INA_FALLBACK",
                            "INA_AGGREGATOR", "INA_RANK", "INA_WORLD_SIZE")}
        env["TMPDIR"] = self.tmpdir  # Gloo's FileStore: under the output directory too
        self.port += 1
        if variant == "ina":
            argv = [self.bin["ina"], "--workers", str(n)] + common
            if self.ina_transport_flag:
                argv += ["--transport", "inc"]
            return argv, env
        if variant.startswith("host-"):
            algo = variant.split("-", 1)[1]
            argv = [self.bin["ina"], "--workers", str(n)] + common
            if self.ina_transport_flag:
                argv += ["--transport", "host"]
                if algo != "alltoall":
                    argv += ["--algo", algo]
            else:
                env.update(INA_TRANSPORT="host", INA_STORE=f"127.0.0.1:{self.port}",
                           INA_FALLBACK="float", INA_ALGO=algo)
            if algo == "alltoall":
                argv += ["--coll", "alltoall"]
            return argv, env
        if variant.startswith("mpi"):
            flags = ["-np", str(n), "--oversubscribe", "--mca", "btl", "tcp,self",
                     "--mca", "btl_tcp_if_include", "lo", "--mca", "orte_tmpdir_base", self.out]
            if os.geteuid() == 0:
                flags = ["--allow-run-as-root"] + flags
            extra = ["--coll", "alltoall"] if variant == "mpi-alltoall" else []
            return ["mpirun"] + flags + [self.bin["mpi"]] + common + extra, env
        if variant == "gloo":
            return [self.bin["gloo"], "--ranks", str(n)] + common, env
        raise ValueError(variant)

    def run_one(self, variant, n, loss, tables):
        """Runs one (variant, N, loss); returns (status, rows, note)."""
        self.cur_loss = loss
        tmpcsv = os.path.join(self.out, f".tmp-{variant}-{n}-{loss}.csv")
        if os.path.exists(tmpcsv):
            os.remove(tmpcsv)
        if variant == "ina-veth":
            argv = [sys.executable, RUN_PY, "topo", "run-ina", "-N", str(n),
                    "-M", "1", "--build-dir", self.build, "--timeout", str(self.a.timeout)]
            if loss > 0:
                argv += ["--loss", ",".join([f"w{i}={loss}" for i in range(n)] + [f"agg0={loss}"])]
            argv += ["--"] + self.sizes_args(loss) + ["--csv", tmpcsv]
            env, box = dict(os.environ), Box(0, False)
        else:
            argv, env = self.command(variant, n, tmpcsv)
            box = Box(loss, self.root_ok)
        shown = " ".join(argv).replace(ROOT + "/", "")
        envs = " ".join(f"{k}={v}" for k, v in env.items()
                        if k.startswith("INA_") and os.environ.get(k) != v)
        with box:
            header = f"== {variant} N={n} loss={loss}%: {envs + ' ' if envs else ''}{shown}\n"
            rc, text = run_child(box.argv(argv), env, self.a.timeout + 15)
        tables.write(header + text + (f"# exited with status {rc}\n" if rc else "") + "\n")
        tables.flush()
        rows = []
        if os.path.exists(tmpcsv):
            with open(tmpcsv, newline="") as f:
                for r in csv.DictReader(f):
                    rows.append({"variant": variant,
                                 "coll": "alltoall" if variant.endswith("alltoall") else "allreduce",
                                 "loss_pct": loss, **{k: r[k] for k in CSV_FIELDS[2:] if k != "loss_pct"
                                                      and k in r}})
            os.remove(tmpcsv)
        note = ""
        if rc != 0:
            last = [l for l in text.strip().splitlines() if l.strip()][-1:] or [""]
            note = f"exit {rc}{' (timeout)' if rc == 124 else ''}: {last[0][:160]}"
        return ("ok" if rc == 0 else "failed"), rows, note

    def run_link(self):
        """--link-rate: every variant across namespaces on shaped links (linksweep)."""
        a = self.a
        sweep = linksweep.LinkSweep(self)
        skipped = []
        for v in a.variants:
            why = sweep.unavailable(v)
            if why:
                skipped.append((v, why))
        runnable = [v for v in a.variants if v not in dict(skipped)]
        plan = sweep.plan(runnable, a.dtypes)
        for v, why in skipped:
            print(f"# skipped {v}: {why}", flush=True)
        t0 = time.time()
        with open(os.path.join(self.out, "results.csv"), "w", newline="") as rf, \
                open(os.path.join(self.out, "runs.csv"), "w", newline="") as uf, \
                open(os.path.join(self.out, "ratecheck.csv"), "w", newline="") as cf, \
                open(os.path.join(self.out, "tables.txt"), "w") as tables:
            rw = csv.DictWriter(rf, CSV_FIELDS)
            rw.writeheader()
            uw = csv.writer(uf)
            uw.writerow(RUNS_FIELDS)
            cw = csv.writer(cf)
            cw.writerow(["link_rate", "ranks", "src", "dst", "expected_Bps", "measured_Bps",
                         "ratio", "status"])
            for v, why in skipped:
                uw.writerow([v, "", "", "", "skipped", 0, why, "", ""])
            done, refused = sweep.run(plan, tables, rw, uw, cw, t0, CSV_FIELDS)
        with open(os.path.join(self.out, "summary.md"), "w") as f:
            if a.coll == "allreduce":
                f.write(link_summary_markdown(os.path.join(self.out, "results.csv"), skipped))
            else:
                f.write(alltoall_summary_markdown(os.path.join(self.out, "results.csv"), skipped,
                                                  a.coll, a.zipf))
        print(f"# {done} runs in {time.time() - t0:.0f}s; results in {self.out}", flush=True)
        with open(os.path.join(self.out, "machine.txt"), "a") as f:
            f.write(f"load average at end: {' '.join(open('/proc/loadavg').read().split()[:3])}\n")
        return 2 if refused else 0

    def run(self):
        a = self.a
        os.makedirs(self.out, exist_ok=True)
        with open(os.path.join(self.out, "machine.txt"), "w") as f:
            f.write(machine_description(sys.argv, self.load_line))
        if a.link_rate:
            return self.run_link()
        variants = [v for v in a.variants]
        for b in a.backends:
            if b != "kernel":
                self.notes.append(f"backend {b}: skipped (only the kernel UDP aggregator exists "
                                  "in this build; the option is the hook for DPDK)")
        plan, skipped = [], []
        for v in variants:
            why = self.unavailable(v)
            if why:
                skipped.append((v, why))
        runnable = [v for v in variants if v not in dict(skipped)]
        # Lossless first, all variants at each N together: a sweep cut short by --budget-min
        # still compares every variant.
        for loss in a.loss:
            if loss > 0 and not self.root_ok:
                skipped.append((f"loss={loss}%", self.root_why))
                continue
            for n in a.ranks:
                for v in runnable:
                    if loss > 0 and v.endswith("alltoall"):
                        continue
                    plan.append((v, n, loss))
        for v, why in skipped:
            print(f"# skipped {v}: {why}", flush=True)
        if not self.ina_transport_flag:
            self.notes.append("ina-bench has no --transport/--algo yet: host rows run through "
                              "INA_TRANSPORT=host INA_STORE INA_FALLBACK=float INA_ALGO=<algo>")
        for n in self.notes:
            print(f"# note: {n}", flush=True)
        results = os.path.join(self.out, "results.csv")
        runs_path = os.path.join(self.out, "runs.csv")
        self.tmpdir = os.path.join(self.out, ".tmp")
        os.makedirs(self.tmpdir, exist_ok=True)
        try:
            return self._run_loopback(plan, skipped, results, runs_path)
        finally:
            shutil.rmtree(self.tmpdir, ignore_errors=True)

    def _run_loopback(self, plan, skipped, results, runs_path):
        a = self.a
        t0 = time.time()
        with open(results, "w", newline="") as rf, open(runs_path, "w", newline="") as uf, \
                open(os.path.join(self.out, "tables.txt"), "w") as tables:
            rw = csv.DictWriter(rf, CSV_FIELDS)
            rw.writeheader()
            uw = csv.writer(uf)
            uw.writerow(RUNS_FIELDS)
            for v, why in skipped:
                uw.writerow([v, "", "", "", "skipped", 0, why, "", ""])
            for i, (v, n, loss) in enumerate(plan):
                if a.budget_min > 0 and time.time() - t0 > a.budget_min * 60:
                    note = f"not started: the sweep's budget of {a.budget_min:g} min was spent"
                    print(f"[{i + 1}/{len(plan)}] {v:13s} N={n} loss={loss:<4g}% skipped "
                          f"({note})", flush=True)
                    uw.writerow([v, "", n, loss, "skipped", 0, note, "", ""])
                    continue
                for rnd, label in self.ab_points(i):
                    s0 = time.time()
                    status, rows, note = self.run_one(v, n, loss, tables)
                    dt = time.time() - s0
                    for r in rows:
                        rw.writerow({**r, "build": label, "round": rnd if label else ""})
                    rf.flush()
                    uw.writerow([v, "alltoall" if v.endswith("alltoall") else "allreduce", n,
                                 loss, status, f"{dt:.1f}", note, "", "", label])
                    uf.flush()
                    done = time.time() - t0
                    eta = done / (i + 1) * (len(plan) - i - 1)
                    print(f"[{i + 1}/{len(plan)}] {v:13s} N={n} loss={loss:<4g}% {status:6s} "
                          f"{len(rows):2d} sizes {dt:6.1f}s  elapsed {done:5.0f}s  eta {eta:5.0f}s"
                          + (f"  [{label} round {rnd}]" if label else "")
                          + (f"  ({note})" if note else ""), flush=True)
        with open(os.path.join(self.out, "summary.md"), "w") as f:
            f.write(summary_markdown(results, self.notes, skipped))
        print(f"# {len(plan)} runs in {time.time() - t0:.0f}s; results in "
              f"{os.path.relpath(self.out, ROOT)}", flush=True)
        return 0


def summary_markdown(results_csv, notes, skipped):
    with open(results_csv, newline="") as f:
        rows = list(csv.DictReader(f))
    out = io.StringIO()
    for n in notes:
        out.write(f"* note: {n}\n")
    for v, why in skipped:
        out.write(f"* skipped {v}: {why}\n")
    keys = []
    for r in rows:
        k = (r["variant"], r["coll"], r["ranks"], r["loss_pct"])
        if k not in keys:
            keys.append(k)
    for k in keys:
        out.write(f"\n### {k[0]} ({k[1]}), N = {k[2]}, loss {k[3]}%\n\n```\n")
        out.write("#       size         count      type   redop     time   algbw   busbw  #wrong\n")
        out.write("#        (B)    (elements)                       (us)  (GB/s)  (GB/s)\n")
        for r in rows:
            if (r["variant"], r["coll"], r["ranks"], r["loss_pct"]) == k:
                out.write(f"{int(r['bytes']):12d}  {int(r['count']):12d}  {r['dtype']:>8s}  "
                          f"{r['op']:>6s}  {float(r['time_us']):9.1f}  {float(r['algbw']):6.2f}  "
                          f"{float(r['busbw']):6.2f}  {r['wrong']:>6s}\n")
        out.write("```\n")
    return out.getvalue()


def link_summary_markdown(results_csv, skipped):
    with open(results_csv, newline="") as f:
        rows = list(csv.DictReader(f))
    out = [f"* skipped {v}: {why}" for v, why in skipped]
    out += ["", "Each variant's algbw (MB/s of the user's buffer) and its % of the bound "
            "(linkbound.py); the smallest size shows the time of one AllReduce.", "",
            linkbound.headline_table(rows), "", linkbound.size_tables(rows, min_bytes=1), ""]
    return "\n".join(out)


def alltoall_bound_us(coll, zipf, n, nbytes, bps, dtype_bytes=4):
    """The busiest link's time for one AllToAll(v) on a star of links of bps each way: uniform,
    each rank sends and receives (N-1)/N of its buffer; Zipf, rank 0 (the hot expert) receives
    N-1 blocks of share 1/(1)^S / sum_j 1/(j+1)^S (bench_common.h's bench_a2av_count). TCP
    framing (1448 of 1514 bytes)."""
    if coll == "alltoall":
        busiest = nbytes * (n - 1) / n
    else:
        elems = nbytes // dtype_bytes
        total = sum((j + 1) ** -zipf for j in range(n))
        shares = [int(elems * (j + 1) ** -zipf / total) for j in range(n)]
        busiest = (n - 1) * (shares[0] + elems - sum(shares)) * dtype_bytes
    return busiest / linkbound.TCP_EFFICIENCY / (bps / 8) * 1e6


def alltoall_summary_markdown(results_csv, skipped, coll, zipf):
    """Per link rate and N: each variant's time per size, the busiest link's bound, and each
    variant's time over Open MPI's."""
    with open(results_csv, newline="") as f:
        rows = list(csv.DictReader(f))
    out = [f"* skipped {v}: {why}" for v, why in skipped]
    what = "AllToAll (uniform)" if coll == "alltoall" else f"AllToAllv, Zipf({zipf:g}) expert loads"
    out += ["", f"{what}: time per call (us: the slowest rank's average over the timed "
            "iterations), the busiest link's bound (us) and time / Open MPI's; the variants run "
            "one after the other on the same links.", ""]
    groups = sorted({(int(float(r["link_rate"])), int(r["ranks"]), r["dtype"]) for r in rows})
    for rate, n, dtype in groups:
        sub = [r for r in rows if int(float(r["link_rate"])) == rate and int(r["ranks"]) == n
               and r["dtype"] == dtype]
        variants = list(dict.fromkeys(r["variant"] for r in sub))
        out += [f"### {linkbound.rate_name(rate)} links, N = {n}, {dtype}", "",
                "| bytes per rank | bound | " + " | ".join(variants) + " | " +
                " | ".join(f"{v}/mpi" for v in variants if v != "mpi") + " |",
                "|---|---|" + "---|" * (2 * len(variants) - ("mpi" in variants)) ]
        for b in sorted({int(r["bytes"]) for r in sub}):
            t = {r["variant"]: float(r["time_us"]) for r in sub if int(r["bytes"]) == b}
            cells = [f"{t[v]:.0f}" if v in t else "-" for v in variants]
            ratio = [f"{t[v] / t['mpi']:.2f}" if v in t and t.get("mpi") else "-"
                     for v in variants if v != "mpi"]
            width = linkbound.DTYPE_BYTES.get(dtype, 4)
            out.append(f"| {b} | {alltoall_bound_us(coll, zipf, n, b, rate, width):.0f} | " +
                       " | ".join(cells) + " | " + " | ".join(ratio) + " |")
        out.append("")
    wrong = sum(int(r["wrong"]) for r in rows if r["wrong"].lstrip("-").isdigit()
                and int(r["wrong"]) > 0)
    out.append(f"wrong elements over all rows: {wrong}")
    return "\n".join(out) + "\n"


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true",
                    help="smoke test: N 2,4; 8 B..256 KiB x8; 3 iterations; loss 0,1")
    ap.add_argument("-N", "--ranks", type=parse_list("ranks", int), default=None)
    ap.add_argument("-b", "--minbytes", type=parse_size, default=None)
    ap.add_argument("-e", "--maxbytes", type=parse_size, default=None)
    ap.add_argument("-f", "--stepfactor", type=int, default=None)
    ap.add_argument("--loss", type=parse_list("loss", float), default=None,
                    help="loss percents (0 = none), e.g. 0,0.1,1")
    ap.add_argument("--loss-stepfactor", type=int, default=None,
                    help="size step of the lossy runs (fewer sizes)")
    ap.add_argument("--variants", type=parse_list("variants", str), default=None,
                    help=f"loopback: {','.join(ALL_VARIANTS)}; --link-rate: "
                         f"{','.join(LINK_VARIANTS)}")
    ap.add_argument("--backends", type=parse_list("backends", str), default=["kernel"],
                    help="aggregator backends (kernel; dpdk when it lands)")
    ap.add_argument("-n", "--iters", type=int, default=None)
    ap.add_argument("-w", "--warmup", type=int, default=None)
    ap.add_argument("-B", "--cap", type=parse_size, default=None,
                    help="max bytes moved per size (iterations capped; default 256M, "
                         "--link-rate 32M)")
    ap.add_argument("--budget-min", type=float, default=None,
                    help="start no run after this many minutes (full: 20, quick: 5; 0: none)")
    ap.add_argument("--timeout", type=float, default=None,
                    help="seconds per run (full: 180, quick: 60)")
    ap.add_argument("--build-dir", default=os.path.join(ROOT, "build"))
    ap.add_argument("--builds", type=parse_list("builds", str), default=None,
                    help="A,B: two build directories, each point run with both, alternated "
                         "(testbed/run.py --builds A,B --alternate passes it)")
    ap.add_argument("--ab-rounds", type=int, default=1,
                    help="--builds: runs of each point per build (the order flips each time)")
    ap.add_argument("--out", required=True, help="output directory")
    ap.add_argument("--no-report", action="store_true", help="do not write DIR/REPORT.md")
    ap.add_argument("--link-rate", type=parse_list("link rate", linkbound.parse_rate),
                    default=None,
                    help="link-bound sweep: every variant across namespaces on worker links "
                         "shaped to each rate (tbf both ends), e.g. 500mbit,1gbit; the links are "
                         "checked first")
    ap.add_argument("--mtu", type=int, default=None,
                    help="--link-rate: every veth's MTU (default: the kernel's 1500; 9000 for "
                         "jumbo frames, which INA's blocks follow up to 8 KiB)")
    ap.add_argument("--tcp-cc", default=None,
                    help="--link-rate: the TCP congestion control of every namespace, e.g. "
                         "cubic (default: the machine's, which new namespaces inherit; the run's "
                         "tables.txt names the one in use). TCP peers differ under each: under "
                         "bbr tbf's bursts swing the flows' rate estimates")
    ap.add_argument("-d", "--dtypes", type=parse_list("dtypes", str), default=None,
                    help="link-bound sweep: float32,bfloat16 (Gloo and Open MPI: float32 only)")
    ap.add_argument("--coll", default="allreduce", choices=["allreduce", "alltoall", "alltoallv"],
                    help="--link-rate: the collective (alltoall(v) variants: host, gloo, mpi)")
    ap.add_argument("--zipf", type=float, default=1.2,
                    help="--coll alltoallv: expert loads 1/(j+1)^S")
    ap.add_argument("--force", action="store_true",
                    help="run even at a load above the core count (the output says so)")
    ap.add_argument("--ns-prefix", default="inatb",
                    help="first part of the names of the sweep's namespaces")
    a = ap.parse_args(argv)
    quick = dict(ranks=[2, 4], minbytes=8, maxbytes=256 << 10, stepfactor=8, loss=[0.0, 1.0],
                 loss_stepfactor=8, iters=3, warmup=1, timeout=60, budget_min=5)
    full = dict(ranks=[2, 4, 8], minbytes=8, maxbytes=64 << 20, stepfactor=2,
                loss=[0.0, 0.1, 1.0], loss_stepfactor=8, iters=20, warmup=5, timeout=180,
                budget_min=20)
    link = dict(ranks=[4, 8], minbytes=8, maxbytes=64 << 20, stepfactor=2, loss=[0.0],
                loss_stepfactor=8, iters=10, warmup=2, timeout=180, budget_min=20,
                dtypes=["float32", "bfloat16"])
    if a.link_rate:
        if a.variants is None:  # every AllReduce peer (nccl-net runs AllToAll only)
            a.variants = [v for v in LINK_VARIANTS if v != "nccl-net"]
        if a.cap is None:
            a.cap = 32 << 20
        defaults = link
    else:
        if a.variants is None:
            a.variants = list(ALL_VARIANTS)
        if a.cap is None:
            a.cap = 256 << 20
        defaults = quick if a.quick else full
    for k, v in defaults.items():
        if getattr(a, k, None) is None:
            setattr(a, k, v)
    if a.dtypes is None:
        a.dtypes = ["float32"]
    known = LINK_VARIANTS if a.link_rate else ALL_VARIANTS
    for v in a.variants:
        if v not in known:
            ap.error(f"--variants: unknown {v!r} (expected some of {','.join(known)})")
    for d in a.dtypes:
        if d not in linkbound.DTYPE_BYTES:
            ap.error(f"--dtypes: unknown {d!r} (expected float32, bfloat16, float16 or int32)")
    if a.builds is not None:
        if len(a.builds) != 2:
            ap.error("--builds: two build directories")
        for b in a.builds:
            if not os.access(os.path.join(b, "testbed", "ina-bench"), os.X_OK):
                ap.error(f"--builds: {b}/testbed/ina-bench is not built")
        a.no_report = True  # the report merges rows by point: it has no notion of two builds
    if a.ab_rounds < 1:
        ap.error("--ab-rounds must be >= 1")
    if a.coll != "allreduce":
        if not a.link_rate:
            ap.error("--coll: AllToAll on loopback is the alltoall scenario; here with --link-rate")
        bad = [v for v in a.variants if v not in ("host", "gloo", "mpi", "nccl-net")]
        if bad:
            ap.error(f"--coll {a.coll}: variants host, gloo, mpi, nccl-net only "
                     f"(not {','.join(bad)})")
        if a.coll == "alltoallv" and "gloo" in a.variants:
            a.variants.remove("gloo")
            print("# gloo skipped: gloo::alltoallv is not in ina-gloo-bench (AllToAll only)")
        if a.coll == "alltoallv" and "nccl-net" in a.variants:
            a.variants.remove("nccl-net")
            print("# nccl-net skipped: ina-nccl-net-bench runs AllToAll only")
        a.no_report = True  # the report's bounds are AllReduce's
    if a.tcp_cc and not a.link_rate:
        ap.error("--tcp-cc: with --link-rate (the namespaces' congestion control)")
    if a.link_rate and any(x > 0 for x in a.loss):
        ap.error("--loss: the link-bound sweep (--link-rate) runs without loss")
    if any(not 0 <= x <= 100 for x in a.loss):
        ap.error("--loss: each percent must be in [0, 100]")
    if any(n < 1 for n in a.ranks):
        ap.error("-N: rank counts must be >= 1")
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # unwinds: namespaces deleted
    ok, load_line = load_check(a.force)
    print(f"# {load_line}", flush=True)
    if not ok:
        return 3
    h = Harness(a)
    h.load_line = load_line
    rc = h.run()
    if not a.no_report:
        # The report goes into the output directory: --out DIR writes nowhere else.
        try:
            rc |= report.main([h.out, "--report", os.path.join(h.out, "REPORT.md")])
        except SystemExit as e:  # no rows (every variant skipped): said, not fatal
            print(f"# report: {e}", flush=True)
    return rc
