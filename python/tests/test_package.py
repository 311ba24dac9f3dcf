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
