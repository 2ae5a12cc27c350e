"""The documentation site builds with warnings as errors: every page of the nav exists, every link
and anchor between pages resolves, and the API reference renders from the docstrings; the settings
the tuning guide tells users to pass are taken as written."""
import ast
import pathlib
import re
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


def _appo_calls(text: str) -> list:
    """The keyword arguments of every ``APPO(env, ...)`` call written in ``text`` (inline code
    or a code block, over several lines), evaluated as Python."""
    calls = []
    for start in (m.start() for m in re.finditer(r"APPO\(env", text)):
        depth, end = 0, start
        for end in range(start, len(text)):
            depth += {"(": 1, ")": -1}.get(text[end], 0)
            if depth == 0 and text[end] == ")":
                break
        call = ast.parse(text[start:end + 1], mode="eval").body
        calls.append({k.arg: eval(compile(ast.Expression(k.value), "<guide>", "eval"), {"dict": dict})
                      for k in call.keywords})
    return calls


@pytest.mark.timeout(120)
def test_the_tuning_guides_settings_are_accepted_and_applied_as_written():
    from asyncrl import APPO
    calls = _appo_calls((ROOT / "docs" / "guides" / "tuning.md").read_text())
    # APPO(env), the floor, the noise, the advantages, the discount, the zoo's Swimmer
    assert len(calls) >= 6, calls
    for kwargs in calls:
        # a continuous env takes every setting the guide names (a discrete one would not have
        # a Gaussian for log_std_init); an unknown or misspelt keyword raises ConfigError here
        with APPO("Pendulum-v1", device="cpu", verbose=0, **kwargs) as model:
            policy_kwargs = kwargs.pop("policy_kwargs", {})
            assert {k: getattr(model.config, k) for k in kwargs} == kwargs
            if "log_std_init" in policy_kwargs:
                log_std = model.policy.dist.log_std.detach()
                assert log_std.allclose(log_std.new_full(log_std.shape, policy_kwargs["log_std_init"]))
