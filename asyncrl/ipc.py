"""Inter-process pieces that survive a SIGKILLed rollout worker.

faster-fifo queues are ring buffers guarded by a process-shared pthread mutex and condition
variables, neither robust to a process dying inside them:

- A process killed inside ``put``/``get`` (microseconds per call, but hundreds of calls a second)
  leaves the mutex locked, and every other process then blocks on that queue for good, Ctrl-C
  included (the wait is in C). The main process watches its children and, when one dies,
  unlocks every queue mutex whose owner is that process (``release_locks_of_dead``). This reads
  glibc's mutex layout (``__lock``, ``__count``, ``__owner``, ... at the start of
  ``pthread_mutex_t``) inside faster-fifo's ``Queue`` object (six size_t fields, the mutex
  attribute, then the mutex); ``supported()`` verifies both on a live queue once per process
  (lock it, read the owner, unlock). Where they do not match, nothing is touched.
- A process killed while *waiting* on a condition variable leaves glibc's condvar expecting it:
  the next ``pthread_cond_signal`` waits for it for ever (``__condvar_quiesce_and_switch_g1``),
  and one killed *inside* ``pthread_cond_signal`` can leave the condvar's internal lock taken.
  So no condition variable is used between a rollout worker and anyone: the "actions ready"
  messages to a worker go through a pipe of its own (``BytePipe``, a kernel object: a dead
  reader blocks no writer), free slots are taken without blocking, and the readers of the
  queues rollout workers write to (policy requests, full slots, reports) sleep on a bell pipe
  (``BelledQueue``) instead of in the queue, so faster-fifo never signals those condvars.
"""
from __future__ import annotations

import ctypes
import multiprocessing
import os
import queue
import select
import threading
from typing import Iterable, List, Optional

_MUTEX_OFFSET = 56     # 6 x size_t, pthread_mutexattr_t (4 bytes), padding to 8
_OWNER_OFFSET = 8      # int __lock; unsigned __count; int __owner
_PSHARED_KIND = 128    # PTHREAD_MUTEX_PSHARED_BIT in __kind (offset 16) of a pshared mutex
_supported: Optional[bool] = None
_libc = None


def _mutex_addr(q) -> int:
    return ctypes.addressof(q.queue_obj_buffer) + _MUTEX_OFFSET


def _int_at(addr: int) -> int:
    return ctypes.c_int.from_address(addr).value


def supported() -> bool:
    """Whether this platform's mutex and faster-fifo's queue have the layout read here."""
    global _supported, _libc
    if _supported is None:
        _supported = False
        try:
            import faster_fifo
            libc = ctypes.CDLL("libc.so.6", use_errno=True)
            q = faster_fifo.Queue(1000, maxsize=7)
            head = (ctypes.c_size_t * 2).from_buffer(q.queue_obj_buffer)
            addr = _mutex_addr(q)
            if (tuple(head) == (1000, 7) and len(q.queue_obj_buffer) >= _MUTEX_OFFSET + 40
                    and _int_at(addr + 16) & _PSHARED_KIND and _int_at(addr + _OWNER_OFFSET) == 0):
                if libc.pthread_mutex_lock(ctypes.c_void_p(addr)) == 0:
                    owner = _int_at(addr + _OWNER_OFFSET)
                    libc.pthread_mutex_unlock(ctypes.c_void_p(addr))
                    _supported = owner == threading.get_native_id()
                    _libc = libc
            q.close()
        except (OSError, AttributeError, TypeError, ValueError):
            pass
    return _supported


def owner(q) -> int:
    """The thread id holding ``q``'s lock, 0 when it is free (or when unsupported)."""
    return _int_at(_mutex_addr(q) + _OWNER_OFFSET) if supported() else 0


def release_locks_of_dead(pid: int, queues: Iterable) -> List[int]:
    """Unlock every queue in ``queues`` whose lock is held by process ``pid`` (its main thread),
    which must be dead: a glibc normal mutex unlocks whoever calls. Returns the indices of the
    queues freed. The queue's ring buffer may hold a half-written message only if the process
    died inside the copy itself; the lock is the hazard that matters."""
    if not supported():
        return []
    freed = []
    for i, q in enumerate(queues):
        if owner(q) == pid:
            _libc.pthread_mutex_unlock(ctypes.c_void_p(_mutex_addr(q)))
            freed.append(i)
    return freed


SLOTS_FREED = 255  # the byte that wakes a rollout worker waiting for a free slot (actions
                   # ready: 2 x trained policy + group, see messages.ready_code)


class BytePipe:
    """Small integers, one byte each, through a pipe (a kernel object: a dead reader blocks no
    writer, a dead writer leaves no lock). A rollout worker's "actions ready" channel: codes
    (2 x trained policy + group index) from the policy workers, and ``SLOTS_FREED`` from
    whoever returns free slots; also the bell of a ``BelledQueue``. Both ends are non-blocking; the main process
    keeps them open, so a replacement worker reads the same pipe (after dropping what its
    predecessor left)."""

    def __init__(self):
        self.reader, self.writer = multiprocessing.Pipe(duplex=False)
        os.set_blocking(self.reader.fileno(), False)
        os.set_blocking(self.writer.fileno(), False)
        self._poll = None

    def __getstate__(self):
        return {**self.__dict__, "_poll": None}  # a poll object is per process

    def put_many(self, codes: List[int]) -> None:
        os.write(self.writer.fileno(), bytes(codes))  # 64 KiB of room: never full

    def ring(self) -> None:
        try:
            os.write(self.writer.fileno(), bytes([SLOTS_FREED]))
        except BlockingIOError:  # full of unread wake-ups (a dead reader): it is awake enough
            pass

    def get_many(self, block: bool = True, timeout: float = 0.0) -> List[int]:
        """The bytes written since the last call; ``queue.Empty`` when none came in time."""
        fd = self.reader.fileno()
        if block:
            if self._poll is None:  # poll, not select: file descriptors may be >= 1024
                self._poll = select.poll()
                self._poll.register(fd, select.POLLIN)
            if not self._poll.poll(timeout * 1000):
                raise queue.Empty
        try:
            data = os.read(fd, 4096)
        except BlockingIOError:
            raise queue.Empty from None
        return list(data)

    def drain(self) -> None:
        try:
            while self.get_many(block=False):
                pass
        except queue.Empty:
            pass

    def close(self) -> None:
        self.reader.close()
        self.writer.close()


class BelledQueue:
    """A faster-fifo queue whose consumer waits on a pipe instead of inside the queue: ``put``
    writes the message, then rings the bell (one byte); ``get_many`` takes what is there without
    blocking and otherwise sleeps on the bell. With nobody waiting in the queue's condition
    variable, faster-fifo never calls ``pthread_cond_signal`` on it, so a producer killed at
    any moment (a rollout worker) can at most leave the mutex locked, which the main process
    frees. A wake-up may find the queue empty (a message taken meanwhile): ``queue.Empty``,
    early; callers loop anyway."""

    def __init__(self, fifo):
        self.fifo, self.bell = fifo, BytePipe()

    def put(self, message, **kwargs) -> None:
        self.fifo.put(message, **kwargs)
        self.bell.ring()

    def put_many(self, messages, **kwargs) -> None:
        self.fifo.put_many(messages, **kwargs)
        self.bell.ring()

    def get_many(self, block: bool = True, timeout: float = 0.0, **kwargs) -> list:
        try:
            return self.fifo.get_many(block=False, **kwargs)
        except queue.Empty:
            if not block:
                raise
        self.bell.get_many(block=True, timeout=timeout)  # raises queue.Empty on time-out
        return self.fifo.get_many(block=False, **kwargs)

    def close(self) -> None:
        self.fifo.close()
        self.bell.close()
