"""The training engine: one loop that every method drives through its strategy hooks: a
task's phases (planned by the size rule, :func:`~espn.training.plan.plan_phase`), each phase's epochs, each epoch's
optimizer steps (:meth:`Engine._step`) with the phase's prune events after the steps they
follow; where exact, a phase trains a slim copy (:class:`_SlimCopy`)."""

from __future__ import annotations

import time
from dataclasses import dataclass, replace
from functools import partial
from inspect import signature
from itertools import accumulate
from typing import Any

import torch
from torch import Tensor

from espn.data.tasks import Task
from espn.methods.base import Phase, Strategy
from espn.settings.training import SETTING_NAMES, OptimizerSettings, TrainingSettings, default
from espn.supernet.layers import UnitModule
from espn.supernet.pretrained import adopt_pretrained
from espn.supernet.supernet import Supernet
from espn.training.callbacks import (
    CallbackList,
    EpochEnd,
    EpochStart,
    PhasePlan,
    StepEnd,
    TrainStart,
)
from espn.training.capacity import TrainingStopped, check_capacity
from espn.training.compile import StepCompiler
from espn.training.distributed import Ranks, recalibrate, shard_count, sharded_step
from espn.training.optim import FrozenGuard, TaskOptimizer
from espn.training.plan import (
    TaskLog,
    TaskProgress,
    plan_phase,
    prune_points,
    reference_batches,
)
from espn.training.rejection import WEIGHT, not_mine, rejection_loss
from espn.training.slim_step import SlimPhase, slim_phase_applies, slim_prune_pays


@dataclass
class _Training:
    """A task in training, as the phase loop walks it: ``at`` is where it stands (moved on
    after every step, epoch and phase; an epoch's end reports a copy of it)."""

    task: Task
    index: int
    optimizer: TaskOptimizer
    guard: FrozenGuard
    phases: list[Phase]
    plans: list[PhasePlan]
    at: TaskProgress
    #: optimizer steps of the task before each phase, and in all (the last entry)
    before: list[int]
    start: float
    loss: Tensor
    graphs: int

    def done(self) -> int:
        """The task's optimizer steps so far."""
        return self.before[self.at.phase] + self.at.step


class _SlimCopy:
    """The slim copy phase ``p`` trains where the run allows it and the copy is exact and
    narrower (see :mod:`espn.training.slim_step`). Built for the step that needs it; written
    back (:meth:`sync`) before a prune event, at the phase's end and for a checkpoint."""

    def __init__(self, engine: Engine, t: _Training, p: int, points: list[int]) -> None:
        self.engine, self.t, self.p, self.points = engine, t, p, points
        self.slim: SlimPhase | None = None
        self.built = self.dirty = False

    def parts(self) -> tuple[TaskOptimizer, FrozenGuard, Supernet | None]:
        """What the next step trains: the copy's optimizer, guard and net, or the task's
        and the supernet."""
        if not self.built:
            self.slim, self.built = self._build(), True
        self.dirty = self.slim is not None
        return (self.t.optimizer, self.t.guard, None) if self.slim is None else self.slim.parts()

    def _build(self) -> SlimPhase | None:
        engine, t, points, done = self.engine, self.t, self.points, self.t.at.prunes_done
        if not (engine.slim_training and slim_phase_applies(engine.strategy, t.phases, self.p)):
            return None
        if points:  # the steps to the next prune event (the same wherever a run resumes)
            end = points[done] if done < len(points) else t.plans[self.p].steps
            steps = end - (points[done - 1] if done else 0)
            if engine.compiler is not None or not slim_prune_pays(
                engine.supernet, steps, engine.batch_size
            ):
                return None
        trainable = engine._trainable()
        return SlimPhase.build(engine.supernet, engine.optim, trainable, t.optimizer, self.slim)

    def sync(self) -> None:
        """Write what the copy trained since the last write-back into the supernet."""
        if self.slim is not None and self.dirty:
            self.slim.write_back(self.t.optimizer)
        self.dirty = False

    def position(self, here: TaskProgress) -> TaskProgress:
        """An epoch's :attr:`EpochEnd.position`, made when a callback reads it: ``here`` with
        the optimizer's state, the supernet first brought up to date."""
        self.sync()
        return replace(here, optimizer=self.t.optimizer.state_dict())

    def prune(self, step: int) -> None:
        """Run the phase's prune events due after ``step`` (the copy written back first; the
        next step builds a copy of the pruned supernet)."""
        at, points = self.t.at, self.points
        while at.prunes_done < len(points) and points[at.prunes_done] == step:
            self.sync()
            self.built = False
            at.prunes_done += 1
            self.engine._prune_event(at.prunes_done / len(points), self.t.optimizer)


class Engine:
    """Trains tasks one after another into a supernet with a given strategy: its weights
    with the optimizer of ``optim`` (the run's :class:`TrainingSettings`, or an optimizer's
    alone), in batches of ``batch_size``; :meth:`of` reads every setting from the run's."""

    def __init__(
        self,
        supernet: Supernet,
        strategy: Strategy,
        optim: OptimizerSettings,
        batch_size: int,
        seed: int = default("seed"),
        amp: bool = default("amp"),
        reference_size: int | None = None,
        compile: bool = default("compile"),
        slim_training: bool = default("slim_training"),
        task_agnostic: bool = default("task_agnostic"),
        shards: int | None = default("shards"),
    ) -> None:
        self.supernet = supernet
        #: train each task to reject its own shifted inputs (see espn.training.rejection)
        self.task_agnostic = task_agnostic
        self.strategy = strategy
        self.optim = optim
        self.batch_size = batch_size
        #: the size rule's reference data size (see :func:`plan_phase`; None: epochs as given)
        self.reference_size = reference_size
        #: fine-tune on a physically slimmed copy where exact (see :class:`_SlimCopy`)
        self.slim_training = slim_training
        self.generator = torch.Generator().manual_seed(seed)
        self.amp = amp
        self.device_type = next(supernet.parameters()).device.type
        self.amp_dtype = autocast_dtype(self.device_type)
        self.scaler = torch.amp.GradScaler(
            self.device_type, enabled=amp and self.amp_dtype == torch.float16
        )
        #: called after every step and epoch (see :mod:`espn.training.callbacks`), with
        #: :attr:`owner` (the learner driving this engine) as their ``learner``
        self.callbacks = CallbackList()
        self.owner: Any = None
        #: the compiled step's compiler (None: eager; see :mod:`espn.training.compile`)
        self.compiler = StepCompiler() if compile else None
        #: the data-parallel ranks training this run with it (None: this process alone; see
        #: :mod:`espn.training.distributed`)
        self.ranks: Ranks | None = None
        #: the slices a training step computes its batch in (None: the world size; see
        #: :func:`espn.training.distributed.sharded_step`)
        self.shards = shards
        strategy.attach(supernet)

    @classmethod
    def of(cls, supernet: Supernet, strategy: Strategy, settings: TrainingSettings) -> Engine:
        """The engine of a run's training ``settings``, the one object every setting of the
        engine (each keyword named like a setting) and of its optimizer is read from."""
        given = {n: getattr(settings, n) for n in signature(cls).parameters if n in SETTING_NAMES}
        given["reference_size"] = settings.floor_reference()
        return cls(supernet, strategy, settings, **given)

    def _trainable(self) -> list[torch.Tensor]:
        """Free weights (masked by the guard), heads, and the unit scales the method trains:
        affine ones (BatchNorm, ``--task-affine`` gates) if it trains them, the scale of a
        non-affine gate only as the saliency of a method that prunes units."""
        fixed = self.strategy.weights == "fixed"
        params: list[torch.Tensor] = [] if fixed else list(self.supernet.shared_parameters())
        for module in self.supernet.task_modules.values():
            if not isinstance(module, UnitModule):
                params += list(module.parameters())
            elif module.affine:
                params += list(module.parameters()) if self.strategy.train_unit_affine else []
            elif self.strategy.prunes_units:
                params.append(module.weight)
        return params

    def build_optimizer(self) -> TaskOptimizer:
        """The task's optimizers as the strategy's recipe asks: the run's for the weights,
        heads and unit scales; the method's own (:meth:`Strategy.own_optimizer`) for its own
        parameters, or the run's when it has none."""
        return TaskOptimizer(
            self.optim,
            self._trainable(),
            self.strategy.own_optimizer(),
            self.strategy.extra_parameters(),
        )

    def train_task(self, task: Task, index: int, resume: TaskProgress | None = None) -> TaskLog:
        """Train ``task`` as task number ``index`` and commit its sub-network: its phases in
        turn, each its epochs of optimizer steps with its prune events among them.

        The callbacks' ``on_epoch_end`` receive the :class:`TaskProgress` after every epoch
        (``EpochEnd.position``: the run directory checkpoints it).
        With ``resume``, training continues from that point: the caller has restored the
        working sub-network, the strategy's state and :attr:`generator` as they were then.
        """
        t = self._begin(task, index, resume)
        for p in range(t.at.phase, len(t.plans)):
            self._train_phase(t, p)
        self.callbacks.on_train_end(self.owner, index)
        return self._commit(t)

    def _begin(self, task: Task, index: int, resume: TaskProgress | None) -> _Training:
        """A task's start (or its resumption at ``resume``): its working sub-network, its
        optimizer, its phases' plans (see :func:`plan_phase`), the callbacks told."""
        sn, strategy = self.supernet, self.strategy
        if resume is None:
            sn.begin_task(task.n_classes)
            strategy.init_free_weights(sn, self.generator)
            strategy.begin_task(sn)
            check_capacity(strategy, task.name, index)
        optimizer = self.build_optimizer()
        guard = FrozenGuard(sn, restore=optimizer.decays)
        if resume is not None and resume.optimizer is not None:
            optimizer.load_state_dict(resume.optimizer)
        if resume is not None and strategy.zeroes_pruned:  # as after the last prune event
            self._zero_pruned(optimizer)
        at = replace(resume or TaskProgress(), optimizer=None)
        at.phases_run = list(at.phases_run)  # the resume point's stays as it was
        phases = strategy.phases()
        per_epoch = task.num_batches("train", self.batch_size)
        per_reference = reference_batches(self.reference_size, self.batch_size)
        plans = [plan_phase(p, per_epoch, per_reference) for p in phases]
        before = list(accumulate((q.steps for q in plans), initial=0))
        start = time.perf_counter() - at.seconds  # a resumed task counts its time before
        graphs = 0 if self.compiler is None else self.compiler.graphs
        t = _Training(task, index, optimizer, guard, phases, plans, at, before, start,
                      torch.tensor(at.loss), graphs)  # fmt: skip
        sn.train()
        if self.compiler is not None:
            self.compiler.start_task(sn.model, next(sn.parameters()).device)
        self.callbacks.on_train_start(
            self.owner,
            TrainStart(index, task.name, before[-1], t.done(), tuple(plans), len(task.train)),
        )
        return t

    def _train_phase(self, t: _Training, p: int) -> None:
        """Phase ``p`` from where ``t`` stands: its prune events at its start, then its
        epochs; ``t`` then stands at the next phase's start."""
        phase, plan = t.phases[p], t.plans[p]
        if self.strategy.skips(phase):
            self._end_phase(t, p, ran=False)
            return
        copy = _SlimCopy(self, t, p, prune_points(plan.steps, phase.prune_updates))
        if t.at.epoch == 0:
            copy.prune(0)
            if phase.free_only and plan.epochs > 0:
                self.supernet.set_weight_masks(
                    {n: ~layer.frozen for n, layer in self.supernet.layers.items()}
                )
        for epoch in range(t.at.epoch, plan.epochs):
            self.callbacks.on_epoch_start(
                self.owner, EpochStart(t.index, phase.name, epoch, plan.epochs)
            )
            self._train_epoch(t, p, epoch, copy)
            t.at.epochs_done += 1
            t.at.loss = float(t.loss)
            steps = t.done()
            if epoch + 1 == plan.epochs:
                copy.sync()
                if phase.free_only:  # back to the whole network
                    masks = self.supernet.weight_masks()
                    self.supernet.set_weight_masks(
                        {n: torch.ones_like(m) for n, m in masks.items()}
                    )
                self._end_phase(t, p)
            else:
                t.at.epoch = epoch + 1
            seconds = time.perf_counter() - t.start
            here = replace(t.at, phases_run=list(t.at.phases_run), seconds=seconds)
            locate = partial(copy.position, here)
            end = EpochEnd(
                t.index, phase.name, epoch, plan.epochs, steps, t.at.loss, seconds, locate
            )
            self.callbacks.on_epoch_end(self.owner, end)
        if plan.epochs == 0:
            self._end_phase(t, p)

    def _end_phase(self, t: _Training, p: int, ran: bool = True) -> None:
        """Record phase ``p`` as run (see :attr:`TaskLog.phases`) and stand at the next one."""
        t.at.phases_run.append(t.plans[p].record(ran, t.at.slim_steps))
        t.at = replace(t.at, phase=p + 1, epoch=0, step=0, prunes_done=0, slim_steps=0)

    def _train_epoch(self, t: _Training, p: int, epoch: int, copy: _SlimCopy) -> None:
        """One pass over the task's training data in phase ``p`` (the size rule's last one
        cut at the phase's step count), its prune events after the steps they follow; stop
        the task where a loss was not finite."""
        phase, plan, at = t.phases[p], t.plans[p], t.at
        finite = torch.ones((), dtype=torch.bool, device=next(self.supernet.parameters()).device)
        for x, y in t.task.batches("train", self.batch_size, True, self.generator):
            if at.step == plan.steps:
                break
            optimizer, guard, net = copy.parts()
            clock = (t.done(), t.before[-1])
            lr = optimizer.set_lr(phase, epoch, plan.epochs, at.step, plan.steps, clock)
            t.loss = self._step(optimizer, guard, phase, x, y, net)
            finite &= torch.isfinite(t.loss)  # no sync: read once per epoch
            at.step += 1
            at.slim_steps += net is not None
            self.callbacks.on_step_end(
                self.owner, StepEnd(t.index, phase.name, t.done(), t.loss, lr)
            )
            copy.prune(at.step)
        if not bool(finite):  # before the epoch is checkpointed: the last good one stays
            self.callbacks.on_train_end(self.owner, t.index)
            raise TrainingStopped(
                f"task {t.index} ({t.task.name}), {phase.name} phase, epoch "
                f"{epoch + 1}/{plan.epochs}: the training loss is not finite "
                f"(last {float(t.loss):g}); training diverged, so it stopped "
                f"(learning rate {self.optim.lr:g}: try a smaller --lr)"
            )

    def _commit(self, t: _Training) -> TaskLog:
        """Commit the trained task (its BatchNorm statistics recalibrated) and log it."""
        sn, task = self.supernet, t.task
        recalibrate(self.ranks, shard_count(self.shards, self.ranks), sn, task, self.batch_size)
        sn.eval()
        self.strategy.commit(sn, task)
        sn.zero_grad()  # the last step's gradients and fast-path tensors: freed
        for layer in sn.layers.values():
            layer.release()
        if self.ranks is not None:
            self.ranks.check_same(sn, f"task {t.index} ({task.name}) committed")
        seconds = time.perf_counter() - t.start
        per = seconds / max(t.at.epochs_done, 1)
        compiled = None if self.compiler is None else self.compiler.graphs - t.graphs
        return TaskLog(seconds, t.at.epochs_done, per, t.at.phases_run, compiled)

    def adopt_task(self, task: Task, tensors: dict[str, torch.Tensor]) -> TaskLog:
        """Commit pretrained ``tensors`` as ``task`` without training (``init_weights``): its
        non-zero weights become the task's (see :func:`adopt_pretrained`)."""
        start = time.perf_counter()
        adopt_pretrained(self.supernet, tensors, task.n_classes, self.strategy.weights)
        self.supernet.eval()
        return TaskLog(time.perf_counter() - start, 0, 0.0)

    def _prune_event(self, progress: float, optimizer: TaskOptimizer) -> None:
        """The strategy's prune step at ``progress``; then, where the method allows it
        (``Strategy.zeroes_pruned``), the pruned free weights and their optimizer state are
        zeroed, so that the steps after it skip the mask product (``Supernet.zero_pruned``)."""
        self.strategy.prune_step(self.supernet, progress)
        if self.strategy.zeroes_pruned:
            self._zero_pruned(optimizer)
        if self.ranks is not None:
            self.ranks.check_same(self.supernet, f"prune event at {progress:.0%} of a phase")

    def _zero_pruned(self, optimizer: TaskOptimizer) -> None:
        """Zero the pruned free weights and their state in ``optimizer`` (see
        ``Supernet.zero_pruned``)."""
        weights = optimizer.weights
        self.supernet.zero_pruned(None if weights is None else weights.state)

    def batch_loss(
        self, x: Tensor, y: Tensor, regularise: bool, net: Supernet | None = None
    ) -> tuple[Tensor, Tensor]:
        """The loss of a batch and the total the step differentiates (the loss plus the
        method's penalty where ``regularise``, plus its weight penalty) of ``net`` (default:
        the supernet; a slim phase's copy): the part of the step that ``--compile`` compiles."""
        net = self.supernet if net is None else net
        with torch.autocast(self.device_type, dtype=self.amp_dtype, enabled=self.amp):
            loss = self.strategy.loss(self.strategy.forward(net, x), y)
            total = loss
            if self.task_agnostic:
                total = total + WEIGHT * rejection_loss(self.strategy.forward(net, not_mine(x)))
            if regularise:
                penalty = self.strategy.penalty(net)
                if penalty is not None:
                    total = total + penalty
            weight_penalty = self.strategy.weight_penalty(net)
            if weight_penalty is not None:
                total = total + weight_penalty
        return loss, total

    def _step(
        self,
        optimizer: TaskOptimizer,
        guard: FrozenGuard,
        phase: Phase,
        x: torch.Tensor,
        y: torch.Tensor,
        net: Supernet | None = None,
    ) -> torch.Tensor:
        """One optimizer step of ``net`` (default: the supernet; a slim phase's copy)."""
        net = self.supernet if net is None else net
        optimizer.zero_grad()
        guard.begin_step()

        def backward(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
            if self.compiler is None:
                loss, total = self.batch_loss(x, y, phase.regularise, net)
            else:
                loss, total = self.compiler.run(self.batch_loss, x, y, phase.regularise, net)
            self.scaler.scale(total).backward()
            return loss

        params = [p for o in optimizer.optimizers for g in o.param_groups for p in g["params"]]
        count = shard_count(self.shards, self.ranks)  # summed over the slices, then masked
        loss = sharded_step(self.ranks, count, x, y, backward, params)
        guard.mask_gradients()
        # layers whose weight stays zero outside the mask through this step (see
        # MaskedLayer.keeps_zero): the next step's forward skips their mask product too
        zero = [layer for layer in net.layers.values() if layer.keeps_zero()]
        for opt in optimizer.optimizers:
            self.scaler.step(opt)  # skipped when the scaled gradients overflowed
        self.scaler.update()
        guard.restore()
        for layer in zero:
            layer.note_trained()
        self.strategy.after_step(net)
        return loss.detach()


def autocast_dtype(device_type: str) -> torch.dtype:
    """The dtype ``--amp`` autocasts to: bfloat16, which needs no loss scaling, unless the
    device is a GPU without it (float16 there, with loss scaling)."""
    if device_type == "cuda" and not torch.cuda.is_bf16_supported():
        return torch.float16
    return torch.bfloat16
