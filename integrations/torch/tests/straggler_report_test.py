"""INA_STRAGGLER_REPORT's reader (ina_torch/stragglers.py), without torch: the text of a
telemetry entry, and report() reading /v1/telemetry from a local HTTP server."""
import http.server
import importlib.util
import io
import json
import os
import sys
import threading

HERE = os.path.dirname(os.path.abspath(__file__))
spec = importlib.util.spec_from_file_location(
    "stragglers", os.path.join(HERE, "..", "ina_torch", "stragglers.py"))
stragglers = importlib.util.module_from_spec(spec)
spec.loader.exec_module(stragglers)

TELE = [{"job": 7, "role": "flat",
         "lost_window": {"lost_ms": 50.0, "span_s": 9.0, "collectives": 800},
         "stragglers": [{"rank": 3, "straggler": True, "lost_ms": 40.0, "lost_share": 0.8,
                         "collective_fraction": 0.1, "mean_episode_ms": 0.5,
                         "cause_text": "late start (compute or host side)"},
                        {"rank": 1, "straggler": False, "lost_ms": 1.0, "lost_share": 0.02,
                         "cause_text": "late start (compute or host side)"}]},
        {"job": 8, "stragglers": []}]


class Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        body = json.dumps(TELE).encode() if self.path == "/v1/telemetry" else b"[]"
        self.send_response(200 if self.path == "/v1/telemetry" else 404)
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *a):
        pass


def main():
    t = stragglers.format_report(TELE[0])
    assert "rank 3  STRAGGLER: lost 40.0 ms (80%), in 10% of collectives, 0.50 ms each; " \
           "cause: late start" in t, t
    assert "rank 1: lost 1.0 ms" in t, t
    assert "no straggler" in stragglers.format_report({"stragglers": []})
    srv = http.server.HTTPServer(("127.0.0.1", 0), Handler)
    th = threading.Thread(target=srv.serve_forever, daemon=True)
    th.start()
    os.environ["INA_TELEMETRY"] = f"127.0.0.1:{srv.server_address[1]}"
    os.environ["INA_JOB"] = "7"
    out = io.StringIO()
    text = stragglers.report(out)
    assert text is not None and "job 7" in text and "job 8" not in text, out.getvalue()
    # Nothing to read from: one line saying what is missing, no exception.
    del os.environ["INA_TELEMETRY"]
    os.environ.pop("INA_CONTROLLER", None)
    out = io.StringIO()
    assert stragglers.report(out) is None and "INA_TELEMETRY" in out.getvalue()
    srv.shutdown()
    print("ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
