"""How a script that trains ends: no traceback however a model is dropped, closed or left alive
at exit, and a script read from standard input is told to save it to a file (spawn cannot
import it again). Each test runs a real script in a fresh interpreter."""
import subprocess
import sys
import textwrap

import pytest

SMALL = dict(num_workers=1, num_envs_per_worker=2, rollout=16, batch_size=32, minibatch_size=32,
             device="cpu", verbose=0, seed=0)


def run_script(tmp_path, body: str, stdin: bool = False):
    script = textwrap.dedent(body)
    if stdin:
        return subprocess.run([sys.executable, "-"], input=script, capture_output=True, text=True,
                              timeout=120, cwd=tmp_path)
    path = tmp_path / "script.py"
    path.write_text(script)
    return subprocess.run([sys.executable, str(path)], capture_output=True, text=True, timeout=120,
                          cwd=tmp_path)


@pytest.mark.timeout(150)
def test_no_traceback_however_a_model_ends(tmp_path):
    """Dropped without close() (a function that trains and returns a score, called twice),
    close(), a with block, and a model still alive when the script ends: the learner used to
    print a FileNotFoundError traceback for the dropped and the surviving ones (the scratch
    directory was removed while it still saved Adam's state there)."""
    out = run_script(tmp_path, f"""
        from asyncrl import APPO
        KW = {SMALL!r}
        def score(seed):
            model = APPO("CartPole-v1", **dict(KW, seed=seed))
            model.train(64)
            return model.num_timesteps
        if __name__ == "__main__":
            print([score(s) for s in range(2)])
            closed = APPO("CartPole-v1", **KW)
            closed.train(64)
            closed.close()
            with APPO("CartPole-v1", **KW) as m:
                m.train(64)
            alive = APPO("CartPole-v1", **KW)
            alive.train(64)
            print("done")
        """)
    assert out.returncode == 0, out.stderr
    assert "Traceback" not in out.stderr and "Error" not in out.stderr, out.stderr
    assert out.stdout.split() == ["[64,", "64]", "done"]


@pytest.mark.timeout(60)
def test_script_from_standard_input_is_told_to_save_it_to_a_file(tmp_path):
    """Code under the main guard, read from standard input: spawn cannot import it again. It
    used to fail with "keep that code under if __name__ == '__main__'", which it was."""
    out = run_script(tmp_path, f"""
        from asyncrl import APPO
        if __name__ == "__main__":
            with APPO("CartPole-v1", **{SMALL!r}) as m:
                m.train(64)
        """, stdin=True)
    assert out.returncode != 0
    last = out.stderr.strip().splitlines()[-1]
    assert "standard input" in last and "Save the script to a file" in last, out.stderr
    assert "__name__" not in last and "exited unexpectedly" not in out.stderr
