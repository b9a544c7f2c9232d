"""The testbed report from sweep result directories (`testbed/run.py report DIR...`): the machine, what ran and what was skipped, headline figures (N = 4: busbw at the largest
size, latency at the smallest), PNG plots (busbw vs size, latency vs N, throughput vs loss), the
simulator calibrated on those results (alpha, beta, the aggregator's per-packet cost), its
validation error at the measured N, crossover tables and predictions at 1024 and 4096 workers.

usage: testbed/run.py report RESULTS_DIR... [--report PATH | --write]
  RESULTS_DIR  directories written by a sweep scenario (linkbound, compare, ...); several are
               merged (e.g. a --quick run and an N = 8 run)
The report goes to the first directory's REPORT.md (or --report PATH); only --write replaces the
tracked testbed/results/REPORT.md.
"""
import argparse
import csv
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
TESTBED = os.path.dirname(HERE)
ROOT = os.path.dirname(TESTBED)
TRACKED_REPORT = os.path.join(TESTBED, "results", "REPORT.md")
sys.path.insert(0, os.path.join(TESTBED, "sim"))
import inasim  # noqa: E402

import linkbound  # noqa: E402

VALIDATED = ("ina", "host-ring", "host-tree", "host-hd")  # the simulator's target: <= 25% / 50%


def load(results_dir):
    """The loopback rows (CPU-cost measurements) and runs of a harness directory; link-bound
    rows (link_rate set) are left to link_section."""
    with open(os.path.join(results_dir, "results.csv"), newline="") as f:
        rows = [r for r in csv.DictReader(f) if not r.get("link_rate")]
    for r in rows:
        r["ranks"], r["bytes"] = int(r["ranks"]), int(r["bytes"])
        r["loss_pct"] = float(r["loss_pct"])
        for k in ("time_us", "algbw", "busbw"):
            r[k] = float(r[k])
    runs = []
    p = os.path.join(results_dir, "runs.csv")
    if os.path.exists(p):
        with open(p, newline="") as f:
            runs = [r for r in csv.DictReader(f) if not r.get("link_rate")]
    return rows, runs


def raw_link_rows(rdirs):
    """Link-bound rows of the directories, a later directory's row replacing an earlier one's
    for the same (variant, N, rate, dtype, size)."""
    merged = {}
    for d in rdirs:
        with open(os.path.join(d, "results.csv"), newline="") as f:
            for r in csv.DictReader(f):
                if r.get("link_rate"):
                    merged[(r["variant"], r["ranks"], r["link_rate"], r["dtype"], r["bytes"])] = r
    return list(merged.values())


def link_plots(lr, outdir):
    """algbw vs size, one PNG per dtype: a panel per (rate, N), each variant with its bound
    (dashed)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    made = {}
    for dt in sorted({r["dtype"] for r in lr}, key=lambda d: (d != "float32", d)):
        rates = sorted({r["link_rate"] for r in lr if r["dtype"] == dt})
        ns = sorted({r["ranks"] for r in lr if r["dtype"] == dt})
        fig, axes = plt.subplots(len(rates), len(ns), figsize=(5.2 * len(ns), 3.6 * len(rates)),
                                 squeeze=False)
        for i, rate in enumerate(rates):
            for j, n in enumerate(ns):
                ax = axes[i][j]
                sub = [r for r in lr if (r["link_rate"], r["ranks"], r["dtype"]) == (rate, n, dt)]
                for v in linkbound._variants(sub):
                    pts = sorted((r["bytes"], r["algbw"] * 1e3) for r in sub if r["variant"] == v)
                    line, = ax.plot([p[0] for p in pts], [p[1] for p in pts], marker=".", label=v)
                    b = next((r["bound"] * 1e9 for r in sub if r["variant"] == v and r["bound"]),
                             None)
                    if b and v in ("ina", "host-ring", "host-tree"):
                        ax.axhline(b / 1e6, color=line.get_color(), linestyle="--", linewidth=0.8)
                ax.set_xscale("log", base=2)
                ax.set_xlabel("bytes per rank")
                ax.set_ylabel("algbw (MB/s)")
                top = max([r["bound"] * 1e3 * 1.3 for r in sub if r["bound"]] + [1])
                ax.set_ylim(0, top)
                ax.set_title(f"{linkbound.rate_name(rate)} links, N = {n}", fontsize=9)
                ax.grid(True, alpha=0.3)
                ax.legend(fontsize=6)
        fig.suptitle(f"algbw against size, {dt} (dashed: bounds)", fontsize=10)
        fig.tight_layout()
        f = f"link-algbw-{dt}.png"
        fig.savefig(os.path.join(outdir, f), dpi=80)
        plt.close(fig)
        made[f"{dt}: every link rate and N"] = f
    return made


def link_section(rdirs, outdir, rel):
    """The link-bound comparison: markdown lines, or [] when no directory has link rows."""
    raw = raw_link_rows(rdirs)
    if not raw:
        return []
    lr = linkbound.link_rows(raw)
    rates = sorted({r["link_rate"] for r in lr})
    user, frame = linkbound.ina_framing("float32")
    md = ["## Link-bound comparison (every peer across namespaces on shaped links)", "",
          "Every rank in a network namespace of its own on a star (one bridge); tbf of the "
          f"link rate ({', '.join(linkbound.rate_name(r) for r in rates)}; burst "
          f"{linkbound.TBF_BURST}, limit {linkbound.TBF_LIMIT}) on both ends of every worker "
          "link; the aggregators' links unshaped (the aggregator plays the switch). Variants: "
          "`ina` ina-bench ranks (kernel UDP) to ina-aggregator (kernel UDP); `ina-xdp` the ranks "
          "over AF_XDP (copy mode on each worker's veth) to the same aggregator (AF_XDP's "
          "transmit path bypasses the qdisc, so their uplinks are unshaped: the shaped downlinks "
          "hold them to INA's bound); `ina-dpdk` kernel-UDP ranks to ina-aggregator's DPDK "
          "backend (net_af_packet on its namespace's veth, --no-huge, one busy-polling lcore); `host-ring`, `host-hd`, `host-tree` libina's "
          "host algorithms over its TCP mesh; `gloo` Gloo's ring (ina-gloo-bench external "
          "ranks); `mpi` Open MPI's MPI_Allreduce as its tuned component chooses (mpirun in the "
          "aggregator's namespace, each rank exec'd into its worker's); `mpi-ring` Open MPI with "
          "the ring forced (coll_tuned_allreduce_algorithm 4). Which algorithm Open MPI 4.1's "
          "default picks: at 16 MiB and N = 4 and 8 on 500 Mbit/s links its time matched the "
          "forced Rabenseifner (algorithm 6: recursive-halving reduce-scatter + "
          "recursive-doubling allgather) within 5%, not recursive doubling (3) or the ring (4) "
          "(docs/testbed.md). Sizes below ~1 MiB ride tbf's burst (128 KiB at the veth's "
          "speed) and can exceed their bound: the % of bound means something from 1 MiB.", "",
          f"Bounds (algbw, `testbed/lab/linkbound.py`): INA = R/8 x {user}/{frame} (float32; "
          "each worker sends and receives its data once; payload/frame from `ina_framing()`); "
          f"ring = R/8 x N/(2(N-1)) x {linkbound.TCP_PAYLOAD}/{linkbound.TCP_FRAME} (TCP); "
          "halving-doubling as the ring at powers of two; double binary tree = R/8 x "
          "1448/1514 / T(N), T the most a rank sends in libina's two trees (1 at N = 2, 2 "
          "from 4); bfloat16 halves INA's bound on today's wire (4 bytes per element) and the "
          "host path's (float32 words). Open MPI's bound is the ring's.", ""]
    checks = []
    for d in rdirs:
        p = os.path.join(d, "ratecheck.csv")
        if os.path.exists(p):
            with open(p, newline="") as f:
                checks += list(csv.DictReader(f))
    if checks:
        md += ["Rate check before each topology (TCP goodput over every worker link, both ways, "
               "against R x 1448/1514; a link outside 85-108% refuses the sweep):", "",
               "| link | N | streams | goodput / expected (min .. max) | status |",
               "|---|---|---|---|---|"]
        seen = []
        for c in checks:
            k = (c["link_rate"], c["ranks"])
            if k in seen:
                continue
            seen.append(k)
            sub = [x for x in checks if (x["link_rate"], x["ranks"]) == k]
            ratios = [float(x["ratio"]) for x in sub]
            md.append(f"| {linkbound.rate_name(int(float(k[0])))} | {k[1]} | {len(sub)} | "
                      f"{min(ratios) * 100:.1f}% .. {max(ratios) * 100:.1f}% | "
                      f"{'ok' if all(x['status'] == 'ok' for x in sub) else 'FAILED'} |")
        md.append("")
    md += ["### At the largest size: % of each bound, INA/ring beside the bounds' ratio", "",
           linkbound.headline_table(raw), "",
           "### Latency (the smallest size)", "", linkbound.latency_table(raw), ""]
    made = link_plots(lr, outdir)
    md += ["### Plots", ""] + [f"![{t}]({rel}/{f})" for t, f in made.items()] + [""]
    md += ["### Per size (algbw MB/s and % of bound; the smallest size: time)", "",
           linkbound.size_tables(raw), ""]
    md += link_sim_section(rdirs)
    return md


def link_sim_section(rdirs):
    rows = []
    for d in rdirs:
        rows += inasim.read_link_csv(os.path.join(d, "results.csv"))
    md = ["## Simulator on the link-bound rows (testbed/sim/inasim.py)", ""]
    try:
        fit = inasim.calibrate_link(rows)
    except (ValueError, ImportError) as e:
        return md + [f"Not calibrated: {e}", ""]
    md += [f"Fitted per link rate (non-negative least squares, weights 1/time; each rate is a "
           f"network of its own) on `{fit['host_variant']}` (a: per-step latency, k: link "
           "factor, 1 = exactly the link rate)" +
           (f" and `{fit['inc_variant']}` (x0 = 2(ai + c), ki, c: the aggregator's cost per "
            "packet, serial over N p)" if fit["inc_variant"] else "") +
           f", on the link-bound sizes (>= {inasim.human(inasim.LINK_MIN_BYTES)}) and the "
           "smallest size (the latency; its error is shown apart):", "",
           "| link | a | k | x0 | ki | c |", "|---|---|---|---|---|---|"]
    for rate, f in sorted(fit["by_rate"].items()):
        a, k = f["host"]
        inc = f["inc"]
        md.append(f"| {linkbound.rate_name(int(rate))} | {a * 1e6:.1f} us | {k:.3f} | " +
                  (f"{inc[0] * 1e6:.1f} us | {inc[1]:.3f} | {inc[2] * 1e9:.0f} ns |" if inc
                   else "- | - | - |"))
    md += ["", "| variant | model | link-bound rows | mean rel. error | max rel. error | target | "
           "smallest-size rows | mean rel. error |", "|---|---|---|---|---|---|---|---|"]
    val = inasim.validate_link(rows, fit)
    for v in sorted(val, key=lambda x: (x not in VALIDATED, x)):
        e = val[v]
        target = ""
        if v in VALIDATED:
            met = e["mean_rel_err"] <= 0.25 and e["max_rel_err"] <= 0.5
            target = "met" if met else "**not met**"
        small = (f"{e['small_mean_rel_err'] * 100:.0f}%" if e["small_mean_rel_err"] is not None
                 else "-")
        md.append(f"| {v} | {e['model']} | {e['rows']} | {e['mean_rel_err'] * 100:.0f}% | "
                  f"{e['max_rel_err'] * 100:.0f}% | {target} | {e['small_rows']} | {small} |")
    md += ["", "Target: <= 25% mean and <= 50% max for ina, host-ring, host-tree and host-hd at "
           "the measured N. `ina-xdp`, `ina-dpdk`, `gloo` and `mpi-ring` are predicted with the INA and "
           "ring models fitted on `ina` and `host-ring` (not their own rows).", ""]
    if fit["inc"]:
        rate = max(r["rate"] for r in rows)
        rn = linkbound.rate_name(int(rate))
        md += [f"Predictions to 16384 workers on {rn} links, from the parameters fitted above at "
               f"{rn} (a, k, x0, ki and the software aggregator's c). What each column assumes:",
               "",
               f"* ring: 2(N-1) steps of latency a each; every rank sends 2(N-1)/N of its data "
               f"at k x {rn} with TCP framing; no aggregator.",
               "* double binary tree: 2 log2(N) steps of latency a; the busiest rank moves T(N) "
               "times its data (libina's two trees); no aggregator.",
               "* hier: a tree of software aggregators of fan-in 32, levels pipelined, each level "
               "adding x0; one aggregator's capacity is its fitted per-packet cost c, paid serially "
               "for the 32 children's packets (k p c); no congestion above the first level.",
               "* hier (hw): the same tree with an aggregator that costs c = 10 ns per packet (a "
               "switch pipeline, 100 Mpps) in place of the fitted c: assumed, not measured.", "",
               "| N | size | ring | double binary tree | hier | hier (hw) | ring / hier (hw) |",
               "|---|---|---|---|---|---|---|"]
        for n in (8, 64, 512, 4096, 16384):
            for d in (8, 1 << 30):
                t = {alg: inasim.predict_link_scale(fit, alg, n, d, rate)
                     for alg in ("ring", "tree", "hier")}
                hw = inasim.predict_link_scale(fit, "hier", n, d, rate, c_pkt=10e-9)
                fmt = lambda x: f"{x * 1e3:.3f} ms" if x < 10 else f"{x:.1f} s"  # noqa: E731
                md.append(f"| {n} | {inasim.human(d)} | {fmt(t['ring'])} | {fmt(t['tree'])} | "
                          f"{fmt(t['hier'])} | {fmt(hw)} | {t['ring'] / hw:.2f}x |")
        md.append("")
    return md


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
    ap.add_argument("results_dir", nargs="+",
                    help="sweep output directories; several are merged, a later one's row "
                         "replacing an earlier one's for the same run")
    ap.add_argument("--report", help="where to write (default: RESULTS_DIR/REPORT.md of the first)")
    ap.add_argument("--write", action="store_true",
                    help="replace the tracked testbed/results/REPORT.md")
    a = ap.parse_args(argv)
    if a.write and a.report:
        ap.error("--write and --report: give one")
    rdirs = [os.path.abspath(d) for d in a.results_dir]
    a.report = TRACKED_REPORT if a.write else (a.report or os.path.join(rdirs[0], "REPORT.md"))
    link_dirs = [d for d in rdirs if raw_link_rows([d])]
    loop_dirs = [d for d in rdirs if d not in link_dirs]
    merged, runs = {}, []
    for d in loop_dirs:
        r_, u_ = load(d)
        for r in r_:
            merged[(r["variant"], r["coll"], r["ranks"], r["loss_pct"], r["bytes"])] = r
        runs += u_
    rows = list(merged.values())
    if not rows and not link_dirs:
        raise SystemExit(f"report.py: no rows in {', '.join(d + '/results.csv' for d in rdirs)}")
    srcs = ", ".join(f"`{os.path.relpath(d, ROOT)}`" for d in rdirs)
    report_dir = os.path.dirname(os.path.abspath(a.report))
    md = ["# INA testbed report", "",
          f"Generated by `testbed/run.py report {' '.join(os.path.relpath(d, ROOT) for d in rdirs)}"
          f"{' --write' if a.write else ''}` (that command regenerates it) from {srcs} (written "
          "by `testbed/run.py`).", ""]
    machines = []
    for d in rdirs:
        with open(os.path.join(d, "machine.txt")) as f:
            machines.append((d, f.read().rstrip()))
    forced = [d for d, text in machines if "FORCED" in text]
    if forced:
        md += ["**Forced runs**: " + ", ".join(f"`{os.path.basename(d)}`" for d in forced) +
               " started at a load above the core count (`--force`); their figures are not from "
               "an idle machine.", ""]
    md += ["## Machine", "", "```"]
    for i, (d, text) in enumerate(machines):
        md.append(("\n" if i else "") + f"# {os.path.basename(d)}\n" + text)
    md += ["```", ""]
    if link_dirs:
        ldir = link_dirs[-1]
        md += link_section(link_dirs, ldir, os.path.relpath(ldir, report_dir))
        lrel = os.path.relpath(ldir, report_dir)
        tables = (f", every tool's output in [tables.txt]({lrel}/tables.txt)"
                  if os.path.exists(os.path.join(ldir, "tables.txt")) else "")
        md += [f"Raw data: [{lrel}/results.csv]({lrel}/results.csv){tables}, runs in "
               f"[runs.csv]({lrel}/runs.csv).", ""]
    if not rows:
        with open(a.report, "w") as f:
            f.write("\n".join(md))
        print(f"wrote {os.path.relpath(a.report)} (link-bound from {', '.join(link_dirs)})")
        return 0
    rdir = loop_dirs[-1]  # plots and parameters go here
    rel = os.path.relpath(rdir, report_dir)
    made = plots(rows, rdir)
    md += ["## Loopback runs: CPU-cost measurements", "",
           "The runs below put every rank, the aggregator and the peers on one machine's "
           "loopback (or one bridge without shaping): every byte crosses the same CPUs several "
           "times, so they compare software costs (per-packet work, quantization, system calls, "
           "scheduling), not networks, and are indicative only.", "", "### Runs", ""]
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
           "ina-aggregator in separate namespaces on one bridge (testbed/lab/topo.py); `host-ring`, "
           "`host-tree`, `host-hd` libina's host algorithms over its TCP mesh; `mpi` Open MPI's "
           "MPI_Allreduce over TCP; `gloo` Gloo's ring over TCP. Loss: nft `numgen random` drop "
           "of that percent of the packets each namespace receives (TCP peers retransmit, INA "
           "retransmits per block).", ""]
    hn = 4 if pick(rows, ranks=4) else max(r["ranks"] for r in rows)
    h = headline(rows, hn)
    if h:
        md += [f"### Headline (N = {hn}, no loss)", "", h, ""]
    md += ["### Plots", ""]
    for title, f in made.items():
        md.append(f"![{title}]({rel}/{f})")
    md += ["", "### Tables", "", f"nccl-tests style tables per variant, N and loss: "
           f"[{rel}/summary.md]({rel}/summary.md); raw tool output: [{rel}/tables.txt]"
           f"({rel}/tables.txt); all rows: [{rel}/results.csv]({rel}/results.csv).", ""]
    # simulator
    md += ["### Simulator on the loopback rows (testbed/sim/inasim.py)", ""]
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
               f"`{info['inc_variant']}`. Parameters: `{os.path.relpath(rdir, ROOT)}"
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
        md += ["", "Predicted time of one AllReduce, from the loopback fit. What each column "
               "assumes:", "",
               "* ring, tree, hd: the host alpha and beta fitted above (loopback, so CPU-bound, "
               "not a network's), no contention between ranks.",
               "* inc (1 level): one software aggregator for all N ranks, its capacity the fitted "
               "per-packet cost c paid serially for all N p packets (N p c).",
               f"* hier: a tree of such aggregators of fan-in {p.fan_in}, levels pipelined, each "
               f"serving {p.fan_in} children (k p c) and adding 2(ai + c) of latency; no "
               "congestion above the first level.", "",
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
