#!/usr/bin/env python3
"""libina on a node without DPDK, rdma-core, libxdp or CUDA (suite integration).

    minimal_root_test.py <program> <libina.so> <plugin dir> <ina-aggregator> [lib.so ...]

Builds a root directory holding only libc, libstdc++, libm, libgcc_s and ld-linux (copied from
this machine), libina.so and, in the first run, every libina-*.so plugin; the second run has no
plugin at all. In each, minimal_root_program (chroot'ed there, LD_LIBRARY_PATH=/opt/ina/lib) runs a
kernel-UDP AllReduce against an ina-aggregator running outside the root on loopback, an AllReduce
on the host mesh over TCP, and checks that INA_TRANSPORT=dpdk|xdp and INA_HOST_TRANSPORT=verbs fail
naming the transport, the plugin and dlerror()'s reason, that ina_cuda_available says why the
device path is off, and that the further libraries given (libnccl-net-ina.so, libina-mpi.so) load
with dlopen. Their own dependencies outside the base (libmpi's closure) are copied into the root
too, and must not include DPDK, rdma-core, libxdp/libbpf or CUDA.

Before libina's transports became plugins, libina.so needed librte_*, libibverbs, libxdp, libbpf
and libcudart: the program could not start in such a root (exit 127). Needs root (chroot): exits
77 (SKIP) with the reason otherwise.
"""
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time

BASE = ["libc.so.6", "libstdc++.so.6", "libm.so.6", "libgcc_s.so.1"]
OPTIONAL = re.compile(r"(librte_|libibverbs|libmlx|librdmacm|libxdp|libbpf|libcuda|libcudart|"
                      r"libnvidia)")


def closure(lib):
    """The libraries `lib` loads beyond the base ones (ldd), as name -> path."""
    out = subprocess.run(["ldd", lib], capture_output=True, text=True, check=True).stdout
    deps = {}
    for line in out.splitlines():
        m = re.match(r"\s*(\S+) => (/\S+)", line)
        if m and m.group(1) not in BASE:
            deps[m.group(1)] = m.group(2)
    return deps


def skip(why):
    print("SKIP: " + why)
    sys.exit(77)


def free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def locate_base(program):
    """name -> path of the base libraries and the ELF interpreter, as this machine resolves them
    (ldconfig's cache, not the program's own list: it must not decide what the root holds)."""
    found = {}
    out = subprocess.run(["ldconfig", "-p"], capture_output=True, text=True, check=True).stdout
    for line in out.splitlines():
        m = re.match(r"\s*(\S+) \(libc6,x86-64[^)]*\) => (\S+)", line)
        if m and m.group(1) in BASE and m.group(1) not in found:
            found[m.group(1)] = m.group(2)
    missing = [n for n in BASE if n not in found]
    if missing:
        skip("ldconfig -p does not list " + ", ".join(missing))
    interp = subprocess.run(["readelf", "-l", program], capture_output=True, text=True,
                            check=True).stdout
    m = re.search(r"Requesting program interpreter: (\S+)\]", interp)
    if not m:
        skip("no ELF interpreter in " + program)
    found["interp"] = m.group(1)
    return found


def make_root(base, program, libina, plugin_dir, plugins, extra):
    root = tempfile.mkdtemp(prefix="ina-minroot-")
    for name, path in base.items():
        dst = root + path
        os.makedirs(os.path.dirname(dst), exist_ok=True)
        shutil.copy2(os.path.realpath(path), dst)
    lib = root + "/opt/ina/lib"
    os.makedirs(lib)
    os.makedirs(root + "/opt/ina/bin")
    os.makedirs(root + "/tmp")
    shutil.copy2(os.path.realpath(libina), lib + "/libina.so.0")
    if plugins:
        for f in sorted(os.listdir(plugin_dir)):
            if re.fullmatch(r"libina-[a-z]+\.so", f):
                shutil.copy2(os.path.join(plugin_dir, f), lib + "/" + f)
    for e in extra:
        shutil.copy2(e, lib + "/" + os.path.basename(e))
        for name, path in closure(e).items():
            if OPTIONAL.match(name):
                sys.exit("%s needs %s (%s): it must not need an optional transport's library"
                         % (e, name, path))
            if not os.path.exists(lib + "/" + name):
                shutil.copy2(os.path.realpath(path), lib + "/" + name)
    shutil.copy2(program, root + "/opt/ina/bin/minimal_root_program")
    return root


def start_aggregator(binary, port_file):
    proc = subprocess.Popen([binary, "--world-size", "1", "--port", "0", "--port-file", port_file,
                             "--bind", "127.0.0.1"], stdout=subprocess.DEVNULL)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            with open(port_file) as f:
                port = int(f.read().split()[0])
            if port > 0:
                return proc, port
        except (OSError, ValueError, IndexError):
            pass
        if proc.poll() is not None:
            sys.exit("ina-aggregator exited before listening (status %d)" % proc.returncode)
        time.sleep(0.02)
    proc.kill()
    sys.exit("ina-aggregator did not write " + port_file)


def stop(proc):
    proc.terminate()
    try:
        proc.wait(timeout=5)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def run(root, port, extra, plugins, built):
    def enter():
        os.chroot(root)
        os.chdir("/")

    env = {"LD_LIBRARY_PATH": "/opt/ina/lib", "PATH": "/opt/ina/bin", "INA_LOG_LEVEL": "warn"}
    args = ["/opt/ina/bin/minimal_root_program", "127.0.0.1:%d" % port, str(free_port()),
            "all" if plugins else "none", ",".join(built) or "-"]
    args += ["/opt/ina/lib/" + os.path.basename(e) for e in extra]
    try:
        return subprocess.run(args, env=env, preexec_fn=enter, timeout=60).returncode
    except subprocess.TimeoutExpired:
        print("minimal_root_program did not finish within 60 s")
        return 1
    except (PermissionError, subprocess.SubprocessError) as e:
        skip("cannot chroot into %s: %s" % (root, e))


def main():
    if len(sys.argv) < 5:
        sys.exit(__doc__)
    program, libina, plugin_dir, aggregator = sys.argv[1:5]
    extra = sys.argv[5:]
    if os.environ.get("INA_SANITIZERS"):
        skip("built with -Db_sanitize=%s: its programs need the sanitizer runtimes, which a "
             "minimal root leaves out on purpose" % os.environ["INA_SANITIZERS"])
    if os.geteuid() != 0:
        skip("needs root to chroot into a root without DPDK, rdma-core, libxdp and CUDA")
    base = locate_base(program)
    built = sorted(m.group(1) for m in (re.fullmatch(r"libina-([a-z]+)\.so", f)
                                        for f in os.listdir(plugin_dir)) if m)
    failures = 0
    for plugins in (True, False):
        label = "with every plugin, without their system libraries" if plugins else "without plugins"
        root = make_root(base, program, libina, plugin_dir, plugins, extra)
        port_file = os.path.join(tempfile.gettempdir(), "ina-minroot-%d.port" % os.getpid())
        agg, port = start_aggregator(aggregator, port_file)
        try:
            rc = run(root, port, extra, plugins, built)
        finally:
            stop(agg)
            os.unlink(port_file)
            shutil.rmtree(root, ignore_errors=True)
        print("%s: exit %d" % (label, rc), flush=True)
        if rc != 0:
            failures += 1
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
