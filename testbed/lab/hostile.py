"""Hostile traffic against a running job: does any collective fail or go wrong?

Starts an ina-aggregator on 127.0.0.1 with a job key, and ina-bench as the job's ranks (threads
of one process, external mode, the same key). It captures one genuine DATA and one genuine HELLO
datagram of the job from loopback (AF_PACKET: needs root), then for --seconds sends, as fast as
one Python thread can, datagrams built from them:

  replay      the captured DATA or HELLO, unchanged (valid tags; the DATA's round is stale)
  seq         the DATA with seq XOR 2^20 (the forgery that used to move a slot ahead)
  hello       the HELLO with a new nonce (the forgery that used to reopen the join barrier)
  flip        the DATA with 1-3 random bits flipped
  trunc       the DATA cut at a random length
  garbage     random bytes of a random length, with the INA magic or without

Meanwhile ina-bench runs back to back (-n ITERS per run, each run a new communicator: joins
under attack too) and checks every element of each size's last output. Prints one line per
bench run, then the totals: collectives run, runs failed, elements wrong, datagrams sent by kind,
and the aggregator's drop counters by reason. Exit 0 when no run failed.

  testbed/run.py hostile [-- --seconds 10 --workers 4]       (root)
"""
import argparse
import os
import random
import re
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time

ETH_P_ALL = 0x0003
KEY = "5f1e2d3c4b5a69788796a5b4c3d2e1f0"
FLAG_RESULT, FLAG_ERROR, FLAG_HELLO, FLAG_PARTIAL = 0x01, 0x04, 0x10, 0x20
OFF_FLAGS, OFF_SEQ, OFF_COUNT = 3, 8, 16
WIDTH = {1: 4, 2: 4, 3: 2, 4: 2, 5: 1, 6: 1}  # bytes per element by wire dtype code
HEADER = 40


def capture(port, want, stop, found):
    """Fills found['data'] and found['hello'] with genuine datagrams sent to `port`."""
    s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(ETH_P_ALL))
    s.bind(("lo", 0))
    s.settimeout(0.2)
    while not stop.is_set() and len(found) < want:
        try:
            frame = s.recv(65535)
        except socket.timeout:
            continue
        if len(frame) < 14 + 20 + 8 or frame[12:14] != b"\x08\x00":
            continue
        ip = frame[14:]
        ihl = (ip[0] & 0x0F) * 4
        if ip[9] != 17:
            continue
        udp = ip[ihl:]
        dport = struct.unpack("!H", udp[2:4])[0]
        payload = udp[8:]
        if dport != port or len(payload) < HEADER:
            continue
        flags = payload[OFF_FLAGS]
        if flags & (FLAG_RESULT | FLAG_ERROR | FLAG_PARTIAL):
            continue
        kind = "hello" if flags & FLAG_HELLO else "data"
        # On lo a UDP GSO train is seen whole: keep its first datagram (header + count words).
        count, dtype = struct.unpack_from("!HB", payload, OFF_COUNT)
        width = 4 if kind == "hello" else WIDTH.get(dtype, 4)
        found.setdefault(kind, bytes(payload[:HEADER + count * width]))
    s.close()


def forge_pool(data, hello, rng, n=20000):
    pool = []
    for _ in range(n):
        kind = rng.choice(["replay", "seq", "hello", "flip", "trunc", "garbage"])
        if kind == "replay":
            d = rng.choice([data, hello])
        elif kind == "seq":
            b = bytearray(data)
            seq = struct.unpack_from("!I", b, OFF_SEQ)[0] ^ (1 << 20)
            struct.pack_into("!I", b, OFF_SEQ, seq)
            d = bytes(b)
        elif kind == "hello":
            b = bytearray(hello)
            struct.pack_into("!I", b, OFF_SEQ, rng.getrandbits(32))
            d = bytes(b)
        elif kind == "flip":
            b = bytearray(data)
            for _ in range(rng.randint(1, 3)):
                i = rng.randrange(len(b) * 8)
                b[i // 8] ^= 1 << (i % 8)
            d = bytes(b)
        elif kind == "trunc":
            d = data[:rng.randrange(len(data))]
        else:
            d = bytes(rng.getrandbits(8) for _ in range(rng.randrange(1, 1200)))
            if rng.random() < 0.5 and len(d) >= 2:
                d = data[:2] + d[2:]
        pool.append((kind, d))
    return pool


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--build-dir", default="build")
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--size", default="64K", help="bytes per AllReduce (ina-bench -b/-e)")
    ap.add_argument("--iters", type=int, default=200, help="collectives per bench run")
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args(argv)
    if os.geteuid() != 0:
        print("hostile_traffic: needs root (AF_PACKET capture on lo)", file=sys.stderr)
        return 77
    agg_bin = os.path.join(a.build_dir, "aggregator", "ina-aggregator")
    bench = os.path.join(a.build_dir, "testbed", "ina-bench")
    for b in (agg_bin, bench):
        if not os.access(b, os.X_OK):
            print(f"hostile_traffic: {b} not built", file=sys.stderr)
            return 2
    rng = random.Random(a.seed)
    scratch = tempfile.mkdtemp(prefix="ina-hostile-")
    port_file = os.path.join(scratch, "port")
    agg_log = open(os.path.join(scratch, "aggregator.txt"), "w+")
    agg = subprocess.Popen([agg_bin, "--bind", "127.0.0.1", "--port", "0", "--port-file",
                            port_file, "--world-size", str(a.workers), "--key", KEY,
                            "--stats-interval-ms", "0"], stdout=agg_log, stderr=subprocess.STDOUT)
    for _ in range(200):
        if os.path.exists(port_file) and open(port_file).read().strip():
            break
        time.sleep(0.05)
    port = int(open(port_file).read())
    env = dict(os.environ, INA_WORLD_SIZE=str(a.workers), INA_JOB_KEY=KEY,
               INA_TRANSPORT="udp", INA_LOG_LEVEL="error")
    argv = [bench, "--aggregator", f"127.0.0.1:{port}", "--rank", "0", "--local-ranks",
            str(a.workers), "--workers", str(a.workers), "-b", a.size, "-e", a.size,
            "-n", str(a.iters), "-w", "1", "--timeout-ms", "5000"]

    stop_capture = threading.Event()
    found = {}
    cap = threading.Thread(target=capture, args=(port, 2, stop_capture, found), daemon=True)
    cap.start()
    runs, failed, wrong, collectives = 0, 0, 0, 0
    sent = {}
    attack = {"on": False, "done": False}

    def blast():
        deadline = time.time() + 30
        while len(found) < 2 and time.time() < deadline:
            time.sleep(0.01)
        if len(found) < 2:
            print("hostile_traffic: captured no DATA/HELLO datagram", file=sys.stderr)
            attack["done"] = True
            return
        pool = forge_pool(found["data"], found["hello"], rng)
        s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        attack["on"] = True
        end = time.time() + a.seconds
        i = 0
        while time.time() < end:
            for _ in range(256):
                kind, d = pool[i % len(pool)]
                i += 1
                try:
                    s.sendto(d, ("127.0.0.1", port))
                except OSError:
                    pass
                sent[kind] = sent.get(kind, 0) + 1
        attack["done"] = True

    attacker = threading.Thread(target=blast, daemon=True)
    attacker.start()
    t0 = time.time()
    while not attack["done"] or runs == 0:
        r = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=120)
        runs += 1
        rows = [l for l in r.stdout.splitlines() if re.match(r"\s*\d+\s+\d+\s+\w+", l)]
        w = 0
        for row in rows:
            f = row.split()
            if f and f[-1].isdigit():
                w += int(f[-1])
        wrong += w
        ok = r.returncode == 0 and w == 0
        failed += 0 if ok else 1
        collectives += a.iters + 1
        print(f"run {runs}: t={time.time() - t0:5.1f}s attack={'on' if attack['on'] else 'off'} "
              f"exit {r.returncode}, #wrong {w}" + ("" if ok else "\n" + r.stdout[-800:] +
                                                     r.stderr[-800:]), flush=True)
        if time.time() - t0 > a.seconds + 120:
            break
    stop_capture.set()
    agg.send_signal(signal.SIGTERM)
    agg.wait(timeout=10)
    agg_log.seek(0)
    counters = agg_log.read()
    total = sum(sent.values())
    print(f"\nbench runs {runs} ({collectives} collectives of {a.size}), failed runs {failed}, "
          f"elements wrong {wrong}")
    print(f"hostile datagrams sent {total} in {a.seconds:.0f} s ({total / a.seconds:.0f}/s): " +
          ", ".join(f"{k} {v}" for k, v in sorted(sent.items())))
    # The aggregator's final counter table (printed when it stops), from its last "totals:" line.
    lines = counters.splitlines()
    start = max((i for i, l in enumerate(lines) if l.startswith("totals:")), default=0)
    print("aggregator counters at exit:")
    print("\n".join(lines[start:]))
    return 0 if failed == 0 and total > 0 else 1
