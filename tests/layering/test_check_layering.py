"""scripts/check_layering.py passes on this tree and fails on a planted back-edge, cycle or stray folder.

Run by ctest (tests/CMakeLists.txt): python3 tests/layering/test_check_layering.py REPO_ROOT
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import Checks, append  # noqa: E402

ROOT = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "..", ".."))
checks = Checks(ROOT, os.path.join(ROOT, "scripts", "check_layering.py"))

checks.check("this tree", ROOT, True, "all downward")
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
    checks.check_planted(name, edit, False, text)
checks.finish("check_layering", 1 + len(cases))
