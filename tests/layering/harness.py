"""Shared by the tests of the source checks (check_layering.py, check_primitive_names.py): run a
check on a tree, and copies of src/ and include/ with a planted edit."""
import os
import shutil
import subprocess
import sys
import tempfile


class Checks:
    def __init__(self, root, script, args=()):
        self.root, self.script, self.args, self.failures = root, script, list(args), []

    def check(self, name, root, want_ok, want_text=""):
        r = subprocess.run([sys.executable, self.script, "--root", root] + self.args, capture_output=True, text=True)
        out = r.stdout + r.stderr
        if (r.returncode == 0) != want_ok or want_text not in out:
            self.failures.append(f"{name}: exit {r.returncode}, expected {'0' if want_ok else '1'}"
                                 f"{' and ' + repr(want_text) if want_text else ''}; output:\n{out}")

    def planted(self, edit):
        """A copy of src/ and include/ with `edit(root)` applied; removed after the check."""
        tmp = tempfile.mkdtemp(prefix="px_check_")
        for d in ("src", "include"):
            shutil.copytree(os.path.join(self.root, d), os.path.join(tmp, d))
        edit(tmp)
        return tmp

    def check_planted(self, name, edit, want_ok, want_text=""):
        tmp = self.planted(edit)
        try:
            self.check(name, tmp, want_ok, want_text)
        finally:
            shutil.rmtree(tmp)

    def finish(self, what, count):
        if self.failures:
            print("\n\n".join(self.failures))
            sys.exit(1)
        print(f"{what}: {count} passed, 0 failed")


def append(path, line):
    def edit(root):
        with open(os.path.join(root, path), "a") as f:
            f.write("\n" + line + "\n")
    return edit
