"""An ina-controller and an ina-aggregator registered with it, for the Python tests that need a
managed job (tests/mpi/mpi_preload_test.py, integrations/torch/tests/controller_test.py).

    ctl_port = start_managed(ctl_bin, agg_bin, tmp, procs)   # both appended to procs
    before = admitted_total(ctl_port)

Failures raise RuntimeError naming the program; the caller ends the processes in procs.
"""
import os
import re
import subprocess
import time
import urllib.request


def wait_port_file(proc, path, what, timeout=10.0):
    """The port `proc` wrote to `path`; RuntimeError when it exits first or `timeout` passes."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited during start-up ({proc.returncode})")
        try:
            with open(path) as f:
                text = f.read().strip()
            if text:
                return int(text)
        except FileNotFoundError:
            pass
        time.sleep(0.02)
    raise RuntimeError(f"{what} did not write {path} within {timeout} s")


def http_get(port, path):
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=2) as r:
        return r.read().decode()


def admitted_total(port):
    """The controller's count of admitted jobs (its /metrics)."""
    m = re.search(r'ina_controller_admission_decisions_total\{result="admitted"\} (\d+)',
                  http_get(port, "/metrics"))
    if m is None:
        raise RuntimeError("the controller's /metrics has no admitted count")
    return int(m.group(1))


def start_managed(ctl_bin, agg_bin, tmp, procs):
    """Starts ina-controller and an ina-aggregator registered with it (port files managed-*.port
    in `tmp`), appends both to `procs`, waits until the aggregator is registered; returns the
    controller's port."""
    ctl = subprocess.Popen([ctl_bin, "--bind", "127.0.0.1", "--port", "0", "--port-file",
                            os.path.join(tmp, "managed-ctl.port")], stdout=subprocess.DEVNULL)
    procs.append(ctl)
    ctl_port = wait_port_file(ctl, os.path.join(tmp, "managed-ctl.port"), "ina-controller")
    agg = subprocess.Popen([agg_bin, "--bind", "127.0.0.1", "--port", "0", "--port-file",
                            os.path.join(tmp, "managed-agg.port"), "--controller",
                            f"127.0.0.1:{ctl_port}", "--slot-capacity", "4096",
                            "--http-port", "-1", "--heartbeat-ms", "50",
                            "--stats-interval-ms", "0"], stdout=subprocess.DEVNULL)
    procs.append(agg)
    wait_port_file(agg, os.path.join(tmp, "managed-agg.port"), "ina-aggregator --controller")
    deadline = time.monotonic() + 10
    while http_get(ctl_port, "/v1/aggregators").strip() in ("", "[]"):
        if time.monotonic() > deadline:
            raise RuntimeError("the aggregator did not register with the controller")
        time.sleep(0.05)
    return ctl_port
