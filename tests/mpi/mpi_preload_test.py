#!/usr/bin/python3
"""libina-mpi on an unmodified MPI program (allreduce_program.c), 4 ranks of Open MPI on loopback.

Runs the program three times (four with ina-controller): plain MPI; with LD_PRELOAD=libina-mpi.so and a local ina-aggregator;
with the preload but no aggregator answering (INA must turn itself off and say so). Asserts:
  - plain vs preload: byte-identical results for int SUM/MIN/MAX, float MIN/MAX and every call
    that passes through (double, PROD, a split communicator); float SUM within the documented
    bound |out - s| <= N * M * 2^-B + ulp(s) (protocol/QUANTIZATION.md, M the largest |input|,
    B = 30 - ceil(log2 N)) against the exact sum;
  - every rank holds the same result in each run;
  - INA_MPI_STATS=1 shows INA served exactly the supported calls in MPI_COMM_WORLD on each rank;
  - without an aggregator every result is byte-identical to plain MPI and stderr says INA is off;
  - with INA_CONTROLLER and no INA_AGGREGATOR (an ina-controller and an aggregator registered with
    it, when the controller is built) the job is admitted, INA is on at every rank and every
    result equals the INA_AGGREGATOR run's.
Exit 77 (skip) when mpirun is missing.
"""
import math
import os
import re
import shutil
import struct
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import controller_procs  # noqa: E402

NP = 4


def skip(why):
    print("SKIP: " + why)
    sys.exit(77)


def fail(why):
    print("FAIL: " + why)
    sys.exit(1)


def mpirun_cmd(mpirun, program, outdir, env_vars):
    cmd = [mpirun, "--allow-run-as-root", "--oversubscribe", "--mca", "btl", "tcp,self",
           "--mca", "btl_tcp_if_include", "lo", "--mca", "oob_tcp_if_include", "lo", "-np", str(NP)]
    for k in env_vars:
        cmd += ["-x", k]
    return cmd + [program, outdir]


def run(mpirun, program, outdir, extra_env, timeout=120):
    env = dict(os.environ)
    env.update(extra_env)
    env["OMPI_MCA_rmaps_base_oversubscribe"] = "1"
    cmd = mpirun_cmd(mpirun, program, outdir, sorted(extra_env))
    p = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                       timeout=timeout, text=True)
    if p.returncode != 0:
        fail("%s exited %d:\n%s" % (" ".join(cmd), p.returncode, p.stdout))
    return p.stdout


def load_manifest(d):
    cases = []
    with open(os.path.join(d, "manifest.txt")) as f:
        for line in f:
            i, name, dtype, op, comm, mode, count, maxabs = line.split()
            cases.append(dict(i=int(i), name=name, dtype=dtype, op=op, comm=comm, mode=mode,
                              count=int(count), maxabs=float(maxabs)))
    return cases


def results(d, c):
    """Every rank's bytes, after checking that the ranks of one communicator got the same (the
    split communicator holds the even and the odd ranks)."""
    blobs = []
    for r in range(NP):
        with open(os.path.join(d, "r%d_c%d.bin" % (r, c["i"])), "rb") as f:
            blobs.append(f.read())
    for r in range(NP):
        first = r % 2 if c["comm"] == "split" else 0
        if blobs[r] != blobs[first]:
            fail("%s: rank %d's result differs from rank %d's in %s" % (c["name"], r, first, d))
    return b"".join(blobs)


def ulp32(x):
    x = abs(x)
    if x < 2.0 ** -126:
        return 2.0 ** -149
    return 2.0 ** (math.frexp(x)[1] - 1 - 23)


def supported(c):
    return c["comm"] == "world" and c["dtype"] in ("int", "float") and c["op"] in ("sum", "min", "max")


def run_with_controller(mpirun, program, lib, ctl_bin, agg_bin, outdir, procs):
    """The preload with INA_CONTROLLER only, against an ina-controller and an ina-aggregator
    registered with it; returns (mpirun's output, admissions the controller counted)."""
    tmp = os.path.dirname(outdir)
    try:
        ctl_port = controller_procs.start_managed(ctl_bin, agg_bin, tmp, procs)
        before = controller_procs.admitted_total(ctl_port)
    except RuntimeError as e:
        fail(str(e))
    out = run(mpirun, program, outdir, {"LD_PRELOAD": lib, "INA_MPI_STATS": "1",
                                        "INA_CONTROLLER": "127.0.0.1:%d" % ctl_port})
    try:
        return out, controller_procs.admitted_total(ctl_port) - before
    except RuntimeError as e:
        fail(str(e))


def check_ina(c, a, x, plain, b, what):
    """Case c through INA (bytes x) against plain MPI (bytes a): float SUM within the bound,
    everything else identical."""
    if c["dtype"] == "float" and c["op"] == "sum":
        with open(os.path.join(plain, "ref_c%d.bin" % c["i"]), "rb") as f:
            ref = struct.unpack("<%dd" % c["count"], f.read())
        got = struct.unpack("<%df" % c["count"], x[:4 * c["count"]])
        mpi = struct.unpack("<%df" % c["count"], a[:4 * c["count"]])
        qb = NP * c["maxabs"] * 2.0 ** -b
        worst = 0.0
        for i, (s, v, m) in enumerate(zip(ref, got, mpi)):
            bound = qb + ulp32(abs(s) + qb)
            if abs(v - s) > bound:
                fail("%s%s[%d]: INA %r vs exact %r: error %g > bound %g"
                     % (what, c["name"], i, v, s, abs(v - s), bound))
            # MPI's own float sum: N - 1 roundings, each within 2^-24 of a partial sum.
            if abs(m - s) > (NP - 1) * NP * c["maxabs"] * 2.0 ** -24:
                fail("%s[%d]: plain MPI %r vs exact %r" % (c["name"], i, m, s))
            worst = max(worst, abs(v - s) / bound)
        print("%s%-24s within bound (worst error %.3f of it)" % (what, c["name"], worst))
    elif a != x:
        fail("%s%s: results differ with and without the preload" % (what, c["name"]))
    else:
        print("%s%-24s identical" % (what, c["name"]))


def main():
    mpirun = shutil.which("mpirun")
    if mpirun is None:
        skip("mpirun not found (Debian package openmpi-bin)")
    program = os.environ["MPI_PROGRAM"]
    lib = os.environ["INA_MPI_LIB"]
    agg_bin = os.environ["INA_AGGREGATOR_BIN"]
    tmp = tempfile.mkdtemp(prefix="ina-mpi-test-")
    agg = None
    procs = []  # the controller run's children
    try:
        plain, ina, off = (os.path.join(tmp, n) for n in ("plain", "ina", "off"))
        for d in (plain, ina, off):
            os.mkdir(d)
        run(mpirun, program, plain, {})

        port_file = os.path.join(tmp, "agg.port")
        agg = subprocess.Popen([agg_bin, "--world-size", str(NP), "--bind", "127.0.0.1", "--port",
                                "0", "--port-file", port_file, "--stats-interval-ms", "0"])
        deadline = time.time() + 10
        while not (os.path.exists(port_file) and open(port_file).read().strip()):
            if time.time() > deadline or agg.poll() is not None:
                fail("ina-aggregator did not start")
            time.sleep(0.05)
        port = int(open(port_file).read().strip())
        out = run(mpirun, program, ina, {"LD_PRELOAD": lib, "INA_MPI_STATS": "1",
                                         "INA_AGGREGATOR": "127.0.0.1:%d" % port})
        print(out)
        agg.terminate()
        agg.wait(timeout=10)
        agg = None

        # Nothing listens on the aggregator's old port now: INA must step aside, say so, and MPI
        # must give its own results.
        out_off = run(mpirun, program, off, {"LD_PRELOAD": lib, "INA_MPI_STATS": "1",
                                             "INA_AGGREGATOR": "127.0.0.1:%d" % port,
                                             "INA_TIMEOUT_MS": "2000"})
        print(out_off)

        # INA_CONTROLLER and no INA_AGGREGATOR: libina's rules admit the job through the
        # controller, onto an aggregator registered with it.
        ctl_bin = os.environ.get("INA_CONTROLLER_BIN", "")
        ctl_dir = None
        if ctl_bin:
            ctl_dir = os.path.join(tmp, "ctl")
            os.mkdir(ctl_dir)
            out_ctl, admitted = run_with_controller(mpirun, program, lib, ctl_bin, agg_bin,
                                                    ctl_dir, procs)
            print(out_ctl)
            if admitted == 0:
                fail("INA_CONTROLLER without INA_AGGREGATOR: the controller admitted nothing")
            on = re.findall(r"ina-mpi: rank \d+: INA on", out_ctl)
            if len(on) != NP or "INA is off" in out_ctl:
                fail("INA_CONTROLLER without INA_AGGREGATOR: INA is not on at every rank")
            print("INA_CONTROLLER only: %d admission(s), INA on at every rank" % admitted)
        else:
            print("no ina-controller built: the INA_CONTROLLER run is left out")

        cases = load_manifest(plain)
        n_blocking = sum(1 for c in cases if supported(c) and c["mode"] == "blocking")
        n_nonblocking = sum(1 for c in cases if supported(c) and c["mode"] == "nonblocking")
        n_passed = sum(1 for c in cases if not supported(c))
        b = 30 - math.ceil(math.log2(NP))
        for c in cases:
            a = results(plain, c)
            if ctl_dir is not None:
                check_ina(c, a, results(ctl_dir, c), plain, b, "admitted by the controller: ")
            x = results(ina, c)
            if results(off, c) != a:
                fail("%s: with INA off the preload changed the result" % c["name"])
            if ctl_dir is not None and results(ctl_dir, c) != x:
                fail("%s: admitted through the controller, INA gave another result than with "
                     "INA_AGGREGATOR" % c["name"])
            check_ina(c, a, x, plain, b, "")

        stats = re.findall(r"ina-mpi: rank (\d+): INA (on|off); served (\d+) MPI_Allreduce \+ "
                           r"(\d+) MPI_Iallreduce, passed through (\d+), errors (\d+)", out)
        if sorted(int(s[0]) for s in stats) != list(range(NP)):
            fail("expected one INA_MPI_STATS line per rank, got %r" % (stats,))
        for rank, on, blocking, nonblocking, passed, errors in stats:
            got = (on, int(blocking), int(nonblocking), int(passed), int(errors))
            want = ("on", n_blocking, n_nonblocking, n_passed, 0)
            if got != want:
                fail("rank %s: stats %r, expected %r" % (rank, got, want))
        print("INA served %d MPI_Allreduce + %d MPI_Iallreduce per rank, passed %d through"
              % (n_blocking, n_nonblocking, n_passed))
        if "INA is off" not in out_off or "INA on" in out_off:
            fail("without an aggregator the preload did not say INA is off")
        print("PASS")
    finally:
        if agg is not None:
            agg.kill()
            agg.wait()
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
