"""Local launch helpers for the examples and tests: an ina-aggregator child on 127.0.0.1 and
free TCP ports. Not needed to use the backend (a real job points INA_AGGREGATOR at its switch)."""
import os
import shutil
import socket
import subprocess
import tempfile
import time

_HERE = os.path.dirname(os.path.abspath(__file__))


def find_aggregator(explicit=None):
    """The ina-aggregator binary: `explicit`, INA_AGGREGATOR_BIN, PATH, or the build tree this
    package was built in (<build>/aggregator/ina-aggregator). None when not found."""
    candidates = [explicit, os.environ.get("INA_AGGREGATOR_BIN"), shutil.which("ina-aggregator"),
                  os.path.join(_HERE, "..", "..", "..", "aggregator", "ina-aggregator")]
    for c in candidates:
        if c and os.path.isfile(c) and os.access(c, os.X_OK):
            return os.path.abspath(c)
    return None


def free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Aggregator:
    """An ina-aggregator for one job of `world_size` ranks on an ephemeral UDP port of 127.0.0.1.
    Use as a context manager; .address is the INA_AGGREGATOR value."""

    def __init__(self, binary, world_size, job=1, timeout=10.0):
        self._dir = tempfile.mkdtemp(prefix="ina-torch-agg-")
        port_file = os.path.join(self._dir, "port")
        self.proc = subprocess.Popen(
            [binary, "--world-size", str(world_size), "--bind", "127.0.0.1", "--port", "0",
             "--port-file", port_file, "--job", str(job), "--stats-interval-ms", "0"],
            stdout=subprocess.DEVNULL)
        deadline = time.monotonic() + timeout
        self.port = None
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"ina-aggregator exited during start-up ({self.proc.returncode})")
            try:
                with open(port_file) as f:
                    text = f.read().strip()
                if text:
                    self.port = int(text)
                    break
            except FileNotFoundError:
                pass
            time.sleep(0.01)
        if self.port is None:
            self.stop()
            raise RuntimeError(f"ina-aggregator did not write its port within {timeout} s")
        self.address = f"127.0.0.1:{self.port}"

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        shutil.rmtree(self._dir, ignore_errors=True)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()
