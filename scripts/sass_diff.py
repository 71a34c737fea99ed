#!/usr/bin/env python3
"""Compares the SASS of two builds kernel by kernel (cuobjdump -sass), for changes meant to leave the machine
code alone (moving device code between headers, renaming, deduplicating wrappers).

  scripts/sass_diff.py [-v] [-r OLD=NEW]... [-m OLD=NEW]... OLD NEW

OLD and NEW are two object files, or two build trees (e.g. build/CMakeFiles/msa.dir/src/cuda of two
checkouts): then each *.o under NEW is compared with the object at the same relative path under OLD. Build
single objects with CMake's flags: `ninja -C build -j1 CMakeFiles/msa.dir/src/cuda/decode/run.cu.o`.
  -m OLD=NEW  a folder renamed between the builds: -m paged/=decode/ compares NEW's decode/x.cu.o with OLD's
              paged/x.cu.o (-m =ops/: NEW's ops/x.cu.o with OLD's x.cu.o).
  -r OLD=NEW  text replaced in OLD's dump, for namespaces renamed in the mangled kernel names
              (-r 4cuda5paged=4cuda6decode). The path hash of anonymous namespaces is always ignored.
  -v          a diff of each kernel that differs.
Kernels are matched by (arch, name); instruction text and encodings must match exactly. One line per object;
exit status 1 when a kernel differs or exists on one side only. Needs cuobjdump and nvdisasm on PATH (or in
$CUDA_HOME/bin); where the toolkit lacks them, the PyPI packages nvidia-cuda-cuobjdump and
nvidia-cuda-nvdisasm carry them (nvidia/cu13/bin).
"""
import argparse
import difflib
import os
import re
import shutil
import subprocess
import sys


CUOBJDUMP = shutil.which("cuobjdump") or os.path.join(os.environ.get("CUDA_HOME", "/usr/local/cuda"), "bin", "cuobjdump")


def kernels(obj, renames):
    """{(arch, name): [instruction lines]} of an object, or None when it has no device code."""
    run = subprocess.run([CUOBJDUMP, "-sass", obj], capture_output=True, text=True)
    if run.returncode != 0 or "Function :" not in run.stdout:
        return None
    # Anonymous namespaces are mangled with a hash of the source path, which moves with the file.
    text = re.sub(r"_GLOBAL__N__\w*?_cu_[0-9a-f]{8}", "_GLOBAL__N_", run.stdout)
    for old, new in renames:
        text = text.replace(old, new)
    out, arch, key = {}, None, None
    for line in text.splitlines():
        if line.startswith("Fatbin"):  # the next embedded cubin's header (arch, source path) follows
            key = None
            continue
        m = re.match(r"\s*code for (sm_\w+)", line)
        if m:
            arch, key = m.group(1), None
            continue
        m = re.match(r"\s*Function : (\S+)", line)
        if m:
            key = (arch, m.group(1))
            out[key] = []
            continue
        if key and line.strip():
            out[key].append(re.sub(r"\s+", " ", line.strip()))
    return out


def compare(old_obj, new_obj, label, renames, verbose):
    old, new = kernels(old_obj, renames), kernels(new_obj, [])
    if new is None and old is None:
        print(f"{label}: no kernels")
        return True
    if old is None or new is None:
        print(f"{label}: device code on one side only")
        return False
    differ = sorted(k for k in old.keys() & new.keys() if old[k] != new[k])
    only_old, only_new = sorted(old.keys() - new.keys()), sorted(new.keys() - old.keys())
    if not (differ or only_old or only_new):
        print(f"{label}: identical ({len(new)} kernels)")
        return True
    print(f"{label}: {len(differ)} of {len(new)} kernels differ, {len(only_old)} only in OLD, {len(only_new)} only in NEW")
    for k in differ:
        d = list(difflib.unified_diff(old[k], new[k], lineterm="", n=2))
        print(f"  differs: {k[0]} {k[1]} ({len(old[k])} -> {len(new[k])} lines, "
              f"{sum(1 for x in d if x[:1] in '+-') - 2} changed)")
        if verbose:
            print("\n".join("    " + x for x in d[2:]))
    for k in only_old:
        print(f"  only in OLD: {k[0]} {k[1]}")
    for k in only_new:
        print(f"  only in NEW: {k[0]} {k[1]}")
    return False


def pair(arg):
    if "=" not in arg:
        raise argparse.ArgumentTypeError("expected OLD=NEW")
    return tuple(arg.split("=", 1))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("old")
    ap.add_argument("new")
    ap.add_argument("-r", "--rename", type=pair, action="append", default=[], help="OLD=NEW text in OLD's dump")
    ap.add_argument("-m", "--map", type=pair, action="append", default=[], help="OLD=NEW relative path prefix")
    ap.add_argument("-v", "--verbose", action="store_true")
    a = ap.parse_args()
    if os.path.isfile(a.new):
        return 0 if compare(a.old, a.new, a.new, a.rename, a.verbose) else 1
    ok = True
    for root, _, files in sorted(os.walk(a.new)):
        for f in sorted(files):
            if not f.endswith(".o"):
                continue
            rel = os.path.relpath(os.path.join(root, f), a.new)
            old_rel = rel
            for old_prefix, new_prefix in a.map:
                old_rel = old_rel.replace(new_prefix, old_prefix, 1) if new_prefix in old_rel else old_rel
            old_path = os.path.join(a.old, old_rel)
            if not os.path.exists(old_path):
                print(f"{rel}: no {old_rel} in OLD")
                ok = False
                continue
            ok &= compare(old_path, os.path.join(root, f), rel, a.rename, a.verbose)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
