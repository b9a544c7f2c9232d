"""The record of a run: the machine and revision, the generated README, plots from results.csv,
two builds' rows merged with their ratio, and the index of testbed/results/."""
import csv
import glob
import os
import platform
import statistics
import subprocess
import time

HERE = os.path.dirname(os.path.abspath(__file__))
TESTBED = os.path.dirname(HERE)
ROOT = os.path.dirname(TESTBED)
RESULTS = os.path.join(TESTBED, "results")

# Columns that are measurements, not the point's identity.
MEASURES = ("time_us", "algbw", "busbw", "wrong", "count", "seconds", "status", "note")


def last_wins(args):
    """Options given more than once (a scenario's, then --quick's, then the caller's) reduced to
    the last one, for tools that refuse repeats (CLI11): ['-n', '20', '-n', '5'] -> ['-n', '5'].
    An option's value is the next word unless that starts with '-' and is not a number."""
    def is_option(w):
        return w.startswith("-") and not w.lstrip("-").replace(".", "", 1).isdigit()
    pairs, i = [], 0
    while i < len(args):
        if is_option(args[i]) and i + 1 < len(args) and not is_option(args[i + 1]):
            pairs.append((args[i], [args[i], args[i + 1]]))
            i += 2
        else:
            pairs.append((args[i] if is_option(args[i]) else None, [args[i]]))
            i += 1
    last = {k: n for n, (k, _) in enumerate(pairs) if k}
    return [w for n, (k, words) in enumerate(pairs) if not k or last[k] == n for w in words]


def cpu_model():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def load():
    try:
        with open("/proc/loadavg") as f:
            return " ".join(f.read().split()[:3])
    except OSError:
        return "unknown"


def git_revision(path=ROOT):
    rev = subprocess.run(["git", "-C", path, "rev-parse", "--short", "HEAD"], capture_output=True,
                         text=True).stdout.strip() or "unknown"
    dirty = subprocess.run(["git", "-C", path, "status", "--porcelain", "--untracked-files=no"],
                           capture_output=True, text=True).stdout.strip()
    return rev + (" (with local changes)" if dirty else "")


def machine():
    """{key: value} of what the figures depend on."""
    return {
        "cpu": cpu_model(),
        "cores": str(os.cpu_count()),
        "kernel": f"{platform.system()} {platform.release()} {platform.machine()}",
        "git": git_revision(),
        "load at start": load(),
        "date": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
    }


def read_csv(path):
    if not os.path.exists(path):
        return []
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def write_csv(path, rows):
    fields = list(dict.fromkeys(k for r in rows for k in r))
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fields)
        w.writeheader()
        w.writerows(rows)


def _num(r, k):
    try:
        return float(r[k])
    except (KeyError, TypeError, ValueError):
        return None


def build_labels(builds):
    """How two build directories are named in rows and tables: the path relative to the
    checkout when inside it; A:/B: in front when the two read alike."""
    labels = [os.path.relpath(b, ROOT) if os.path.abspath(b).startswith(ROOT + os.sep) else b
              for b in builds]
    if len(labels) == 2 and labels[0] == labels[1]:
        labels = [f"A:{labels[0]}", f"B:{labels[1]}"]
    return labels


def merge_builds(runs):
    """runs: [(round, build label, results.csv rows)] -> the rows with columns build, round."""
    return [{"build": label, "round": rnd, **r} for rnd, label, rows in runs for r in rows]


def ab_table(rows, labels):
    """Markdown: per point (every column but the build, the round and the measurements) the
    median time of each build over the rounds, and B/A; "" when there is nothing to compare."""
    if len(labels) != 2 or not rows or "time_us" not in rows[0]:
        return ""
    keys = [k for k in rows[0] if k not in ("build", "round") and k not in MEASURES
            and any(r.get(k) not in ("", None) for r in rows)]
    points = {}
    for r in rows:
        t = _num(r, "time_us")
        if t is None or t <= 0:
            continue
        points.setdefault(tuple(r.get(k, "") for k in keys), {}).setdefault(r["build"], []).append(t)
    a, b = labels
    md = [f"Median time (us) over the rounds per point, the builds alternated (A = `{a}`, "
          f"B = `{b}`); B/A below 1: B is faster.", "",
          "| " + " | ".join(keys) + " | A | B | B/A | rounds |",
          "|" + "---|" * (len(keys) + 4)]
    ratios = []
    for k, by in points.items():
        if a not in by or b not in by:
            continue
        ma, mb = statistics.median(by[a]), statistics.median(by[b])
        ratios.append(mb / ma)
        md.append("| " + " | ".join(str(x) for x in k) + f" | {ma:.1f} | {mb:.1f} | "
                  f"{mb / ma:.3f} | {min(len(by[a]), len(by[b]))} |")
    if not ratios:
        return ""
    md += ["", f"B/A over {len(ratios)} points: median {statistics.median(ratios):.3f}, "
           f"range {min(ratios):.3f} .. {max(ratios):.3f}."]
    return "\n".join(md) + "\n"


def _label(key, value):
    """A group's value for a file name or a title: ranks as N4, link rates as 1gbit, loss as
    loss1pct."""
    try:
        x = float(value)
    except ValueError:
        return str(value)
    if key == "link_rate":
        return f"{x / 1e9:g}gbit" if x >= 1e9 else f"{x / 1e6:g}mbit"
    if key == "ranks":
        return f"N{int(x)}"
    if key == "loss_pct":
        return f"loss{x:g}pct".replace(".", "_")
    return str(value)


def plots(out, rows, name):
    """time (and algbw where present) against size, one PNG per group of ranks / link / coll /
    dtype, one line per variant (and build). Returns the files written; [] without matplotlib
    or without sized rows."""
    sized = [r for r in rows if _num(r, "bytes") and _num(r, "time_us")]
    if not sized:
        return []
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return []
    group_keys = [k for k in ("coll", "ranks", "link_rate", "loss_pct", "dtype") if k in sized[0]]
    line_keys = [k for k in ("variant", "build") if k in sized[0]]
    groups = {}
    for r in sized:
        groups.setdefault(tuple(r[k] for k in group_keys), []).append(r)
    made = []
    for g, rs in sorted(groups.items()):
        metrics = ["time_us"] + (["algbw"] if any(_num(r, "algbw") for r in rs) else [])
        fig, axes = plt.subplots(1, len(metrics), figsize=(6 * len(metrics), 4.2))
        axes = axes if len(metrics) > 1 else [axes]
        for ax, m in zip(axes, metrics):
            lines = {}
            for r in rs:
                v = _num(r, m)
                if v is None or v <= 0:
                    continue
                key = " ".join(r[k] for k in line_keys)
                lines.setdefault(key, {}).setdefault(int(float(r["bytes"])), []).append(v)
            for key, pts in sorted(lines.items()):
                xs = sorted(pts)
                ax.plot(xs, [statistics.median(pts[x]) for x in xs], marker="o", ms=3, label=key)
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")
            ax.set_xlabel("bytes")
            ax.set_ylabel({"time_us": "time per call (us)", "algbw": "algbw (GB/s)"}[m])
            ax.grid(True, which="both", alpha=0.3)
            ax.legend(fontsize=7)
        title = ", ".join(f"{k} {_label(k, v)}" for k, v in zip(group_keys, g)
                          if v not in ("", None))
        fig.suptitle(f"{name}: {title}", fontsize=9)
        fig.tight_layout()
        fname = "plot-" + "-".join(_label(k, v) for k, v in zip(group_keys, g)
                                   if v not in ("", None)) + ".png"
        fig.savefig(os.path.join(out, fname), dpi=80)
        plt.close(fig)
        made.append(fname)
    return made


def write_readme(out, scenario, summary, command, info, load_end, rc, files, ab_md="",
                 note=""):
    """The run's README: what ran, the machine, the revision, what is in the directory."""
    md = [f"# {scenario}: {summary}", "", "```sh", command, "```", "",
          f"- machine: {info['cpu']}, {info['cores']} cores, {info['kernel']}",
          f"- load (1, 5, 15 min): {info['load at start']} at the start, {load_end} at the end",
          f"- git: {info['git']}",
          f"- date: {info['date']}",
          f"- exit status: {rc}" + (" (77: skipped, the reason is in output.txt)"
                                    if rc == 77 else ""), ""]
    if note:
        md += [note, ""]
    summary_md = os.path.join(out, "summary.md")
    if os.path.exists(summary_md) and not ab_md:
        with open(summary_md) as f:
            text = f.read().strip()
        if len(text) < 6000:
            md += ["## Summary", "", text, ""]
        else:
            md += ["## Summary", "", "See [summary.md](summary.md).", ""]
    if ab_md:
        md += ["## Two builds", "", ab_md, ""]
    pngs = [f for f in files if f.endswith(".png")]
    if pngs:
        md += ["## Plots", ""] + [f"![{f}]({f})" for f in pngs] + [""]
    md += ["## Files", ""] + [f"- `{f}`" for f in sorted(files) if f != "README.md"] + [""]
    with open(os.path.join(out, "README.md"), "w") as f:
        f.write("\n".join(md))


def _title_and_command(readme):
    title, command = "", ""
    with open(readme, errors="replace") as f:
        lines = f.read().splitlines()
    for i, line in enumerate(lines):
        if not title and line.startswith("# "):
            title = line[2:].strip()
        if not command and line.startswith("```sh") and i + 1 < len(lines):
            command = lines[i + 1].split("  #", 1)[0].strip()
    return title, command


def index(results=RESULTS):
    """testbed/results/README.md: every directory there with a README (its title, the command
    on its first ``sh`` block, and which tracked files cite it)."""
    rows = []
    for d in sorted(glob.glob(os.path.join(results, "*", "README.md"))):
        name = os.path.basename(os.path.dirname(d))
        title, command = _title_and_command(d)
        cited = subprocess.run(["git", "-C", ROOT, "grep", "-l", f"testbed/results/{name}", "--",
                                ":!testbed/results"], capture_output=True, text=True).stdout.split()
        rows.append((name, title, command, cited))
    md = ["# testbed/results: the record", "",
          "Generated by `testbed/run.py index` (rerun it after adding or removing a directory). "
          "Raw run output stays out of git (`.gitignore`): a directory is added (`git add -f`) "
          "only when a document cites it, one per scenario, the latest; each holds the command, "
          "the machine and load, the git revision, the rows (CSV) and a README. `REPORT.md` is "
          "the testbed's report (its first line names the command that regenerates it).", "",
          "| directory | what it measured | command | cited by |", "|---|---|---|---|"]
    for name, title, command, cited in rows:
        head, sep, rest = title.partition(": ")
        what = rest if sep and " " not in head else title  # "SCENARIO: summary" of the driver
        md.append(f"| [`{name}/`]({name}/README.md) | {what} | "
                  f"{'`' + command + '`' if command else '-'} | "
                  f"{', '.join(f'`{c}`' for c in cited) or '-'} |")
    md.append("")
    path = os.path.join(results, "README.md")
    with open(path, "w") as f:
        f.write("\n".join(md))
    return path, len(rows)
