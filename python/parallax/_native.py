"""Loads the compiled module parallax._core. It holds the whole C++ library but links shared
system libraries (oneDNN, SentencePiece, ICU, CBC, Open MPI, cairo, ...); when one is missing on
this machine, the ImportError names every missing library and the Debian package that installs
it, from _system_libs.json (written at build time by python/system_libs.cmake)."""

import ctypes
import json
import pathlib


def system_libraries(listing=None):
    """[{"soname", "package"}]: the shared libraries the extension links directly."""
    path = pathlib.Path(listing) if listing else pathlib.Path(__file__).with_name("_system_libs.json")
    return json.loads(path.read_text()) if path.exists() else []


def missing_libraries(listing=None):
    """The entries of system_libraries() that this machine's dynamic loader cannot open."""
    missing = []
    for entry in system_libraries(listing):
        try:
            ctypes.CDLL(entry["soname"])
        except OSError:
            missing.append(entry)
    return missing


def explain(missing) -> str:
    """The message for an extension that failed to load because these libraries are missing."""
    names = ", ".join(f"{m['soname']} (Debian package {m['package'] or 'unknown'})" for m in missing)
    packages = sorted({m["package"] for m in missing if m["package"]})
    fix = f"install them with `sudo apt-get install {' '.join(packages)}`" if packages else "install them"
    return (f"parallax: the compiled module needs system libraries missing on this machine: {names}; "
            f"{fix} (or run scripts/install_deps.sh from the Parallax repository), then import again")


try:
    from . import _core
except ImportError as error:
    missing = missing_libraries()
    if not missing:
        raise
    raise ImportError(explain(missing)) from error
