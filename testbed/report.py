#!/usr/bin/python3
"""Regenerates testbed/results/REPORT.md from the latest harness results (or the directory
given): the machine, what ran and what was skipped, headline figures (N = 4: busbw at the largest
size, latency at the smallest), PNG plots (busbw vs size, latency vs N, throughput vs loss), the
simulator calibrated on those results (alpha, beta, the aggregator's per-packet cost), its
validation error at the measured N, crossover tables and predictions at 1024 and 4096 workers.

usage: testbed/report.py [RESULTS_DIR...] [--report PATH]
  RESULTS_DIR  testbed/results/compare-* directories (default: the newest one); several are
               merged (e.g. a --quick run and an N = 8 run)
"""
import argparse
import csv
import glob
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "sim"))
import inasim  # noqa: E402


def latest_results():
    dirs = sorted(d for d in glob.glob(os.path.join(HERE, "results", "compare-*"))
                  if os.path.exists(os.path.join(d, "results.csv")))
    if not dirs:
        raise SystemExit("report.py: no testbed/results/compare-*/results.csv; run "
                         "testbed/harness.py first")
    return dirs[-1]


def load(results_dir):
    with open(os.path.join(results_dir, "results.csv"), newline="") as f:
        rows = list(csv.DictReader(f))
    for r in rows:
        r["ranks"], r["bytes"] = int(r["ranks"]), int(r["bytes"])
        r["loss_pct"] = float(r["loss_pct"])
        for k in ("time_us", "algbw", "busbw"):
            r[k] = float(r[k])
    runs = []
    p = os.path.join(results_dir, "runs.csv")
    if os.path.exists(p):
        with open(p, newline="") as f:
            runs = list(csv.DictReader(f))
    return rows, runs


def variants_of(rows):
    out = []
    for r in rows:
        if r["variant"] not in out:
            out.append(r["variant"])
    return out


def pick(rows, **kw):
    return [r for r in rows if all(r[k] == v for k, v in kw.items())]


def plots(rows, outdir):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    made = {}
    ar = pick(rows, coll="allreduce")
    variants = variants_of(ar)
    ns = sorted({r["ranks"] for r in ar})
    clean = pick(ar, loss_pct=0.0)
    # busbw vs size, one plot per N
    for n in ns:
        fig, ax = plt.subplots(figsize=(6.5, 4))
        for v in variants:
            pts = sorted((r["bytes"], r["busbw"]) for r in pick(clean, variant=v, ranks=n))
            if pts:
                ax.plot([p[0] for p in pts], [p[1] for p in pts], marker=".", label=v)
        ax.set_xscale("log", base=2)
        ax.set_xlabel("bytes per rank")
        ax.set_ylabel("busbw (GB/s)")
        ax.set_title(f"AllReduce busbw vs size, N = {n}, no loss")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8)
        fig.tight_layout()
        f = f"busbw-vs-size-N{n}.png"
        fig.savefig(os.path.join(outdir, f), dpi=100)
        plt.close(fig)
        made[f"busbw vs size, N = {n}"] = f
    # latency (smallest size) vs N
    if clean:
        smin = min(r["bytes"] for r in clean)
        fig, ax = plt.subplots(figsize=(6.5, 4))
        for v in variants:
            pts = sorted((r["ranks"], r["time_us"]) for r in pick(clean, variant=v, bytes=smin))
            if pts:
                ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=v)
        ax.set_xlabel("ranks N")
        ax.set_ylabel(f"time of a {smin} B AllReduce (us)")
        ax.set_yscale("log")
        ax.set_xticks(ns)
        ax.set_title("latency vs N, no loss")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8)
        fig.tight_layout()
        f = "latency-vs-N.png"
        fig.savefig(os.path.join(outdir, f), dpi=100)
        plt.close(fig)
        made["latency vs N"] = f
    # throughput (algbw at the largest size measured at every loss) vs loss, largest N
    losses = sorted({r["loss_pct"] for r in ar})
    lossy_ns = sorted({r["ranks"] for r in ar if r["loss_pct"] > 0})
    if len(losses) > 1 and lossy_ns:
        n = max(lossy_ns)
        fig, ax = plt.subplots(figsize=(6.5, 4))
        for v in variants:
            sub = pick(ar, variant=v, ranks=n)
            common = None
            for l in losses:
                s = {r["bytes"] for r in sub if r["loss_pct"] == l}
                common = s if common is None else common & s
            if not common:
                continue
            size = max(common)
            pts = [(l, next(r["algbw"] for r in sub if r["loss_pct"] == l and r["bytes"] == size))
                   for l in losses]
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o",
                    label=f"{v} ({inasim.human(size)})")
        ax.set_xscale("symlog", linthresh=0.1)
        ax.set_xlabel("injected loss (%)")
        ax.set_ylabel("algbw (GB/s)")
        ax.set_title(f"throughput vs loss, N = {n}, largest size")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8)
        fig.tight_layout()
        f = "throughput-vs-loss.png"
        fig.savefig(os.path.join(outdir, f), dpi=100)
        plt.close(fig)
        made["throughput vs loss"] = f
    return made


def headline(rows, n=4):
    """Per variant at N = n, no loss: busbw at the largest size, time at the smallest."""
    clean = pick(rows, coll="allreduce", loss_pct=0.0, ranks=n)
    if not clean:
        return None
    lines = ["| variant | busbw at largest size (GB/s) | time at smallest size (us) |",
             "|---|---|---|"]
    for v in variants_of(clean):
        sub = pick(clean, variant=v)
        big = max(sub, key=lambda r: r["bytes"])
        small = min(sub, key=lambda r: r["bytes"])
        lines.append(f"| {v} | {big['busbw']:.3f} ({inasim.human(big['bytes'])}) | "
                     f"{small['time_us']:.1f} ({small['bytes']} B) |")
    return "\n".join(lines)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("results_dir", nargs="*",
                    help="harness output directories (default: the newest); several are "
                         "merged, a later one's row replacing an earlier one's for the same run")
    ap.add_argument("--report", default=os.path.join(HERE, "results", "REPORT.md"))
    a = ap.parse_args(argv)
    rdirs = [os.path.abspath(d) for d in (a.results_dir or [latest_results()])]
    rdir = rdirs[-1]  # plots and parameters go here
    merged, runs = {}, []
    for d in rdirs:
        r_, u_ = load(d)
        for r in r_:
            merged[(r["variant"], r["coll"], r["ranks"], r["loss_pct"], r["bytes"])] = r
        runs += u_
    rows = list(merged.values())
    if not rows:
        raise SystemExit(f"report.py: no rows in {', '.join(d + '/results.csv' for d in rdirs)}")
    srcs = ", ".join(f"`{os.path.relpath(d, os.path.dirname(HERE))}`" for d in rdirs)
    rel = os.path.relpath(rdir, os.path.dirname(os.path.abspath(a.report)))
    made = plots(rows, rdir)
    md = ["# INA testbed report", "",
          f"Generated by `testbed/report.py {' '.join(os.path.relpath(d, os.path.dirname(HERE)) for d in rdirs)}` "
          f"(that command regenerates it) from {srcs}"
          " (written by `testbed/harness.py`). Numbers from one shared machine: every rank, the "
          "aggregator and the peers share its cores, so they compare software costs and are "
          "indicative only.", "", "## Machine", "", "```"]
    for i, d in enumerate(rdirs):
        with open(os.path.join(d, "machine.txt")) as f:
            md.append(("\n" if i else "") + f"# {os.path.basename(d)}\n" + f.read().rstrip())
    md += ["```", "", "## Runs", ""]
    ok = [r for r in runs if r["status"] == "ok"]
    bad = [r for r in runs if r["status"] == "failed"]
    skipped = [r for r in runs if r["status"] == "skipped"]
    md.append(f"{len(ok)} runs ok, {len(bad)} failed, {len(skipped)} skipped; "
              f"{sum(float(r['seconds']) for r in runs):.0f} s of runs.")
    md.append("")
    for r in bad:
        md.append(f"* failed: {r['variant']} N={r['ranks']} loss={r['loss_pct']}%: {r['note']}")
    for line in dict.fromkeys(f"* skipped: {r['variant']}: {r['note']}" for r in skipped):
        md.append(line)
    md += ["", "Variants: `ina` in-network AllReduce through ina-bench's embedded kernel-UDP "
           "aggregator on the run's loopback; `ina-veth` the same with the workers and an "
           "ina-aggregator in separate namespaces on one bridge (testbed/topo.py); `host-ring`, "
           "`host-tree`, `host-hd` libina's host algorithms over its TCP mesh; `mpi` Open MPI's "
           "MPI_Allreduce over TCP; `gloo` Gloo's ring over TCP. Loss: nft `numgen random` drop "
           "of that percent of the packets each namespace receives (TCP peers retransmit, INA "
           "retransmits per block).", ""]
    hn = 4 if pick(rows, ranks=4) else max(r["ranks"] for r in rows)
    h = headline(rows, hn)
    if h:
        md += [f"## Headline (N = {hn}, no loss)", "", h, ""]
    md += ["## Plots", ""]
    for title, f in made.items():
        md.append(f"![{title}]({rel}/{f})")
    md += ["", "## Tables", "", f"nccl-tests style tables per variant, N and loss: "
           f"[{rel}/summary.md]({rel}/summary.md); raw tool output: [{rel}/tables.txt]"
           f"({rel}/tables.txt); all rows: [{rel}/results.csv]({rel}/results.csv).", ""]
    # simulator
    md += ["## Simulator (testbed/sim/inasim.py)", ""]
    try:
        sim_merged = {}
        for d in rdirs:
            for r in inasim.read_csv(os.path.join(d, "results.csv")):
                sim_merged[(r["variant"], r["n"], r["loss"], r["d"])] = r
        sim_rows = list(sim_merged.values())
        p, info = inasim.calibrate(sim_rows)
        with open(os.path.join(rdir, "sim-params.json"), "w") as f:
            json.dump({"params": p.to_dict(), **info}, f, indent=2)
        md += [f"Calibrated by least squares (weights 1/time) on the lossless rows: host "
               f"alpha = {p.alpha * 1e6:.1f} us, beta = {p.beta * 1e9:.3f} ns/B "
               f"({1 / p.beta / 1e9 if p.beta > 0 else float('inf'):.2f} GB/s) from "
               f"`{info['host_variant']}`; in-network alpha = {p.alpha_inc * 1e6:.1f} us, "
               f"beta = {p.beta_inc * 1e9:.3f} ns/B, aggregator per-packet cost c = "
               f"{p.c_pkt * 1e9:.0f} ns (payload {p.payload} B) from "
               f"`{info['inc_variant']}`. Parameters: `{os.path.relpath(rdir, os.path.dirname(HERE))}"
               f"/sim-params.json`.", "",
               "Validation (the model predicting the measured lossless rows, N = "
               f"{','.join(str(n) for n in sorted({r['n'] for r in sim_rows}))}):", "",
               "| variant | model | rows | mean rel. error | max rel. error |", "|---|---|---|---|---|"]
        for v, e in info["errors"].items():
            md.append(f"| {v} | {e['model']} | {e['rows']} | {e['mean_rel_err'] * 100:.0f}% | "
                      f"{e['max_rel_err'] * 100:.0f}% |")
        zero = [k for k in ("alpha", "beta", "alpha_inc", "beta_inc", "c_pkt")
                if getattr(p, k) == 0 and (k != "c_pkt" or info["inc_variant"])]
        if zero:
            md += ["", f"**Note**: {', '.join(zero)} fitted to 0 (held at the non-negative "
                   "bound): the measurements do not separate it from the other terms (too few "
                   "rank counts, or a scheduling-bound machine); predictions lean on the rest."]
        if len({r["n"] for r in sim_rows}) < 2:
            md += ["", "**Note**: one rank count only: per-rank terms (ring alpha, the "
                   "aggregator's per-packet cost) are not identifiable; run N = 2, 4, 8."]
        md += ["", "Predicted time of one AllReduce (fan-in k = "
               f"{p.fan_in} for `hier`):", "",
               "| N | size | ring | tree | hd | inc (1 level) | hier | hier speed-up over ring |",
               "|---|---|---|---|---|---|---|---|"]
        for n in (1024, 4096):
            for d in (8, 1 << 20, 64 << 20, 1 << 30):
                t = {alg: inasim.predict(alg, n, d, p) for alg in inasim.ALGORITHMS}
                md.append(f"| {n} | {inasim.human(d)} | " + " | ".join(
                    f"{t[alg] * 1e3:.3f} ms" for alg in inasim.ALGORITHMS) +
                    f" | {t['ring'] / t['hier']:.2f}x |")
        # What-if: the same host network, and an aggregator that is a switch pipeline rather
        # than a thread on a shared 2-core VM. Assumed, not measured: said so in the report.
        hw = inasim.Params.from_dict(p.to_dict())
        hw.alpha_inc, hw.beta_inc, hw.c_pkt = p.alpha, p.beta, 10e-9
        md += ["", "What-if (assumed, not measured): the calibrated host alpha and beta, the "
               "in-network path on the same links (ai = a, bi = b) and an aggregator costing "
               "c = 10 ns per packet (100 Mpps, a hardware pipeline):", "",
               "| N | size | ring | hier | hier speed-up over ring |", "|---|---|---|---|---|"]
        for n in (1024, 4096):
            for d in (8, 1 << 20, 1 << 30):
                tr, th = inasim.predict("ring", n, d, hw), inasim.predict("hier", n, d, hw)
                md.append(f"| {n} | {inasim.human(d)} | {tr * 1e3:.3f} ms | {th * 1e3:.3f} ms | "
                          f"{tr / th:.2f}x |")
        md += ["", "Fastest algorithm by N and size (model, calibrated):", "",
               inasim.best_table(p), ""]
        for f in inasim.plots(p, rdir):
            md.append(f"![{os.path.basename(f)}]({rel}/{os.path.basename(f)})")
    except (ValueError, ImportError) as e:
        md.append(f"Not calibrated: {e}")
    md.append("")
    with open(a.report, "w") as f:
        f.write("\n".join(md))
    print(f"wrote {os.path.relpath(a.report)} ({len(made)} plots from {rdir})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
