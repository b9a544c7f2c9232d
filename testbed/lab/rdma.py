"""The `rdma` test suite (VerbsMesh on a real verbs device) on a soft-RoCE device: an rdma_rxe
link over a veth pair made for this run (unique names, deleted at the end). For Linux machines
without an RDMA NIC whose kernel has the rdma_rxe module. Needs root; exits 77 (SKIP) naming
the reason when the device cannot be made."""
import argparse
import os
import shutil
import subprocess
import time


def sh(*argv, check=True):
    return subprocess.run(argv, capture_output=True, text=True, check=check)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build-dir", default="build")
    a, _ = ap.parse_known_args(argv)
    if os.geteuid() != 0:
        print("SKIP: needs root (to create a veth pair and an rxe device)")
        return 77
    if shutil.which("rdma") is None:
        print("SKIP: the rdma tool (iproute2) is missing")
        return 77
    modprobe = shutil.which("modprobe") or "/sbin/modprobe"
    if not os.access(modprobe, os.X_OK):
        print("SKIP: modprobe is missing (kmod): cannot load rdma_rxe")
        return 77
    if subprocess.run([modprobe, "rdma_rxe"], capture_output=True).returncode != 0:
        print("SKIP: the kernel has no rdma_rxe module (soft RoCE)")
        return 77
    tag = f"ina{os.getpid()}"
    va, vb, dev = f"{tag}a", f"{tag}b", f"rxe_{tag}"
    try:
        sh("ip", "link", "add", va, "type", "veth", "peer", "name", vb)
        sh("ip", "link", "set", va, "up")
        sh("ip", "link", "set", vb, "up")
        sh("ip", "addr", "add", "192.0.2.1/32", "dev", va)  # TEST-NET-1: an IPv4-mapped GID
        sh("rdma", "link", "add", dev, "type", "rxe", "netdev", va)
        for _ in range(50):
            if "state ACTIVE" in sh("rdma", "link", "show", f"{dev}/1", check=False).stdout:
                break
            time.sleep(0.1)
        # GID index 0 (link-local, from the MAC) serves one device talking to itself.
        env = dict(os.environ, INA_VERBS_DEVICE=dev, INA_HOST_TRANSPORT="verbs",
                   INA_VERBS_GID_INDEX=os.environ.get("INA_VERBS_GID_INDEX", "0"))
        return subprocess.run(["meson", "test", "-C", a.build_dir, "--suite", "rdma",
                               "--print-errorlogs"], env=env).returncode
    finally:
        sh("rdma", "link", "delete", dev, check=False)
        sh("ip", "link", "delete", va, check=False)
