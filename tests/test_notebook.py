"""Training from a Jupyter notebook, on a real IPython kernel: an env class, a wrapper, a factory,
an extractor and a schedule defined in cells reach the spawned workers (by value: they cannot
import a kernel's __main__), a second train() in a later cell resumes, a file saved there loads
in another process, and interrupting the kernel stops training with the model still usable."""
import shutil
import time

import nbformat
import psutil
import pytest
from jupyter_client.manager import start_new_kernel
from nbclient import NotebookClient

from asyncrl import APPO
from asyncrl.fileio import make_scratch_dir, orphaned_scratch_dirs

DEFINITIONS = '''
import gymnasium as gym, numpy as np
from torch import nn
from asyncrl import APPO

class GoRight(gym.Env):
    """Reward 1 for action 1, episodes of 10 steps."""
    observation_space = gym.spaces.Box(-1, 1, (3,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return np.ones(3, np.float32), {}

    def step(self, action):
        self.t += 1
        return np.ones(3, np.float32), float(action == 1), False, self.t >= 10, {}

class Halve(gym.ObservationWrapper):
    def observation(self, obs):
        return obs * 0.5

def make_env():
    return Halve(GoRight())

class Extractor(nn.Module):
    def __init__(self, observation_space, features_dim=16):
        super().__init__()
        self.features_dim = features_dim
        self.net = nn.Sequential(nn.Flatten(), nn.Linear(3, features_dim), nn.Tanh())

    def forward(self, obs):
        return self.net(obs)

model = APPO(make_env, policy_kwargs=dict(features_extractor_class=Extractor), num_workers=2,
             num_envs_per_worker=2, rollout=16, batch_size=64, minibatch_size=32, device="cpu",
             seed=0, verbose=0, learning_rate=lambda progress: 1e-3 * max(progress, 0.1))
'''


def worker_pids(kernel_pid: int) -> list:
    """The kernel's child processes but multiprocessing's resource tracker (one per process that
    used spawn, living as long as it)."""
    try:
        children = psutil.Process(kernel_pid).children(recursive=True)
        return [p.pid for p in children if "resource_tracker" not in " ".join(p.cmdline())]
    except psutil.NoSuchProcess:
        return []


@pytest.mark.timeout(240)
def test_notebook_cells_train_resume_and_save(tmp_path):
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(DEFINITIONS),
                nbformat.v4.new_code_cell("model.train(3000)\nfirst = model.num_timesteps"),
                nbformat.v4.new_code_cell("model.train(2000)\n"
                                          "assert model.num_timesteps >= first + 2000\n"
                                          "mean, _ = model.evaluate(3)\n"
                                          "model.save('from_notebook.pt')\nmodel.close()\n"
                                          "print('RETURN', mean)")]
    client = NotebookClient(nb, timeout=180, kernel_name="python3",
                            resources={"metadata": {"path": str(tmp_path)}})
    client.execute()
    out = "".join(o.get("text", "") for o in nb.cells[2].outputs)
    assert "RETURN" in out
    # The file names the notebook's env and extractor classes, stored by value: it loads here.
    loaded = APPO.load(tmp_path / "from_notebook.pt", device="cpu")
    assert loaded.num_timesteps >= 5000
    mean, _ = loaded.evaluate(3)
    assert mean == pytest.approx(float(out.split("RETURN")[1]))


def _run(client, code: str, timeout: float = 120) -> dict:
    """Execute ``code``; its execute_reply content, and stdout."""
    msg_id = client.execute(code)
    reply = client.get_shell_msg(timeout=timeout)
    while reply["parent_header"].get("msg_id") != msg_id:
        reply = client.get_shell_msg(timeout=timeout)
    return reply["content"]


@pytest.mark.timeout(240)
def test_interrupting_the_kernel_stops_training_and_keeps_the_model(tmp_path):
    before = set(orphaned_scratch_dirs())
    km, client = start_new_kernel(kernel_name="python3", cwd=str(tmp_path))
    try:
        kernel_pid = km.provisioner.process.pid
        assert _run(client, DEFINITIONS)["status"] == "ok"
        msg_id = client.execute("model.train(10 ** 9)")
        deadline = time.monotonic() + 60
        while len(worker_pids(kernel_pid)) < 4 and time.monotonic() < deadline:
            time.sleep(0.5)  # rollout, policy and learner processes up
        time.sleep(5)        # and training
        km.interrupt_kernel()
        reply = client.get_shell_msg(timeout=120)
        while reply["parent_header"].get("msg_id") != msg_id:
            reply = client.get_shell_msg(timeout=120)
        assert reply["content"]["status"] == "error"
        assert reply["content"]["ename"] == "KeyboardInterrupt"
        # usable afterwards: acts, and a later cell trains on from where it stopped
        check = _run(client, "steps = model.num_timesteps\n"
                             "assert steps > 0\n"
                             "assert model.predict(np.ones(3, np.float32))[0] in (0, 1)\n"
                             "model.train(1000)\n"
                             "assert model.num_timesteps >= steps + 1000\n"
                             "model.close()")
        assert check["status"] == "ok", check.get("traceback")
        deadline = time.monotonic() + 20
        while worker_pids(kernel_pid) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert worker_pids(kernel_pid) == []
    finally:
        client.stop_channels()
        km.shutdown_kernel()  # as Jupyter does: a shutdown request, then a kill after 5 s
    # ipykernel's shutdown waits for its children to go, multiprocessing's resource tracker among
    # them, which ignores SIGTERM: past jupyter_client's 5 s the kernel is killed before exit
    # handlers run, and the model's scratch folder stays. The next asyncrl start removes it.
    left = set(orphaned_scratch_dirs()) - before
    assert all(f"-{kernel_pid}-" in d for d in left), left
    shutil.rmtree(make_scratch_dir())
    assert not set(orphaned_scratch_dirs()) - before
