#!/usr/bin/env python3
"""ina.h's documentation against the code.

  ina_h_doc.py INA_H SOURCE_ROOT CC LIBINA_DIR [UNINSTALLED_PC_DIR]

- Every ina_* name its comments mention is declared in it (no ina_comm_create_from_env).
- Its environment list and the library's reads agree: every INA_* variable that libina's sources
  (worker/, base/) name is listed, and every listed one is read (INA_TEST_* are test knobs).
- The listed defaults of INA_BLOCK_ELEMS and INA_WINDOW (and the config struct's "0: ... or N")
  are the C++ Config's (worker/include/ina/ina.hpp).
- The example compiles as C and links against libina (CC, LIBINA_DIR), with the flags of the
  build's ina-uninstalled.pc when its folder is given (pkg-config finds ina/ina.h through it).
"""
import os
import re
import subprocess
import sys
import tempfile

ina_h, root, cc, libdir = sys.argv[1:5]
pc_dir = sys.argv[5] if len(sys.argv) > 5 else None
text = open(ina_h).read()
fail = []

comments = "\n".join(re.findall(r"/\*.*?\*/", text, re.S))
code = re.sub(r"/\*.*?\*/", " ", text, flags=re.S)
code = re.sub(r"//[^\n]*", " ", code)

# 1. Names mentioned are declared (functions, types, macros).
declared = set(re.findall(r"\b(ina_[a-z0-9_]+)\s*\(", code))
declared |= set(re.findall(r"\b(ina_[a-z0-9_]+_t)\b", code))
mentioned = set(re.findall(r"\b(ina_[a-z0-9_]+)\b(?![.\w])", comments))
for name in sorted(mentioned - declared):
    fail.append("ina.h mentions %s, which it does not declare" % name)

# 2. The environment list against the library's sources.
env_block = text[text.index(" * Environment"):text.index("*/")]
tokens = re.findall(r"\b(INA_[A-Z0-9_]+\*?)", env_block)
listed = {t for t in tokens if not t.endswith("*")}
wildcards = {t[:-1] for t in tokens if t.endswith("*")}  # INA_LOCAL_* and the like
read = set()
for sub in ("worker", "base"):
    for dirpath, _, files in os.walk(os.path.join(root, sub)):
        for f in files:
            if f.endswith((".cc", ".h")) and not f.endswith("_test.cc"):
                src = open(os.path.join(dirpath, f), errors="replace").read()
                read |= set(re.findall(r'"(INA_[A-Z0-9_]+)"', src))
read = {v for v in read if not v.startswith("INA_TEST_")}
# Identifiers of the API itself that appear in strings (enum names in messages), not variables.
api_names = set(re.findall(r"\b(INA_[A-Z0-9_]+)\b", code))
read -= api_names
for v in sorted(read - listed):
    if not any(v.startswith(w) for w in wildcards):
        fail.append("libina reads %s, which ina.h's environment list omits" % v)
for w in sorted(wildcards):
    if not any(v.startswith(w) for v in read):
        fail.append("ina.h lists %s*, and libina reads no such variable" % w)
for v in sorted(listed - read - api_names):
    fail.append("ina.h lists %s, which libina does not read" % v)

# 3. Defaults.
hpp = open(os.path.join(root, "worker/include/ina/ina.hpp")).read()
for field, var in (("block_elems", "INA_BLOCK_ELEMS"), ("window", "INA_WINDOW")):
    m = re.search(r"\b%s = (\d+);" % field, hpp)
    if not m:
        fail.append("ina.hpp: no default for Config::%s" % field)
        continue
    want = m.group(1)
    s = re.search(r"0: %s or (\d+)" % var, text)
    if not s or s.group(1) != want:
        fail.append("ina.h: the config comment gives %s's default as %s, the code %s" %
                    (var, s.group(1) if s else "nothing", want))
block = re.search(r"elements per packet \(default (\d+)", env_block)
if not block or block.group(1) != re.search(r"\bblock_elems = (\d+);", hpp).group(1):
    fail.append("ina.h: the environment list's INA_BLOCK_ELEMS default %s is not the code's" %
                (block.group(1) if block else "(missing)"))

# 4. The example compiles and links.
ex = re.search(r" \* Example[^\n]*\n \*\n(.*?)\n \*\n", text, re.S)
if not ex:
    fail.append("ina.h: no example block")
else:
    body = "\n".join(line[3:] if line.startswith(" * ") else "" for line in ex.group(1).split("\n"))
    with tempfile.TemporaryDirectory() as d:
        src = os.path.join(d, "example.c")
        with open(src, "w") as f:
            f.write("#include <stdio.h>\n#include <ina/ina.h>\nint main(void) {\n%s\n  return 0;\n}\n"
                    % body)
        if pc_dir:
            env = dict(os.environ, PKG_CONFIG_PATH=pc_dir)
            pc = subprocess.run(["pkg-config", "--cflags", "--libs", "ina-uninstalled"],
                                capture_output=True, text=True, env=env)
            if pc.returncode != 0:
                fail.append("pkg-config ina-uninstalled: " + pc.stderr.strip())
            flags = pc.stdout.split()
        else:
            flags = ["-I", os.path.dirname(os.path.dirname(ina_h)), "-L", libdir, "-lina"]
        cmd = cc.split() + ["-std=c11", "-Wall", "-Werror", src, "-o",
                            os.path.join(d, "example")] + flags + ["-Wl,-rpath," + libdir]
        r = subprocess.run(cmd, capture_output=True, text=True)
        if r.returncode != 0:
            fail.append("ina.h's example does not build: %s\n%s" % (" ".join(cmd), r.stderr))

for f in fail:
    print("FAIL", f)
if not fail:
    print("ok ina.h: %d names declared, %d variables listed and read, defaults, example builds" %
          (len(mentioned), len(listed & read)))
sys.exit(1 if fail else 0)
