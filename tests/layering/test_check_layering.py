"""scripts/check_layering.py passes on this tree and fails on a planted back-edge, cycle or stray folder.

Run by ctest (tests/CMakeLists.txt): python3 tests/layering/test_check_layering.py REPO_ROOT
"""
import os
import shutil
import subprocess
import sys
import tempfile

ROOT = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "..", ".."))
SCRIPT = os.path.join(ROOT, "scripts", "check_layering.py")
failures = []


def check(name, root, want_ok, want_text=""):
    r = subprocess.run([sys.executable, SCRIPT, "--root", root], capture_output=True, text=True)
    out = r.stdout + r.stderr
    if (r.returncode == 0) != want_ok or want_text not in out:
        failures.append(f"{name}: exit {r.returncode}, expected {'0' if want_ok else '1'}"
                        f"{' and ' + repr(want_text) if want_text else ''}; output:\n{out}")


def planted(edit):
    """A copy of src/ and include/ with `edit(root)` applied."""
    tmp = tempfile.mkdtemp(prefix="px_layering_")
    for d in ("src", "include"):
        shutil.copytree(os.path.join(ROOT, d), os.path.join(tmp, d))
    edit(tmp)
    return tmp


def append(path, line):
    def edit(root):
        with open(os.path.join(root, path), "a") as f:
            f.write("\n" + line + "\n")
    return edit


check("this tree", ROOT, True, "all downward")
cases = [
    ("a back-edge from ir to train", append("src/ir/graph.cc", '#include "train/steps.h"'), "ir (layer 2) includes train"),
    ("a public header of a low layer including a high one", append("include/parallax/graph.h", '#include "parallax/train.h"'),
     "ir (layer 2) includes train"),
    ("an edge up one layer", append("src/data/synthetic.cc", '#include "sharding/groups.h"'),
     "data (layer 9) includes sharding (layer 10), a layer above"),
    ("a relative include", append("src/runtime/plan.cc", '#include "../ir/primitive.h"'), "relative path"),
    ("a folder in no layer", lambda root: os.makedirs(os.path.join(root, "src", "gadgets")), "src/gadgets/ is in no layer"),
]
for name, edit, text in cases:
    tmp = planted(edit)
    try:
        check(name, tmp, False, text)
    finally:
        shutil.rmtree(tmp)

if failures:
    print("\n\n".join(failures))
    sys.exit(1)
print(f"check_layering: {1 + len(cases)} passed, 0 failed")
