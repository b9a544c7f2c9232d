"""The aggregator's straggler ranking at the end of a run.

With INA_STRAGGLER_REPORT=1, rank 0 (RANK, else INA_RANK) prints at exit the job's stragglers by
time lost with their causes, read over HTTP from the aggregator's /v1/telemetry
(INA_TELEMETRY=host:port, the aggregator's --http-port; the job INA_JOB, else every job) or from
the controller's /v1/jobs/INA_JOB (INA_CONTROLLER=host:port). Standard library only; never
raises (a failed read prints one line saying why).
"""
import json
import os
import sys
import urllib.request


def format_report(tele, top=4):
    """Text of one aggregator's telemetry of one job (the JSON of /v1/telemetry's entries)."""
    lines = []
    w = tele.get("lost_window", {})
    lines.append(f"ina: job {tele.get('job')} ({tele.get('role', 'flat')}): "
                 f"{w.get('lost_ms', 0):.1f} ms lost to stragglers in the last "
                 f"{w.get('span_s', 0):.1f} s ({w.get('collectives', 0)} collectives)")
    unit = "leaf" if tele.get("role") == "root" else "rank"
    named = False
    for i, s in enumerate(tele.get("stragglers", [])):
        if not s.get("straggler") and i >= top:
            continue
        named = named or bool(s.get("straggler"))
        lines.append(
            f"  {unit} {s.get('rank')}{'  STRAGGLER' if s.get('straggler') else ''}: lost "
            f"{s.get('lost_ms', 0):.1f} ms ({100 * s.get('lost_share', 0):.0f}%), in "
            f"{100 * s.get('collective_fraction', 0):.0f}% of collectives, "
            f"{s.get('mean_episode_ms', 0):.2f} ms each; cause: {s.get('cause_text', '?')}")
    if not named:
        lines.append("  no straggler: the lost time is within the job's noise")
    return "\n".join(lines)


def _get(url):
    with urllib.request.urlopen(url, timeout=5) as r:
        return json.loads(r.read().decode())


def report(out=sys.stderr):
    """Reads the telemetry named by the environment and prints it; returns the text or None."""
    job = os.environ.get("INA_JOB", "")
    try:
        if os.environ.get("INA_TELEMETRY"):
            teles = _get(f"http://{os.environ['INA_TELEMETRY']}/v1/telemetry")
            teles = [t for t in teles if not job or str(t.get("job")) == job]
        elif os.environ.get("INA_CONTROLLER") and job:
            j = _get(f"http://{os.environ['INA_CONTROLLER']}/v1/jobs/{job}")
            by_agg = j.get("telemetry_by_aggregator") or {j.get("aggregator", "?"): j.get("telemetry", {})}
            teles = list(by_agg.values())
        else:
            print("ina: INA_STRAGGLER_REPORT needs INA_TELEMETRY=host:port (the aggregator's "
                  "--http-port) or INA_CONTROLLER=host:port with INA_JOB", file=out)
            return None
    except (OSError, ValueError) as e:
        print(f"ina: straggler report: cannot read the telemetry: {e}", file=out)
        return None
    text = "\n".join(format_report(t) for t in teles if isinstance(t, dict)) or \
        "ina: straggler report: no telemetry for this job"
    print(text, file=out, flush=True)
    return text


def install():
    """At exit, rank 0 prints the report when INA_STRAGGLER_REPORT=1."""
    if os.environ.get("INA_STRAGGLER_REPORT") != "1":
        return
    if os.environ.get("RANK", os.environ.get("INA_RANK", "0")) != "0":
        return
    import atexit
    atexit.register(report)
