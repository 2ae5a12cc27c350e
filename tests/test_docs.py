"""The documentation site builds with warnings as errors: every page of the nav exists, every link
and anchor between pages resolves, and the API reference renders from the docstrings."""
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).parent.parent


@pytest.mark.timeout(120)
def test_docs_site_builds_strict(tmp_path):
    out = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-q",
                          "-f", str(ROOT / "mkdocs.yml"), "-d", str(tmp_path / "site")],
                         capture_output=True, text=True, timeout=100,
                         env={"NO_MKDOCS_2_WARNING": "1", "PATH": "/usr/bin:/bin",
                              "HOME": str(tmp_path)})
    assert out.returncode == 0, out.stdout + out.stderr
    assert (tmp_path / "site" / "api" / "index.html").read_text().count("export") > 0
    assert (tmp_path / "site" / "guides" / "export" / "index.html").exists()
