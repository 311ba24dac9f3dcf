"""scripts/check_primitive_names.py passes on this tree and fails on a planted name comparison.

Run by ctest (tests/CMakeLists.txt): python3 tests/layering/test_check_primitive_names.py REPO_ROOT
[LIST_PRIMITIVES] (the program that prints the registered names: with it, comparisons however
spelt are planted too).
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import Checks, append  # noqa: E402

ROOT = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "..", ".."))
LIST = sys.argv[2] if len(sys.argv) > 2 else ""
checks = Checks(ROOT, os.path.join(ROOT, "scripts", "check_primitive_names.py"), ["--names-from", LIST] if LIST else [])

checks.check("this tree", ROOT, True, "no name comparisons")
cases = [
    ("a pass comparing a name", "src/runtime/schedule.cc", 'bool f(const Node& n) { return n.prim->name == "tanh"; }',
     "src/runtime/schedule.cc"),
    ("a name on the left", "src/memory/remat.cc", 'bool g(const Node& n) { return "dot_general" != n.prim->name; }',
     "compares a primitive's name"),
    ("a lookup by a literal name", "src/sharding/partitioner.cc", 'const auto* p = &get_primitive("slice");',
     "src/sharding/partitioner.cc"),
]
if LIST:
    cases += [
        ("a helper that returns the name", "src/sharding/recipes/plan.cc",
         'bool h(const Node& n) { return prim_name(n) == "take"; }', "src/sharding/recipes/plan.cc"),
        ("a copy of the name", "src/train/index_check.cc",
         'bool i(const std::string& p) { return "softmax_cross_entropy" == p; }', "compares a primitive's name"),
        ("a set of names", "src/runtime/order.cc",
         'const std::set<std::string> moves = {"reshape", "transpose"};', "src/runtime/order.cc"),
    ]
for name, path, line, text in cases:
    checks.check_planted(name, append(path, line), False, text)
# The owners may name their primitives.
checks.check_planted("a comparison in src/ops",
                     append("src/ops/shape.cc", 'bool k(const Node& n) { return n.prim->name == "reshape"; }'), True)
checks.finish("check_primitive_names", 2 + len(cases))
