"""What survives a killed component, piece by piece: the learner's slot audit (no slot is lost
or trained on twice, whatever the moment a rollout worker dies), published weights a learner
was killed while overwriting, and Adam's state handed to a replacement learner."""
import os
import queue
import signal

import pytest
import torch
import torch.multiprocessing as mp
from torch import nn

from asyncrl import Config
from asyncrl.buffers import (Ctl, SharedControl, SharedOptimizerState, SharedWeights, SlotState,
                             TrajectoryBuffers, Worker)
from asyncrl.fileio import PolicyFiles
from asyncrl.learner import Learner
from asyncrl.learner import make_optimizer as make_learner_optimizer
from asyncrl.messages import PolicyRequest
from asyncrl.runner import Queues
from test_shared_memory import VECTOR_SPEC

# Synchronous PPO: as many slots as a batch takes, none spare.
CFG = Config.from_kwargs(dict(num_workers=2, num_envs_per_worker=4, rollout=8, batch_size=64,
                              minibatch_size=32, algo="ppo"))
W = CFG.num_workers


class Graph:
    """The shared pieces of one process graph, and a learner over them (its slot logic only)."""

    def __init__(self):
        self.buffers = TrajectoryBuffers(CFG, VECTOR_SPEC)
        self.ctl, self.all_queues = SharedControl(1, W), Queues(CFG)
        self.queues = self.all_queues.policy[0]  # the one trained policy's
        self.learner = Learner(CFG, policy_spec=None, device="cpu", buffers=self.buffers,
                               weights=None, optimizer_state=None, shared_hparams=None, ctl=self.ctl,
                               queues=self.queues, files=PolicyFiles("unused"), serial=True)
        self.learner.map_slot_states()
        self.owner = self.buffers.slot_owner.numpy()

    def free_queue(self) -> list:
        try:
            return sorted(self.queues.free_slot.get_many(block=False))
        except queue.Empty:
            return []

    def kill(self, worker_idx: int) -> None:
        """What the main process does when it replaces a dead rollout worker."""
        worker = self.ctl.workers[worker_idx]
        worker[Worker.INCARNATION] += 1
        self.buffers.claiming[worker_idx] = 0
        worker[Worker.RECLAIMABLE] = worker[Worker.INCARNATION]
        self.ctl[Ctl.RECLAIM] += 1

    def close(self):
        self.all_queues.close()


@pytest.fixture
def graph():
    g = Graph()
    yield g
    g.close()


def test_requests_and_slot_indices_cross_their_queues_intact():
    """The per-step messages travel as packed integers (the codecs in messages), not pickles:
    every field arrives as sent, in order, values past 32 bits included."""
    queues = Queues(CFG)
    try:
        pq = queues.policy[0]
        sent = [PolicyRequest(1, 1, 17, 7, 2**40, 3), PolicyRequest(0, 0, 0, 0, 0, 0)]
        for request in sent:
            pq.policy_request[0].put(request)
        assert pq.policy_request[0].get_many(block=True, timeout=1.0) == sent
        pq.free_slot.put_many([3, 2**33])
        pq.full_slot.put(5)
        assert pq.free_slot.get_many(block=False) == [3, 2**33]
        assert pq.full_slot.get_many(block=True, timeout=1.0) == [5]
    finally:
        queues.close()


def test_sync_ppo_has_no_spare_slot():
    assert CFG.num_slots == CFG.slots_per_batch == 4


def test_a_worker_killed_before_queueing_a_full_slot_loses_nothing(graph):
    """Worker 0 (serial 0) marked slot 1 full and died before the put; worker 1 holds slots
    2 and 3; slot 0 was trained on and is free. The learner takes slot 1 as full: with no
    spare slot, a lost one would starve synchronous PPO until worker_timeout."""
    g, learner = graph, graph.learner
    g.owner[:] = [SlotState.FREE, SlotState.handing(0), 1, 1]
    g.queues.free_slot.put(0)
    g.kill(0)
    learner._take_back_slots()
    assert learner.pending == [1]
    assert g.owner[1] == SlotState.FREE
    assert g.free_queue() == [0]
    assert list(g.owner[2:]) == [1, 1]  # the live worker's slots stay where they are
    assert g.ctl[Ctl.SLOTS_RECLAIMED] == 1


def test_a_full_slot_queued_twice_is_trained_on_once(graph):
    """The dead worker did queue the slot the audit took: that message is dropped, also when it
    is read only after the slot went round again (trained on, freed, filled by another worker
    and queued full once more: then one of its two messages takes it)."""
    g, learner = graph, graph.learner
    g.owner[:] = [SlotState.handing(0), 1, 1, SlotState.FREE]
    g.queues.free_slot.put(3)
    g.queues.full_slot.put(0)
    g.kill(0)
    learner._take_back_slots()
    assert learner.pending == [0]
    learner.pending.clear()  # trained on, freed, claimed by worker 1 (serial 1), filled:
    g.owner[0] = SlotState.handing(1)
    g.queues.full_slot.put(0)
    learner._accept(g.queues.full_slot.get_many(block=False))
    assert learner.pending == [0]
    g.owner[1] = SlotState.handing(1)  # and a slot queued once is taken once, as always
    g.queues.full_slot.put(1)
    learner._accept(g.queues.full_slot.get_many(block=False))
    assert learner.pending == [0, 1]


def test_a_worker_killed_inside_a_claim_loses_no_slot(graph):
    """Worker 0 took slot 2 from the free queue and died before marking it: the slot is in no
    queue and has no owner. The audit finds it; the slot being filled by worker 0 goes back
    free too (its partial trajectory is dropped)."""
    g, learner = graph, graph.learner
    g.owner[:] = [0, SlotState.FREE, SlotState.FREE, 1]
    g.queues.free_slot.put(1)
    g.buffers.claiming[0] = 1
    g.kill(0)
    learner._take_back_slots()
    assert g.free_queue() == [0, 1, 2]
    assert learner.pending == [] and g.owner[3] == 1


def test_the_audit_waits_for_a_death_not_handled_yet(graph):
    """A worker inside a claim (a live one, or a dead one the main process has not replaced
    yet) may hold a slot taken from the queue: the audit is put off, nothing is freed twice."""
    g, learner = graph, graph.learner
    g.owner[:] = [SlotState.FREE, 1, 1, SlotState.FREE]
    g.queues.free_slot.put(0)
    g.buffers.claiming[0] = 1
    g.ctl[Ctl.RECLAIM] += 1
    learner._take_back_slots()
    assert learner.reclaim_seen != g.ctl[Ctl.RECLAIM]  # tried again at a later step
    assert g.free_queue() == [0]                         # slot 3 may be the claimer's
    g.kill(0)
    learner._take_back_slots()
    assert learner.reclaim_seen == g.ctl[Ctl.RECLAIM]
    assert g.free_queue() == [0, 3]


def test_a_replacement_learner_frees_the_slots_the_dead_one_held(graph):
    """Slots 0 and 1 were accepted by a learner that died training on them: the new learner's
    first audit puts them back, and leaves queued full slots to be read."""
    g = graph
    g.owner[:] = [SlotState.FREE, SlotState.FREE, SlotState.handing(1), 0]
    g.queues.full_slot.put(2)
    g.learner._take_back_slots()  # reclaim_seen starts at -1: a new learner audits at once
    assert g.free_queue() == [0, 1]
    g.learner._accept(g.queues.full_slot.get_many(block=False))
    assert g.learner.pending == [2]


def _die_while_publishing(weights):
    """Child: take the lock, overwrite half the spare copy, and be SIGKILLed mid-publish."""
    with weights._locked(10.0):
        spare = 1 - int(weights.meta[weights.CURRENT])
        weights.flat[spare, : weights.flat.shape[1] // 2] = float("nan")
        os.kill(os.getpid(), signal.SIGKILL)


def test_weights_survive_a_learner_killed_while_publishing():
    torch.manual_seed(0)
    model = nn.Linear(3, 2)
    weights = SharedWeights(model, version=7, env_steps=700)
    child = mp.get_context("spawn").Process(target=_die_while_publishing, args=(weights,))
    child.start()
    child.join(timeout=60)
    assert child.exitcode == -signal.SIGKILL
    assert not weights.lock.acquire(timeout=0.1)  # the dead child holds it
    assert weights.recover_from_death(child.pid)
    assert not weights.recover_from_death(child.pid)  # once
    other = nn.Linear(3, 2)
    assert weights.load(other, lock_timeout=1.0) == (7, 700)
    for p, q in zip(other.parameters(), model.parameters()):
        assert torch.equal(p, q)
    weights.publish(other, 8, 800)  # and publishing goes on
    assert weights.version == 8


def _adam_model() -> tuple:
    """A model with a channels-last convolution (the image encoders' layout) and a parameter
    that never has a gradient; a loss over the rest."""
    conv = nn.Conv2d(2, 3, 3).to(memory_format=torch.channels_last)
    net = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 2))
    model = nn.ModuleList([conv, net, nn.Linear(2, 2)])  # the last never has a gradient
    frames = torch.randn(5, 2, 6, 6).to(memory_format=torch.channels_last)
    return model, lambda: conv(frames).pow(2).mean() + net(torch.randn(16, 4)).pow(2).mean()


def _same_next_step(model: nn.Module, optimizer, replacement) -> None:
    """The next step of both optimizers, from the same weights and gradients, is the same."""
    used = [p for p in model.parameters() if p in optimizer.state]
    before = [p.detach().clone() for p in used]
    grads = [torch.randn_like(p) for p in used]  # in each parameter's layout, as autograd's
    results = []
    for opt in (optimizer, replacement):
        with torch.no_grad():
            for p, b in zip(used, before):
                p.copy_(b)
        for p, g in zip(used, grads):
            p.grad = g.clone()
        opt.step()
        results.append([p.detach().clone() for p in used])
    for a, b in zip(*results):
        assert torch.equal(a, b)


@pytest.mark.parametrize("fused", [True, False])
def test_adam_state_reaches_a_replacement_learner(fused):
    """Adam's moments and step counts come back whole, fused or not, each in its parameter's
    memory layout (the fused kernel walks memory in order: a channels-last weight given
    default-layout moments took other elements' moments on a CPU and failed on a GPU); a
    parameter that never had a gradient has no state, in the replacement either."""
    torch.manual_seed(0)
    cfg = Config()
    make_optimizer = make_learner_optimizer if fused else (
        lambda model, cfg: torch.optim.Adam(model.parameters(), foreach=False))
    model, loss = _adam_model()
    optimizer = make_optimizer(model, cfg)
    shared = SharedOptimizerState(model)
    shared.write(optimizer, version=1, epoch=0)  # no step taken yet: nothing to hand on
    assert (shared.tags == -1).all()
    for version in (1, 2, 3):
        loss().backward()
        optimizer.step()
        shared.write(optimizer, version, epoch=0)

    replacement = make_optimizer(model, cfg)
    assert not shared.read(replacement, version=3, epoch=1)  # the user replaced the optimizer
    assert not shared.read(replacement, version=1, epoch=0)  # overwritten: two copies are kept
    assert shared.read(replacement, version=3, epoch=0)
    assert len(replacement.state) == len(optimizer.state) == 6
    for p in optimizer.state:
        mine, theirs = optimizer.state[p], replacement.state[p]
        for key in ("exp_avg", "exp_avg_sq"):
            assert torch.equal(mine[key], theirs[key])
            assert theirs[key].stride() == p.stride()
        assert float(mine["step"]) == float(theirs["step"]) == 3
    _same_next_step(model, optimizer, replacement)


def test_a_learner_resumes_adam_from_a_file_in_the_default_layout(tmp_path):
    """An optimizer file whose moments are in the default layout (what the main process saves
    from the shared copy after a SIGTERM, or an older checkpoint) resumes the learner's fused
    Adam where it was: the next step is the step the original optimizer would take."""
    torch.manual_seed(0)
    model, loss = _adam_model()
    optimizer = make_learner_optimizer(model, Config())
    for _ in range(3):
        loss().backward()
        optimizer.step()
    state_dict = optimizer.state_dict()  # its inner dicts are the optimizer's own: copied
    state_dict["state"] = {i: {k: v.contiguous() if k.startswith("exp_avg") else v
                               for k, v in state.items()}
                           for i, state in state_dict["state"].items()}
    conv_weight = next(model.parameters())
    assert state_dict["state"][0]["exp_avg"].stride() != conv_weight.stride()  # default layout
    learner = Learner(CFG, policy_spec=None, device="cpu", buffers=None, weights=None,
                      optimizer_state=None, shared_hparams=None, ctl=None,
                      queues=Queues(CFG).policy[0], files=PolicyFiles(str(tmp_path)), serial=True)
    torch.save(state_dict, learner.files.optimizer)
    learner.optimizer = make_learner_optimizer(model, Config())
    learner._load_optimizer()
    _same_next_step(model, optimizer, learner.optimizer)
