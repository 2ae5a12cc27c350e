"""Atomic file writes (a crash or SIGKILL at any point leaves the previous file or the new one,
never a torn one) and the model's scratch directory (removed even when its process is killed)."""
from __future__ import annotations

import contextlib
import os
import pathlib
import re
import shutil
import tempfile
from typing import IO, Any, Iterator, NamedTuple, Union

import psutil

SCRATCH_PREFIX = "asyncrl-"
FORK_SERVER_OWNER = "asyncrl-owner-"  # + pid: the process that made multiprocessing's folder
_SCRATCH_NAME = re.compile(re.escape(SCRATCH_PREFIX) + r"(\d+)-\w+")


@contextlib.contextmanager
def atomic_open(path: Union[str, os.PathLike], mode: str = "w", durable: bool = True,
                **kwargs) -> Iterator[IO]:
    """Open a temporary file beside ``path``; when the block ends without an error, rename it
    over ``path``. ``durable``: fsync the file before and the directory after the rename, so a
    power loss cannot leave an empty file either (checkpoints; scratch files skip it)."""
    path = pathlib.Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, mode, **kwargs) as f:
            yield f
            if durable:
                f.flush()
                os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()
    if durable:
        dir_fd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)


def atomic_torch_save(obj: Any, path: Union[str, os.PathLike], durable: bool = True) -> None:
    import torch  # lazily: the command line's --help stays fast
    with atomic_open(path, "wb", durable=durable) as f:
        torch.save(obj, f)


def orphaned_scratch_dirs() -> list:
    """Scratch directories (``make_scratch_dir``) of this user's processes that no longer run."""
    found = []
    with contextlib.suppress(OSError):
        for entry in os.scandir(tempfile.gettempdir()):
            match = _SCRATCH_NAME.fullmatch(entry.name)
            if (match and not psutil.pid_exists(int(match.group(1)))
                    and entry.is_dir(follow_symlinks=False)
                    and entry.stat(follow_symlinks=False).st_uid == os.getuid()):
                found.append(entry.path)
    return found


def mark_fork_server_dir(path: str) -> None:
    """Name this process the owner of multiprocessing's temporary folder ``path`` (a file
    FORK_SERVER_OWNER + pid in it), unless one is named: a component inherits its main
    process's folder."""
    with contextlib.suppress(OSError):
        if not any(n.startswith(FORK_SERVER_OWNER) for n in os.listdir(path)):
            open(os.path.join(path, f"{FORK_SERVER_OWNER}{os.getpid()}"), "w").close()


def stale_fork_server_dirs() -> list:
    """multiprocessing's temporary folders (``pymp-*``) of this user that an asyncrl process
    owned (``mark_fork_server_dir``) and that hold nothing else but fork server sockets no
    process has bound any more, their owner gone: left by a process killed while it had a fork
    server (a SIGKILL, a notebook kernel shut down) with no component alive to remove them. A
    folder whose owner runs is kept, though its fork server may have died (a SIGTERM to its
    process group) while the owner saves and will remove it; other programs' are not touched."""
    found = []
    with contextlib.suppress(OSError):
        with open("/proc/net/unix") as f:  # Linux: the paths of bound Unix sockets
            bound = {fields[7] for fields in map(str.split, f) if len(fields) >= 8}
        for entry in os.scandir(tempfile.gettempdir()):
            if not (entry.name.startswith("pymp-") and entry.is_dir(follow_symlinks=False)
                    and entry.stat(follow_symlinks=False).st_uid == os.getuid()):
                continue
            names = os.listdir(entry.path)
            owners = [n[len(FORK_SERVER_OWNER):] for n in names if n.startswith(FORK_SERVER_OWNER)]
            if (len(owners) == 1 and owners[0].isdigit() and not psutil.pid_exists(int(owners[0]))
                    and all(n.startswith(FORK_SERVER_OWNER) or (n.startswith("listener-") and
                            os.path.join(entry.path, n) not in bound) for n in names)):
                found.append(entry.path)
    return found


def make_scratch_dir() -> str:
    """A private temporary directory for one model's scratch files, named after this process.
    Directories left by processes that no longer run (SIGKILLed before they could remove theirs,
    and whose workers could not either) are removed first, and so are stale fork-server folders."""
    for path in orphaned_scratch_dirs() + stale_fork_server_dirs():
        shutil.rmtree(path, ignore_errors=True)
    return tempfile.mkdtemp(prefix=f"{SCRATCH_PREFIX}{os.getpid()}-")


class PolicyFiles(NamedTuple):
    """A trained policy's scratch folder and its files: Adam's state and the learner's RNG (its
    learner writes them at every pause, the facade reads them to save), and the snapshot a
    learner writes when asked mid-run."""
    folder: str

    @classmethod
    def of(cls, scratch_dir: str, k: int, policy_id: str) -> "PolicyFiles":
        """The ``k``-th trained policy's, named after its id (made a safe file name; the index
        keeps two ids that read alike apart)."""
        return cls(os.path.join(scratch_dir, f"{k}-" + re.sub(r"[^A-Za-z0-9_.-]", "_", policy_id)[:64]))

    @property
    def optimizer(self) -> str:
        return os.path.join(self.folder, "optimizer.pt")

    @property
    def rng(self) -> str:
        return os.path.join(self.folder, "rng.pt")

    @property
    def snapshot(self) -> str:
        return os.path.join(self.folder, "snapshot.pt")
