#!/usr/bin/env python3
"""What libina and its embedders need at load time, and what the plugins export (suite unit).

    needed_libs_test.py KIND:PATH ...

  libina:PATH   NEEDED within libc, libstdc++, libm, libgcc_s, ld-linux-x86-64 (libina.so,
                libnccl-net-ina.so: worker code with the optional transports as plugins)
  mpi:PATH      the same plus the MPI library (libina-mpi.so)
  nodeps:PATH   no DPDK, rdma-core, libxdp/libbpf or CUDA library in NEEDED (the torch extension,
                which needs torch's own libraries)
  plugin:PATH   a transport plugin: exports ina_plugin_entry only, imports no ina:: symbol (it
                reaches libina through the PluginHost table and the objects passed in), and
                carries no log level of its own (protocol/log.cc's g_level absent)

Reads the dynamic section with readelf -d and the symbols with nm. Before the transports became
plugins, libina.so listed librte_*.so.23, libibverbs.so.1, libxdp.so.1, libbpf.so.1 and
libcudart.so.13 as NEEDED and this test failed.
"""
import os
import re
import shutil
import subprocess
import sys

BASE = re.compile(r"(libc\.so\.6|libstdc\+\+\.so\.6|libm\.so\.6|libgcc_s\.so\.1|"
                  r"ld-linux-x86-64\.so\.2)$")
# A build with -Db_sanitize (meson sets INA_SANITIZERS for this test) links the sanitizer
# runtimes into everything; what trainers load is the build without them.
SANITIZERS = re.compile(r"lib(a|ub|l|t)san\.so\.\d+$")
MPI = re.compile(r"libmpi(_\w+)?\.so(\.\d+)*$")
OPTIONAL = re.compile(r"(librte_|libibverbs|libmlx|librdmacm|libxdp|libbpf|libcuda|libcudart|"
                      r"libnvidia|libelf)")


def needed(path):
    out = subprocess.run(["readelf", "-d", "-W", path], capture_output=True, text=True,
                         check=True).stdout
    return re.findall(r"\(NEEDED\)\s+Shared library: \[([^\]]+)\]", out)


def exports(path):
    out = subprocess.run(["nm", "-D", "--defined-only", path], capture_output=True, text=True,
                         check=True).stdout
    return [line.split()[-1] for line in out.splitlines() if line.strip()]


def imports(path):
    out = subprocess.run(["nm", "-D", "-C", "--undefined-only", path], capture_output=True,
                         text=True, check=True).stdout
    return [line.split(None, 1)[-1] for line in out.splitlines() if "ina::" in line]


def symbols(path):
    out = subprocess.run(["nm", "-C", path], capture_output=True, text=True).stdout
    return out


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    for tool in ("readelf", "nm"):
        if shutil.which(tool) is None:
            print("SKIP: %s not found (binutils)" % tool)
            sys.exit(77)
    failures = []
    sanitized = bool(os.environ.get("INA_SANITIZERS"))
    if sanitized:
        print("built with -Db_sanitize=%s: its runtimes are allowed" % os.environ["INA_SANITIZERS"])
    for arg in sys.argv[1:]:
        kind, _, path = arg.partition(":")
        libs = [l for l in needed(path) if not (sanitized and SANITIZERS.match(l))]
        print("%s %s: NEEDED %s" % (kind, path, " ".join(libs)))
        if kind == "libina":
            bad = [l for l in libs if not BASE.match(l)]
        elif kind == "mpi":
            bad = [l for l in libs if not BASE.match(l) and not MPI.match(l)]
        elif kind == "nodeps":
            bad = [l for l in libs if OPTIONAL.match(l)]
        elif kind == "plugin":
            bad = []
            ex = exports(path)
            if ex != ["ina_plugin_entry"]:
                failures.append("%s exports %s, expected ina_plugin_entry only" % (path, ex))
            imp = imports(path)
            if imp:
                failures.append("%s imports libina symbols %s" % (path, imp))
            syms = symbols(path)
            if "ina::log::(anonymous namespace)::g_level" in syms:
                failures.append("%s carries its own log level (protocol/log.cc linked in)" % path)
        else:
            sys.exit("unknown kind " + kind)
        if bad:
            failures.append("%s needs %s at load time (allowed: libc, libstdc++, libm, libgcc_s, "
                            "ld-linux%s)" % (path, ", ".join(bad), ", libmpi" if kind == "mpi" else ""))
    for f in failures:
        print("FAIL: " + f)
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
