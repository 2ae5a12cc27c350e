"""Training from a Jupyter notebook on a real IPython kernel (docs/getting_started.ipynb): an env
class, a wrapper, a factory, an extractor and a schedule defined in cells reach the spawned
workers (by value: they cannot import a kernel's __main__), a second train() in a later cell
resumes, a file saved there loads in another process, and interrupting the kernel stops training
with the model still usable."""
import pathlib
import shutil
import time

import nbformat
import psutil
import pytest
from jupyter_client.manager import start_new_kernel
from nbclient import NotebookClient
from test_multiprocess import multiprocessing_helper

from asyncrl import APPO
from asyncrl.fileio import make_scratch_dir, orphaned_scratch_dirs

DOCS_NOTEBOOK = pathlib.Path(__file__).parent.parent / "docs" / "getting_started.ipynb"


def notebook_definitions() -> str:
    """The notebook's classes, factory and model (its first two code cells, without training)."""
    cells = [c.source for c in nbformat.read(DOCS_NOTEBOOK, as_version=4).cells
             if c.cell_type == "code"]
    return cells[0] + "\n" + cells[1].split("model.train")[0]


def removed_by_the_next_start(before: set, kernel_pid: int = None) -> None:
    """ipykernel's shutdown waits for its children to go, multiprocessing's resource tracker among
    them, which ignores SIGTERM: past jupyter_client's 5 s the kernel is killed before exit
    handlers run, and a closed model's scratch folder stays (at most the kernel's). The next
    asyncrl start removes it."""
    left = set(orphaned_scratch_dirs()) - before
    assert len(left) <= 1 and all(kernel_pid is None or f"-{kernel_pid}-" in d for d in left), left
    shutil.rmtree(make_scratch_dir())
    assert not set(orphaned_scratch_dirs()) - before


def worker_pids(kernel_pid: int) -> list:
    """The kernel's child processes but multiprocessing's resource tracker and fork server (one
    each per process that started components, living as long as it)."""
    try:
        children = psutil.Process(kernel_pid).children(recursive=True)
        return [p.pid for p in children if not multiprocessing_helper(p, kernel_pid)]
    except psutil.NoSuchProcess:
        return []


@pytest.mark.timeout(240)
def test_getting_started_notebook_runs_top_to_bottom(tmp_path):
    """docs/getting_started.ipynb as shipped: its cells define env, wrapper, factory, extractor
    and schedule, train, resume in a later cell, plot inline, save and export."""
    before = set(orphaned_scratch_dirs())
    nb = nbformat.read(DOCS_NOTEBOOK, as_version=4)
    client = NotebookClient(nb, timeout=180, kernel_name="python3",
                            resources={"metadata": {"path": str(tmp_path)}})
    client.execute()
    removed_by_the_next_start(before)
    out = "".join(o.get("text", "") for cell in nb.cells for o in cell.get("outputs", []))
    assert "RETURN" in out
    plot_cell = next(c for c in nb.cells if c.source == "model.plot()")
    assert any("image/png" in o.get("data", {}) for o in plot_cell.outputs), plot_cell.outputs
    # The file names the notebook's env and extractor classes, stored by value: it loads here.
    loaded = APPO.load(tmp_path / "go_right.pt", device="cpu")
    assert loaded.num_timesteps >= 5000
    mean, _ = loaded.evaluate(3)
    assert mean == pytest.approx(float(out.split("RETURN")[1].split()[0]))
    assert (tmp_path / "go_right.pt.ts").stat().st_size > 0


def _run(client, code: str, timeout: float = 120) -> dict:
    """Execute ``code`` as a cell run by hand: its execute_reply content. ipykernel aborts what
    arrives just after an error (here the interrupt), as Jupyter's queued cells: then again."""
    for _ in range(5):
        msg_id = client.execute(code)
        reply = client.get_shell_msg(timeout=timeout)
        while reply["parent_header"].get("msg_id") != msg_id:
            reply = client.get_shell_msg(timeout=timeout)
        if reply["content"]["status"] != "aborted":
            return reply["content"]
        time.sleep(0.5)
    return reply["content"]


@pytest.mark.timeout(240)
def test_interrupting_the_kernel_stops_training_and_keeps_the_model(tmp_path):
    before = set(orphaned_scratch_dirs())
    km, client = start_new_kernel(kernel_name="python3", cwd=str(tmp_path))
    try:
        kernel_pid = km.provisioner.process.pid
        assert _run(client, notebook_definitions())["status"] == "ok"
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
    removed_by_the_next_start(before, kernel_pid)
