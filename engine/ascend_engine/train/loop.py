"""The training loop: Megatron-core model, DDP, optimizer and pipeline schedule, one step per global batch."""
from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from ..config.train import TrainConfig
from ..device import Backend, all_reduce_host
from ..inplace import checkpointed, trained_a_step
from ..models.wrappers import unwrap
from ..parallel import ParallelInfo, destroy_parallel, init_parallel
from ..telemetry import Metrics, Progress, emit_event, preference_fields, say, started_up
from .logline import StepStats, flops_per_step, format_line
from .batches import micro_batches
from .goodput import GoodputClock, gather_objects
from .preemption import PreemptionWatch
from .stages import make_stage
from .moe_metrics import router_losses
from .numerics import SPIKE_STAGES, NumericFault, NumericsState, SkippedWindow, fault_reason, skip_past
from .tensorboard import open_tensorboard
from .trackers import status_records
from .validation import build_validation_data, is_due, run_validation, validation_enabled

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


@dataclass
class TrainResult:
    iterations: int
    losses: list[float]
    tokens_per_second: float
    seconds: float
    checkpoint: str | None
    preempted: bool = False  # stopped early on SIGTERM (after saving, when checkpoint.save is set)


class Trainer:
    """Builds everything for this rank and runs ``trainIters`` steps (collective on all ranks)."""

    def __init__(self, cfg: TrainConfig, backend: Backend, session=None):
        started = time.perf_counter()
        self.session = session  # in-process restarts (ascend_engine.inprocess): what outlives this trainer
        say("train", f"importing Megatron-core and setting up the {backend.name} device", started)
        backend.apply()  # before the first Megatron import
        from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig
        from megatron.core.distributed import finalize_model_grads
        from megatron.core.transformer.module import Float16Module

        from ..data.build import build_train_data
        from ..models.gpt import build_gpt_model
        from .optim import build_optimizer

        self.cfg, self.backend = cfg, backend
        t, p = cfg.training, cfg.parallel
        say("train", f"joining the process group: TP {p.tensorModelParallelSize} x PP {p.pipelineModelParallelSize} "
            f"x EP {p.expertModelParallelSize}", started)
        before = session.forming() if session else None
        self.info: ParallelInfo = init_parallel(backend, p.tensorModelParallelSize, p.pipelineModelParallelSize,
                                                t.seed, p.expertModelParallelSize, cfg.virtual_pipeline_size,
                                                store=session.pg_store() if session else None)
        if session:
            if session.memory_enabled:
                session.memory.join()  # its sockets too are the groups' (aborted with them)
            session.formed(before)
        restart = session.restart if session else None
        if restart is not None:
            restart["joinedAt"] = time.time()
        self.goodput = self._kept("goodput", lambda: GoodputClock(cfg.checkpoint.save))
        self.goodput.mark("joined")
        self.goodput.gather_agents(gather_objects)
        self.dtype = DTYPES[t.precision]
        self.stage = make_stage(cfg)
        say("train", "building the dataset index" if cfg.data.dataPath else
            "preparing synthetic data (no data.dataPath)", started)
        self.data = self._kept("data", lambda: build_train_data(cfg))  # the index outlives an in-process restart
        self.valid = self._kept("valid", lambda: build_validation_data(cfg)) if validation_enabled(cfg) else None
        ddp_config = DistributedDataParallelConfig(
            grad_reduce_in_fp32=True, overlap_grad_reduce=False,
            use_distributed_optimizer=p.useDistributedOptimizer)
        # One model chunk per virtual pipeline stage this rank holds (one chunk without VPP).
        self.chunks = []
        say("train", f"building the model: {cfg.model.numLayers} layers, hidden {cfg.model.hiddenSize}, {t.precision}",
            started)
        for vp_stage in range(cfg.virtual_pipeline_size) if cfg.virtual_pipeline_size else [None]:
            gpt = build_gpt_model(cfg.model, p, t.seqLength, self.dtype, t.recomputeGranularity, seed=t.seed,
                                  variable_seq_lengths=cfg.data.variableSeqLengths, token_positions=cfg.data.neatPack,
                                  vp_stage=vp_stage)
            if cfg.lora.enabled:
                from ..models.lora import add_lora

                add_lora(gpt, cfg.lora, t.seed, p.tensorModelParallelSize, self.info.tp_rank)
            gpt.to(backend.torch_device)
            module = Float16Module(gpt.config, gpt) if self.dtype != torch.float32 else gpt
            self.chunks.append(DistributedDataParallel(config=gpt.config, ddp_config=ddp_config, module=module))
        self.model = self.chunks[0]
        self.goodput.mark("built")
        config = unwrap(self.model).config  # the schedule reads its hooks from the first chunk's config
        self.optimizer, self.scheduler = build_optimizer(cfg, self.chunks, self.dtype)
        config.no_sync_func = [c.no_sync for c in self.chunks] if len(self.chunks) > 1 else self.model.no_sync
        config.finalize_model_grads_func = finalize_model_grads
        if self.dtype == torch.float16:
            config.grad_scale_func = self.optimizer.scale_loss
        self.iteration = 0
        self.consumed = 0
        self.step_first_sample = 0  # where the last step's global batch began (after any skipped window)
        self.numerics = NumericsState(keep=cfg.numerics.lossSpikeWindow)
        self.router_losses: dict[str, float] = {}
        self.last_checkpoint: int | None = None
        self.pending_save = None  # a CheckpointWrite whose files are still being written
        self.num_micro = t.globalBatchSize // (t.microBatchSize * self.info.dp)
        loaded = None
        if restart is not None:  # an in-process restart: the newest checkpoint from host memory when it can
            from ..checkpoint.training import load_from_memory

            session.gather_marks()
            loaded = load_from_memory(self, session.memory) if session.memory_enabled else None
            restart["fromMemory"] = loaded is not None
        if loaded is None and (cfg.checkpoint.load or cfg.lora.loraLoad):
            from ..checkpoint.training import load_training_checkpoint

            say("train", f"loading the checkpoint {cfg.checkpoint.load or cfg.lora.loraLoad}", started)
            loaded = load_training_checkpoint(self)
        if loaded is not None and self.info.rank == 0:
            print(f"loaded checkpoint {loaded}", flush=True)
        self.goodput.mark("loaded")
        self.goodput.loaded_iteration = self.iteration
        self.stage.setup(self)
        self.last_metrics: dict[str, float] = {}
        self.tensorboard = open_tensorboard(cfg.observability.tensorboardDir) if self.info.rank == 0 else None
        self.trackers = self._kept("trackers", lambda: self._open_trackers(backend)) \
            if self.info.rank == 0 and cfg.observability.trackers else None
        self.metrics: Metrics | None = None
        if self.info.rank == 0 and cfg.observability.metricsPort:
            self.metrics = self._kept("metrics", lambda: self._serve_metrics(cfg.observability.metricsPort))
            # Figures from the start, so the operator reads the series (still empty) and the run waits at its end
            # until the operator has the last points, however short the run.
            self.metrics.set(trainIters=t.trainIters, **self.goodput.figures())
            if session and restart is None:  # the attempt's in-process restarts so far (the operator's baseline)
                self.metrics.set(inProcessRestarts=session.generation)
            if self.numerics.rollbacks:  # a resumed run that has rolled back before
                self.metrics.set(**self.numerics.figures())
            if self.trackers:
                self.metrics.tracking = status_records(self.trackers.records)
        if restart is not None:
            restart["loadedIteration"] = self.iteration
            restart["highWater"] = max(self.goodput.high_water, self.goodput.prior_high_water)
            if self.info.rank == 0:
                emit_event("Warning", "RecoveredInProcess", session.summary(self.iteration))
        elif self.info.rank == 0 and (restarted := self.goodput.restart_summary()):
            emit_event("Warning", "RecoveredInPlace", restarted)
        self.flops = flops_per_step(
            cfg.model.numLayers, cfg.model.hiddenSize, cfg.model.active_ffn_hidden_size, cfg.model.numAttentionHeads,
            cfg.model.head_dim, cfg.model.num_query_groups, cfg.model.padded_vocab_size(p.tensorModelParallelSize),
            t.seqLength, t.globalBatchSize * self.stage.rows_per_sample, cfg.model.swiglu)
        self.peak = backend.peak_flops(self.dtype)
        self.vocab_size = cfg.model.padded_vocab_size(p.tensorModelParallelSize)
        say("train", f"first step (iteration {self.iteration + 1} of {t.trainIters})", started)

    def _kept(self, name: str, make):
        """``make()``, or what an earlier trainer of this process made (after an in-process restart)."""
        return self.session.keep(name, make) if self.session else make()

    @staticmethod
    def _serve_metrics(port: int) -> Metrics:
        metrics = Metrics()
        metrics.serve(port)
        return metrics

    def _open_trackers(self, backend: Backend):
        """Rank 0's experiment-tracker runs (``observability.trackers``), continued from the ids beside the
        checkpoints; each said as a Kubernetes event, so ``kubectl describe`` shows where the run is tracked."""
        from .trackers import open_trackers, system_info

        p = self.cfg.parallel
        layout = {"tensorModelParallelSize": p.tensorModelParallelSize, "dataParallelSize": self.info.dp,
                  "pipelineModelParallelSize": p.pipelineModelParallelSize,
                  "expertModelParallelSize": p.expertModelParallelSize}
        trackers = open_trackers(self.cfg.observability.trackers, self.cfg.checkpoint.save, self.cfg.to_yaml_dict(),
                                 system_info(backend.name, self.info.world_size, layout))
        for r in trackers.records:
            where = r.get("url") or r.get("location")
            emit_event("Normal", "TrackerRun", f"{r['tracker']} run {r['runId']} "
                       f"{'continued' if r['resumed'] else 'started'}{' at ' + where if where else ''}")
        return trackers

    # ------------------------------------------------------------ one step

    def _forward_step(self, data_iterator, model):
        return self.stage.forward_step(data_iterator, model)

    def train_step(self) -> tuple[float, float | None, bool]:
        """One optimizer step; returns (loss averaged over data-parallel ranks, grad norm, step applied)."""
        from megatron.core.pipeline_parallel import get_forward_backward_func

        t = self.cfg.training
        self.consumed = self.step_first_sample = skip_past(self.consumed, self.numerics.windows)
        # materialised: a stage may run several updates over the same micro-batches (GRPO's policy updates)
        data = [self.stage.prepare(list(micro_batches(self.data.sample, self.data.batch, self.consumed,
                                                      t.microBatchSize, self.info.dp, self.info.dp_rank,
                                                      self.num_micro, self.vocab_size)))
                for _ in self.chunks]
        losses = []
        for _ in range(self.stage.updates_per_step):
            for chunk in self.chunks:
                chunk.zero_grad_buffer()
            self.optimizer.zero_grad()
            iterators = [iter(d) for d in data]
            losses += get_forward_backward_func()(
                forward_step_func=self._forward_step,
                data_iterator=iterators if len(iterators) > 1 else iterators[0], model=self.chunks,
                num_microbatches=self.num_micro, seq_length=t.seqLength,
                micro_batch_size=t.microBatchSize * self.stage.rows_per_sample, forward_only=False) or []
            self.router_losses = router_losses(self.cfg.model, self.num_micro)
            applied, grad_norm, _ = self.optimizer.step()
        if applied:
            self.scheduler.step(increment=1)
        self.iteration += 1
        self.consumed += t.globalBatchSize
        self.last_metrics = self.stage.step_metrics(self._average_metrics(losses))
        return self.last_metrics["lm loss"], grad_norm, bool(applied)

    def _average_metrics(self, losses: list[dict]) -> dict[str, float]:
        """Mean of the last stage's micro-batch metrics (the stage's keys) over all its replicas, on every rank."""
        keys = self.stage.metric_keys
        local = torch.zeros(len(keys) + 1, dtype=torch.float64)
        if losses:
            for i, key in enumerate(keys):
                local[i] = float(torch.stack([x[key].float() for x in losses]).mean())
            local[-1] = 1.0
        local = all_reduce_host(local)
        return {key: float(local[i] / local[-1]) for i, key in enumerate(keys)}

    # ------------------------------------------------------------ the run

    def save(self, blocking: bool = True) -> str:
        """Collective: checkpoint this iteration. With ``checkpoint.asyncSave`` and not ``blocking`` the files are
        written while training goes on and the checkpoint counts (``last_checkpoint``, the tracker file) once
        ``finish_save`` has run; one save is in flight at a time."""
        from ..checkpoint.training import save_training_checkpoint

        self._saving(True)  # the operator's stall detection allows a save more time than a step
        try:
            self.finish_save()
            background = self.cfg.checkpoint.asyncSave and not blocking
            memory = self.session.memory if self.session and self.session.memory_enabled else None
            self.pending_save = save_training_checkpoint(self, background=background, memory=memory)
            path = self.pending_save.final
            if not background:
                self.finish_save()
        finally:
            self._saving(False)
        return str(path)

    def _saving(self, saving: bool) -> None:
        if self.metrics:
            self.metrics.set(savingCheckpoint=saving)  # a bool: the final report carries it into status.progress

    def finish_save(self, wait: bool = True) -> None:
        """Collective: promote the checkpoint in flight, if any; without ``wait`` only once every rank's files
        are written (checked at each step boundary, so training never waits for the disk)."""
        if self.pending_save is None or not (wait or self.pending_save.written_everywhere()):
            return
        pending, self.pending_save = self.pending_save, None
        pending.finish()
        self.last_checkpoint = pending.iteration
        checkpointed(pending.iteration)  # this pod's agent starts its warm spares once there is one
        if self.session and self.session.memory_enabled:  # the promoted checkpoint, in memory here and at a peer
            import os

            self.session.memory.commit(pending.iteration, self.info.rank, self.info.world_size,
                                       int(os.environ.get("LOCAL_WORLD_SIZE", "1")))

    def run(self) -> TrainResult:
        cfg, t, obs = self.cfg, self.cfg.training, self.cfg.observability
        rank0 = self.info.rank == 0
        progress = Progress("train", total=t.trainIters, unit="iters", interval_s=60.0, enabled=rank0,
                            already_done=self.iteration)
        losses: list[float] = []
        checkpoint: str | None = None
        tokens_per_step = t.globalBatchSize * self.stage.rows_per_sample * t.seqLength
        start, window_start, window_steps = time.perf_counter(), time.perf_counter(), 0
        first_iteration = self.iteration
        preemption, preempted = PreemptionWatch().install(), False
        try:
            return self._run(cfg, t, obs, rank0, progress, losses, checkpoint, tokens_per_step, start, window_start,
                             window_steps, first_iteration, preemption, preempted)
        except BaseException:
            preemption.uninstall()  # an in-process restart installs its own
            raise

    def _run(self, cfg, t, obs, rank0, progress, losses, checkpoint, tokens_per_step, start, window_start,
             window_steps, first_iteration, preemption, preempted) -> TrainResult:
        restart = self.session.restart if self.session else None
        while self.iteration < t.trainIters:
            step_start = time.perf_counter()
            self.goodput.mark("firstStep")
            if restart is not None and "firstStepAt" not in restart:
                restart["firstStepAt"] = time.time()
                self._in_process_figures()
            step_wall = time.time()
            loss, grad_norm, applied = self.train_step()
            started_up()  # from here on the step lines and progress speak
            if self._numeric_fault(loss, grad_norm, losses, first_iteration):
                progress.done = self.iteration
                continue
            preemption.step_done(time.perf_counter() - step_start)
            self.goodput.step_done(self.iteration)
            if restart is not None and "caughtUpAt" not in restart and self.iteration > restart["highWater"]:
                restart["caughtUpAt"] = step_wall  # the step that passed the earlier high-water mark began
                self._in_process_figures()
            trained_a_step(self.iteration)  # this pod's agent: a failure from now on is not a repeat of the last one
            losses.append(loss)
            window_steps += 1
            progress.update(1, extra=f"lm loss {loss:.4f}")
            if self.iteration % obs.logInterval == 0 or self.iteration == t.trainIters:
                now = time.perf_counter()
                step_s = (now - window_start) / window_steps
                window_start, window_steps = now, 0
                self._log(loss, grad_norm, applied, step_s, tokens_per_step)
            if is_due(cfg, self.iteration):
                run_validation(self)
            self.finish_save(wait=False)
            interval = cfg.checkpoint.saveInterval
            if cfg.checkpoint.save and interval and self.iteration % interval == 0 and self.iteration < t.trainIters:
                checkpoint = self.save(blocking=False)
            if t.exitInterval and self.iteration % t.exitInterval == 0:
                break
            if preemption.agreed() and self.iteration < t.trainIters:
                preempted = True
                break
        self.finish_save()  # a save in flight lands before the run ends (or stops on SIGTERM)
        if cfg.checkpoint.save and self.last_checkpoint != self.iteration:
            checkpoint = self.save()
        elif cfg.checkpoint.save:  # this iteration's checkpoint is already saved (at an interval)
            from ..checkpoint.layout import iteration_dir

            checkpoint = str(iteration_dir(cfg.checkpoint.save, self.iteration))
        preemption.uninstall()
        if preempted and rank0:
            print(f"preempted: stopped after iteration {self.iteration}, checkpoint "
                  f"{checkpoint or 'not saved (no checkpoint.save)'} {preemption.seconds_since_signal():.2f}s after "
                  "SIGTERM", flush=True)
        seconds = time.perf_counter() - start
        steps = self.iteration - first_iteration
        tps = tokens_per_step * steps / seconds if seconds > 0 else 0.0
        if self.metrics:
            self.metrics.set(lastCheckpointIteration=self.last_checkpoint)
            if not preempted:
                self.metrics.expect_reader()
        if self.tensorboard:
            self.tensorboard.close()
        if self.trackers:
            self.trackers.close("KILLED" if preempted else "FINISHED")
        memory = self.session.memory if self.session and self.session.memory_enabled else None
        if memory and memory.commit_seconds and rank0:
            import statistics

            print(f"host-memory checkpoint: kept and replicated {len(memory.commit_seconds)} time(s), median "
                  f"{1000 * statistics.median(memory.commit_seconds):.1f} ms a promotion, "
                  f"{memory.nbytes / 2**20:.1f} MiB held here", flush=True)
        final = f"{losses[-1]:.4f}" if losses else "n/a"
        progress.summary(f"{steps} iterations (to {self.iteration}/{t.trainIters}), final lm loss {final}, "
                         f"{tps:.1f} tokens/s, {seconds:.1f}s, checkpoint {checkpoint or 'not saved'}")
        return TrainResult(self.iteration, losses, tps, seconds, checkpoint, preempted)

    # ------------------------------------------------------------ numerics-aware recovery

    def _numeric_fault(self, loss: float, grad_norm, losses: list[float], first_iteration: int) -> bool:
        """Collective, after every step: True when the step was a numeric fault and the run has rolled back to its
        latest checkpoint (the step's batch is skipped from then on); False for a good step (or a spike with no
        checkpoint to go back to, reported). Raises NumericFault when the rollbacks are used up."""
        n, stage = self.cfg.numerics, self.cfg.stage
        norm = float(grad_norm) if grad_norm is not None else None
        reason = fault_reason(loss, norm, self.numerics.recent(), n.lossSpikeFactor if stage in SPIKE_STAGES else 0,
                              n.lossSpikeWindow)
        seen = torch.tensor([0.0 if reason is None else 1.0 if reason.startswith("loss spike") else 2.0])
        # every rank decides the same (a rank that saw NaN wins)
        seen = all_reduce_host(seen, torch.distributed.ReduceOp.MAX)
        if not seen.item():
            self.numerics.good_step(self.iteration, loss)
            return False
        reason = reason or "another rank saw a non-finite loss or grad norm"
        window = SkippedWindow(self.iteration, self.step_first_sample, self.consumed, reason)
        where = (f"iteration {window.iteration} (samples {window.first_sample}-{window.end_sample - 1} of the run): "
                 f"{reason}")
        self.finish_save()  # a checkpoint still being written lands: the newest one to go back to (or resume from)
        if self.numerics.rollbacks >= n.maxRollbacks:
            raise NumericFault(f"numeric fault at {where}; numerics.maxRollbacks ({n.maxRollbacks}) rollbacks used",
                               window.iteration, window.first_sample, window.end_sample)
        from ..checkpoint.training import rollback_root, rollback_training_checkpoint

        root, began = rollback_root(self.cfg), time.perf_counter()
        restored = rollback_training_checkpoint(self, root) if root else None
        if restored is None:
            if seen.item() == 2.0:
                raise NumericFault(f"numeric fault at {where}; no checkpoint to roll back to (set checkpoint.save "
                                   "and checkpoint.saveInterval)", window.iteration, window.first_sample,
                                   window.end_sample)
            self._numeric_event("NumericSpike", f"{where}; no checkpoint to roll back to: training goes on")
            self.numerics.good_step(self.iteration, loss)
            return False
        self.numerics.rolled_back(restored, window)
        del losses[max(0, restored - first_iteration):]
        self._numeric_event("NumericRollback", (
            f"{where}; rolled back to iteration {restored} ({root}) in {time.perf_counter() - began:.2f}s, "
            f"{window.iteration - 1 - restored} step(s) to train again, then skipping those {window.samples} samples "
            f"(rollback {self.numerics.rollbacks} of {n.maxRollbacks})"))
        return True

    def _numeric_event(self, reason: str, message: str) -> None:
        if self.info.rank != 0:
            return
        from ..telemetry import emit_event

        print(f"numerics: {message}", flush=True)
        emit_event("Warning", reason, message)
        if self.metrics:
            self.metrics.set(**self.numerics.figures())

    def _in_process_figures(self) -> None:
        """Rank 0's figures of the last in-process restart, for status.recoveries (level InProcess)."""
        if self.info.rank == 0 and self.session:
            parts = self.session.parts()
            print(f"in-process restart {self.session.restart.get('restarts')}: " +
                  ", ".join(f"{k} {v:.2f}s" for k, v in parts.items()) + f" (total {sum(parts.values()):.2f}s)",
                  flush=True)
        if self.metrics and self.session:
            self.metrics.set(**self.session.figures())

    def _log(self, loss: float, grad_norm, applied: bool, step_s: float, tokens_per_step: int) -> None:
        t = self.cfg.training
        lr = float(self.optimizer.param_groups[0]["lr"])
        tps = tokens_per_step / step_s
        tflops = self.flops / step_s / self.info.world_size
        mfu = tflops / self.peak
        eta = step_s * (t.trainIters - self.iteration)
        scale = float(self.optimizer.get_loss_scale()) if self.dtype == torch.float16 else None
        if self.info.rank != 0:
            return
        print(format_line(StepStats(
            iteration=self.iteration, train_iters=t.trainIters, consumed_samples=self.consumed,
            ms_per_iter=1000 * step_s, learning_rate=lr, global_batch_size=t.globalBatchSize, loss=loss,
            grad_norm=float(grad_norm) if grad_norm is not None else None, tokens_per_second=tps,
            tflops_per_device=tflops / 1e12, mfu=mfu, loss_scale=scale, skipped=0 if applied else 1,
            eta_seconds=eta, extra={k: v for k, v in self.last_metrics.items() if k != "lm loss"},
            router_losses=self.router_losses)), flush=True)
        if self.tensorboard:
            for name, value in (("lm loss", loss), ("learning-rate", lr), ("grad-norm", grad_norm),
                                ("loss-scale", scale), ("tokens-per-second", tps), ("mfu", mfu),
                                *((k, v) for k, v in self.last_metrics.items() if k != "lm loss"),
                                *self.router_losses.items()):
                if value is not None:
                    self.tensorboard.add_scalar(name, float(value), self.iteration)
            self.tensorboard.flush()
        if self.trackers:  # the metrics endpoint's series, by its status.progress names
            self.trackers.log({"loss": loss, "learningRate": lr, "tokensPerSecond": tps, "mfu": mfu,
                               "gradNorm": grad_norm, "lossScale": scale, **preference_fields(self.last_metrics),
                               "loadBalancingLoss": self.router_losses.get(
                                   "load_balancing_loss", self.router_losses.get("seq_load_balancing_loss"))},
                              self.iteration)
        self.goodput.save()
        if self.metrics:
            self.metrics.set(**self.goodput.figures())
            self.metrics.set(iteration=self.iteration, trainIters=t.trainIters,
                             percent=100.0 * self.iteration / t.trainIters, loss=loss, learningRate=lr,
                             tokensPerSecond=tps, mfu=mfu, etaSeconds=eta,
                             lastCheckpointIteration=self.last_checkpoint, **preference_fields(self.last_metrics),
                             loadBalancingLoss=self.router_losses.get("load_balancing_loss",
                                                                      self.router_losses.get("seq_load_balancing_loss")))


def train(cfg: TrainConfig, backend: Backend) -> TrainResult:
    """Build and run a trainer; under in-process restarts (``ascend_engine.inprocess``) build and run it again in
    this process after a failure of any rank, while the job's count allows."""
    from ..inprocess import session as in_process_session

    session = in_process_session()
    if session is not None:
        import gc

        gc.freeze()  # imports and config: a restart's collection of the old trainer then walks only its objects
    while True:
        trainer = None
        try:
            trainer = Trainer(cfg, backend, session)
            result = trainer.run()
            destroy_parallel()
            return result
        except Exception as e:  # noqa: BLE001 - the engine's own refusals are not retried: see _retried
            if not _retried(session, e):
                _failed(trainer, session)
                raise
        except BaseException:
            _failed(trainer, session)
            raise
        del trainer  # its model, optimizer and groups go before the next one is built


def _retried(session, e: Exception) -> bool:
    """Whether the failure is restarted in process (the process group is torn down then)."""
    from ..checkpoint.training import CheckpointMismatch
    from ..data.sources import DataError
    from .trackers import TrackerError

    if session is None or isinstance(e, (CheckpointMismatch, DataError, TrackerError, NumericFault)):
        return False
    return session.recover(e)


def _failed(trainer, session) -> None:
    trackers = trainer.trackers if trainer else (session.kept.get("trackers") if session else None)
    if trackers:
        trackers.close("FAILED")
    destroy_parallel()
