import subprocess
import sys

import parallax as px


def test_version_matches_the_installed_library():
    # __version__ is the C++ library's (CMake's project version); the wheel's must agree with it
    from importlib.metadata import version

    assert px.__version__ == version("parallax")
    assert px.__version__.count(".") == 2


def test_import_in_a_fresh_interpreter_prints_the_version():
    out = subprocess.run([sys.executable, "-c", "import parallax as px; print(px.__version__)"],
                         capture_output=True, text=True, check=True)
    assert out.stdout.strip() == px.__version__


def test_error_hierarchy():
    assert issubclass(px.Error, RuntimeError)
    assert issubclass(px.UserError, px.Error) and issubclass(px.UserError, ValueError)
    assert issubclass(px.IoError, px.Error) and issubclass(px.IoError, OSError)
    assert issubclass(px.InternalError, px.Error)


def test_the_extension_holds_the_library_and_lists_its_system_libraries(tmp_path):
    # The library is linked into parallax/_core (no RPATH into a build tree or prefix); what it
    # needs from the system is listed with each library's Debian package.
    import json

    from parallax import _core, _native

    dynamic = subprocess.run(["readelf", "-d", _core.__file__], capture_output=True, text=True, check=True).stdout
    assert "RPATH" not in dynamic and "RUNPATH" not in dynamic
    assert "libparallax" not in dynamic
    libs = {e["soname"]: e["package"] for e in _native.system_libraries()}
    dnnl = [p for s, p in libs.items() if s.startswith("libdnnl.so")]
    assert dnnl and dnnl[0].startswith("libdnnl"), libs
    assert "libc.so.6" not in libs and _native.missing_libraries() == []
    listing = tmp_path / "libs.json"
    listing.write_text(json.dumps([{"soname": "libpx_not_here.so.7", "package": "libpx-not-here7"},
                                   {"soname": "libm.so.6", "package": "libc6"},
                                   {"soname": "libpx_unknown.so.1", "package": None}]))
    missing = _native.missing_libraries(listing)
    assert [m["soname"] for m in missing] == ["libpx_not_here.so.7", "libpx_unknown.so.1"]
    message = _native.explain(missing)
    assert "libpx_not_here.so.7 (Debian package libpx-not-here7)" in message
    assert "libpx_unknown.so.1 (Debian package unknown)" in message
    assert "sudo apt-get install libpx-not-here7`" in message
