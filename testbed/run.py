#!/usr/bin/python3
"""The INA testbed driver: runs a scenario (a table of testbed/scenarios.toml) and writes its record.

  testbed/run.py SCENARIO [--quick] [--build-dir build] [--out DIR] [-- runner options]
  testbed/run.py SCENARIO --builds A,B --alternate [--rounds 2]   # A/B of two build dirs
  testbed/run.py report DIR... [--write]     # the report (REPORT.md) from sweep directories
  testbed/run.py index                       # regenerate testbed/results/README.md
  testbed/run.py topo check|shell|run-ina ...  # the topology by hand (topo.py)

A scenario names its runner (a module of testbed/lab/) and the runner's options; options
after `--` are appended (the last one given wins). The output directory (default
testbed/results/SCENARIO-<UTC stamp>/, which git ignores) gets the runner's files (results.csv,
summary.md, ...), output.txt (everything the runner printed), plots of results.csv and a README
with the command, the machine, the load, the git revision and the summary. With two builds, each
round runs the scenario once per build (order A B, then B A, ...) into runs/ROUND-BUILD/, and the
README gets the median time per point of each build and their ratio.
See docs/testbed.md.
"""
import argparse
import os
import shlex
import signal
import subprocess
import sys
import threading
import time
import tomllib

TESTBED = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(TESTBED)
LAB = os.path.join(TESTBED, "lab")
SCENARIOS = os.path.join(TESTBED, "scenarios.toml")
sys.path.insert(0, LAB)
import record  # noqa: E402

TOOLS = {
    "report": "the report (plots, simulator validation) from sweep result directories; --write "
              "replaces the tracked testbed/results/REPORT.md",
    "index": "regenerate testbed/results/README.md from the directories kept there",
    "topo": "namespaces by hand: `topo check`, `topo shell -N 2`, `topo run-ina -N 4 -- ARGS`",
}


def load_scenarios():
    """{name: scenario} from testbed/scenarios.toml, each with its parts (one, or [[NAME.parts]])
    and their defaults filled in."""
    with open(SCENARIOS, "rb") as f:
        try:
            table = tomllib.load(f)
        except tomllib.TOMLDecodeError as e:
            raise SystemExit(f"run.py: {SCENARIOS}: {e}")
    out = {}
    for name, s in table.items():
        if "summary" not in s:
            raise SystemExit(f"run.py: {SCENARIOS}: [{name}] has no 'summary'")
        parts = s.get("parts") or [s]
        for p in parts:
            if "runner" not in p:
                raise SystemExit(f"run.py: {SCENARIOS}: [{name}] has no 'runner'")
            p.setdefault("name", name)
            p.setdefault("args", [])
            p.setdefault("quick", [])
            p.setdefault("needs", s.get("needs", []))
            p.setdefault("build_arg", "--build-dir")
            p.setdefault("out_arg", "--out")
            p.setdefault("pythonpath", [])
        s["parts"] = parts
        out[name] = s
    return out


def missing(needs, build):
    """The first unmet need of a scenario, as a reason; None when all are met."""
    for need in needs:
        if need == "root" and os.geteuid() != 0:
            return "needs root (network namespaces, qdiscs, nft)"
        if need == "torch":
            r = subprocess.run([sys.executable, "-c", "import torch"], capture_output=True)
            if r.returncode != 0:
                return "needs PyTorch (python3-torch)"
            if not os.path.isdir(os.path.join(build, "integrations", "torch")):
                return f"needs the torch backend built in {build} (-Dtorch=enabled)"
        if need.startswith("bin:"):
            p = os.path.join(build, need[4:])
            if not os.access(p, os.X_OK):
                return f"{p} is not built (meson compile -C {build})"
    return None


def runner_argv(scn, build, out, quick, extra):
    argv = list(scn["args"]) + (list(scn["quick"]) if quick else []) + list(extra)
    argv = [a.replace("{build}", build).replace("{out}", out) for a in argv]
    if scn["build_arg"]:
        argv = [scn["build_arg"], build] + argv
    if scn["out_arg"]:
        argv = [scn["out_arg"], out] + argv
    return argv


def run_once(name, scn, build, out, quick, extra, command, timeout, only_parts=()):
    """Runs the scenario into out: its one runner, or each part into out/PART/ (their rows
    merged into out/results.csv with a column `part`, their summaries into out/summary.md).
    Returns the worst exit status (77 only when every part skipped)."""
    parts = scn["parts"]
    if len(parts) > 1 and only_parts:
        parts = [p for p in parts if p["name"] in only_parts]
    if len(parts) == 1 and "runner" in scn:
        why = missing(parts[0]["needs"], build)
        if why:
            print(f"SKIP: {name}: {why}", flush=True)
            os.makedirs(out, exist_ok=True)
            with open(os.path.join(out, "output.txt"), "w") as f:
                f.write(f"SKIP: {why}\n")
            return 77
        return run_runner(name, parts[0], build, out, quick, extra, command, timeout)
    rows, md, codes = [], [], []
    for p in parts:
        sub = os.path.join(out, p["name"])
        why = missing(p["needs"], build)
        if why:
            print(f"SKIP: {name}/{p['name']}: {why}", flush=True)
            md += [f"## {p['name']}", "", f"Skipped: {why}", ""]
            codes.append(77)
            continue
        codes.append(run_runner(f"{name}/{p['name']}", p, build, sub, quick, extra, command,
                                timeout))
        rows += [{"part": p["name"], **r}
                 for r in record.read_csv(os.path.join(sub, "results.csv"))]
        text = ""
        if os.path.exists(os.path.join(sub, "summary.md")):
            with open(os.path.join(sub, "summary.md")) as f:
                text = f.read().strip()
        md += [f"## {p['name']}", "", f"exit {codes[-1]}; files in [{p['name']}/]({p['name']}/)",
               "", text, ""]
    if rows:
        record.write_csv(os.path.join(out, "results.csv"), rows)
    with open(os.path.join(out, "summary.md"), "w") as f:
        f.write("\n".join(md))
    if all(c == 77 for c in codes):
        return 77
    return max((c for c in codes if c != 77), default=0)


def run_runner(name, scn, build, out, quick, extra, command, timeout):
    """Runs one runner in a child (its own process group: a timeout or ^C ends it and
    everything it started, after it had the chance to tear its namespaces down). Returns the exit
    status; the runner's output goes to the terminal and OUT/output.txt."""
    os.makedirs(out, exist_ok=True)
    argv = runner_argv(scn, build, out, quick, extra)
    env = dict(os.environ, INA_TESTBED_COMMAND=command, PYTHONUNBUFFERED="1")
    paths = [os.path.join(build, p) for p in scn["pythonpath"]]
    if paths:
        env["PYTHONPATH"] = os.pathsep.join(paths + [env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    module, _, func = scn["runner"].partition(":")  # MODULE or MODULE:FUNCTION (main)
    code = (f"import sys; sys.path[:0] = {[LAB] + paths!r}; import {module} as m; "
            f"r = m.{func or 'main'}(sys.argv[1:]); sys.exit(r if isinstance(r, int) else 0)")
    print(f"# {name}: {scn['runner']} {' '.join(shlex.quote(a) for a in argv)}", flush=True)
    with open(os.path.join(out, "output.txt"), "w") as log:
        p = subprocess.Popen([sys.executable, "-c", code, *argv], env=env, cwd=ROOT,
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                             start_new_session=True)
        timed_out = threading.Event()
        timer = threading.Timer(timeout, lambda: (timed_out.set(), _stop(p)))
        timer.start()

        def forward(signum, _frame):  # the runner tears its namespaces down, then we exit
            _stop(p)
            log.write(f"# stopped by signal {signum}\n")
            raise SystemExit(128 + signum)
        old = {s: signal.signal(s, forward) for s in (signal.SIGTERM, signal.SIGINT)}
        try:
            for line in p.stdout:
                sys.stdout.write(line)
                log.write(line)
            rc = p.wait()
        finally:
            timer.cancel()
            for s, h in old.items():
                signal.signal(s, h)
        if timed_out.is_set():
            log.write(f"# stopped: the run outlasted --timeout {timeout:g} s\n")
            return 124
        return rc


def _stop(p):
    """SIGTERM to the runner (its teardown runs), SIGKILL to its group 15 s later."""
    try:
        p.send_signal(signal.SIGTERM)
        p.wait(timeout=15)
    except subprocess.TimeoutExpired:
        pass
    try:
        os.killpg(p.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    p.wait()


def do_scenario(name, scn, a, extra):
    builds = [os.path.abspath(b) for b in (a.builds.split(",") if a.builds else [a.build_dir])]
    if len(builds) > 2:
        raise SystemExit("run.py: --builds takes one or two build directories")
    if a.alternate and len(builds) != 2:
        raise SystemExit("run.py: --alternate needs --builds A,B")
    stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime())
    out = os.path.abspath(a.out or os.path.join(TESTBED, "results", f"{name}-{stamp}"))
    os.makedirs(out, exist_ok=True)
    command = "testbed/run.py " + " ".join(shlex.quote(x) for x in sys.argv[1:])
    info = record.machine()
    t0 = time.monotonic()
    ab_md, note = "", ""
    if len(builds) == 1:
        rc = run_once(name, scn, builds[0], out, a.quick, extra, command, a.timeout, a.parts)
        rows = record.read_csv(os.path.join(out, "results.csv"))
    else:
        labels = record.build_labels(builds)
        rounds = a.rounds if a.alternate else 1
        parts = [p for p in scn["parts"] if len(scn["parts"]) == 1 or not a.parts
                 or p["name"] in a.parts]
        if a.alternate and all(p["runner"] == "sweep" for p in parts):
            # The sweep alternates the builds point by point (variant, N, size sweep, loss,
            # link), inside the same topology: the closest two runs can be.
            rc = run_once(name, scn, builds[0], out, a.quick,
                          extra + ["--builds", ",".join(builds), "--ab-rounds", str(rounds)],
                          command, a.timeout, a.parts)
            rows = record.read_csv(os.path.join(out, "results.csv"))
            note = (f"Builds: A = `{labels[0]}`, B = `{labels[1]}`, alternated point by point "
                    f"by the sweep ({rounds} run(s) of each point per build, the order flipping "
                    "from point to point); columns `build` and `round` in results.csv.")
        else:
            runs, rc = [], 0
            for r in range(rounds):
                order = [0, 1] if r % 2 == 0 else [1, 0]
                for i in order:
                    sub = os.path.join(out, "runs", f"{r + 1}-{'AB'[i]}")
                    print(f"# round {r + 1}/{rounds}: build {'AB'[i]} ({labels[i]})", flush=True)
                    rc_i = run_once(name, scn, builds[i], sub, a.quick, extra, command,
                                    a.timeout, a.parts)
                    rc = rc or rc_i
                    runs.append((r + 1, labels[i],
                                 record.read_csv(os.path.join(sub, "results.csv"))))
            rows = record.merge_builds(runs)
            if rows:
                record.write_csv(os.path.join(out, "results.csv"), rows)
            note = (f"Builds: A = `{labels[0]}`, B = `{labels[1]}`; {rounds} round(s) of the "
                    "whole scenario, alternated (A B, then B A, ...); each run's files are "
                    "under runs/ROUND-BUILD/.")
        ab_md = record.ab_table(rows, labels) if a.alternate or len(builds) == 2 else ""
    made = record.plots(out, rows, name)
    files = sorted(os.path.relpath(os.path.join(d, f), out) for d, _, fs in os.walk(out)
                   for f in fs if not f.startswith("."))
    record.write_readme(out, name, scn["summary"], command, info, record.load(), rc,
                        files + ["README.md"], ab_md, note)
    print(f"# {name}: exit {rc}, {time.monotonic() - t0:.0f} s, {len(made)} plots; "
          f"{os.path.relpath(out, os.getcwd())}/README.md", flush=True)
    return rc


def scenario_help(scns):
    width = max(len(n) for n in list(scns) + list(TOOLS)) + 2
    lines = ["scenarios (testbed/scenarios.toml):"]
    lines += [f"  {n:{width}s}{s['summary']}" for n, s in scns.items()]
    lines += ["", "tools:"] + [f"  {n:{width}s}{t}" for n, t in TOOLS.items()]
    return "\n".join(lines)


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    scns = load_scenarios()
    if argv and argv[0] in TOOLS:
        tool, rest = argv[0], argv[1:]
        if tool == "index":
            path, n = record.index()
            print(f"wrote {os.path.relpath(path)} ({n} directories)")
            return 0
        if tool == "report":
            import report
            return report.main(rest)
        import topo
        return topo.main(rest)
    extra = []
    if "--" in argv:
        i = argv.index("--")
        argv, extra = argv[:i], argv[i + 1:]
    ap = argparse.ArgumentParser(
        prog="testbed/run.py", description=__doc__.split("\n")[0],
        epilog=scenario_help(scns) + "\n\nSee docs/testbed.md.",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("scenario", choices=sorted(scns), metavar="SCENARIO",
                    help="one of the scenarios below")
    ap.add_argument("--quick", action="store_true", help="the scenario's short form")
    ap.add_argument("--build-dir", default=os.path.join(ROOT, "build"),
                    help="the build directory (default: build)")
    ap.add_argument("--builds", help="A,B: two build directories (with --alternate: rounds)")
    ap.add_argument("--alternate", action="store_true",
                    help="with --builds A,B: alternate the builds round by round")
    ap.add_argument("--rounds", type=int, default=2, help="--alternate: rounds (default 2)")
    ap.add_argument("--out", help="output directory (default testbed/results/SCENARIO-<stamp>)")
    ap.add_argument("--parts", type=lambda t: [x for x in t.split(",") if x], default=[],
                    help="a scenario of several parts: run only these (comma-separated)")
    ap.add_argument("--timeout", type=float, default=3600,
                    help="seconds per run of the scenario (default 3600)")
    a = ap.parse_args(argv)
    if a.rounds < 1:
        ap.error("--rounds must be >= 1")
    names = [p["name"] for p in scns[a.scenario]["parts"]]
    if a.parts and (len(names) < 2 or set(a.parts) - set(names)):
        ap.error(f"--parts: {a.scenario} has " + (f"the parts {', '.join(names)}"
                                                  if len(names) > 1 else "no parts"))
    return do_scenario(a.scenario, scns[a.scenario], a, extra)


if __name__ == "__main__":
    sys.exit(main())
