"""What a training checkpoint holds (model, optimizer, scheduler, RNG, data position) and how it is restored.

The file is Megatron-LM's: ``model``, ``args``, ``optimizer``, ``opt_param_scheduler``, ``rng_state`` (one entry
per data-parallel rank), ``iteration``; the distributed optimizer's sharded state goes to ``distrib_optim.pt``
next to it, as Megatron-LM's legacy torch format does.

With LoRA the file's ``model`` holds only the adapters. ``checkpoint.load`` is then the frozen base (weights
only, whatever iteration it is at) and ``lora.loraLoad`` the adapter run to resume.
"""
from __future__ import annotations

import io
import random
import sys

import numpy as np
import torch

from ..models.wrappers import unwrap
from .distrib_optim import load_distributed_optimizer
from .layout import DISTRIB_OPTIM_FILE, MODEL_FILE, RELEASE, iteration_dir, rank_dir_name, read_latest
from .manifest import CorruptCheckpoint, read_manifest, read_verified
from .megatron_args import megatron_args
from .save import CHECKPOINT_VERSION, CheckpointWrite, begin_checkpoint, saved_iterations, serialize
from .scheduler import mismatch_message, schedule_differences



class CheckpointMismatch(ValueError):
    """A checkpoint that cannot be loaded into this run; the message says what differs and what to do."""


def rng_state() -> dict:
    """This rank's generators, under Megatron-LM's keys."""
    from megatron.core.tensor_parallel import get_cuda_rng_tracker

    return {"random_rng_state": random.getstate(), "np_rng_state": np.random.get_state(),
            "torch_rng_state": torch.get_rng_state(), "cuda_rng_state": torch.cuda.get_rng_state(),
            "rng_tracker_states": get_cuda_rng_tracker().get_states()}


def set_rng_state(state: dict) -> None:
    from megatron.core.tensor_parallel import get_cuda_rng_tracker

    random.setstate(state["random_rng_state"])
    np.random.set_state(state["np_rng_state"])
    torch.set_rng_state(state["torch_rng_state"])
    torch.cuda.set_rng_state(state["cuda_rng_state"])
    get_cuda_rng_tracker().set_states(state["rng_tracker_states"])


def _gather_over_dp(obj) -> list:
    """One entry per data-parallel rank (Megatron-LM stores rng_state that way)."""
    from megatron.core import parallel_state

    if not torch.distributed.is_initialized():
        return [obj]
    group = parallel_state.get_data_parallel_group()
    out = [None] * torch.distributed.get_world_size(group)
    torch.distributed.all_gather_object(out, obj, group=group)
    return out


def model_entries(models: list[dict]) -> dict:
    """``model``, or ``model0``, ``model1``, ... with virtual pipeline stages (one per chunk), as Megatron-LM."""
    return {"model": models[0]} if len(models) == 1 else {f"model{i}": m for i, m in enumerate(models)}


def save_training_checkpoint(trainer, background: bool = False, memory=None) -> CheckpointWrite:
    """Collective. One file per model-parallel rank (TP, PP and EP), written by data-parallel rank 0 of each
    (with experts: expert-data-parallel rank 0, so every expert-parallel rank's experts are written). Everything
    is serialised before this returns; with ``background`` the files are written while training goes on, and the
    caller ``finish``es the returned write (collective) before the checkpoint counts. ``memory`` (a
    ``checkpoint.memory.MemoryCheckpoint``) keeps this rank's serialised files for in-process restarts."""
    from megatron.core import parallel_state


    cfg, info = trainer.cfg, trainer.info
    rngs = _gather_over_dp(rng_state())
    files = {}
    writer = parallel_state.get_expert_data_parallel_rank() == 0 if info.ep > 1 else info.dp_rank == 0
    if writer:
        models = [unwrap(chunk).state_dict_for_save_checkpoint() for chunk in trainer.chunks]
        if cfg.lora.enabled:
            from ..models.lora import adapter_state

            models = [adapter_state(model) for model in models]
        files[MODEL_FILE] = serialize({
            "args": megatron_args(cfg, info.world_size, trainer.iteration, trainer.consumed),
            **model_entries(models),
            "optimizer": trainer.optimizer.state_dict(),
            "opt_param_scheduler": trainer.scheduler.state_dict(),
            "rng_state": rngs,
            "checkpoint_version": CHECKPOINT_VERSION, "iteration": trainer.iteration,
            # numerics-aware recovery: skipped data windows, rollbacks used, recent losses (train.numerics)
            "numerics": trainer.numerics.state_dict(),
        })
    if cfg.parallel.useDistributedOptimizer:
        shards = io.BytesIO()  # gathered to data-parallel rank 0, which alone writes into the buffer
        trainer.optimizer.save_parameter_state(shards)
        if shards.tell():
            files[DISTRIB_OPTIM_FILE] = shards.getbuffer()
    rank_dir = rank_dir_name(info.tp_rank, info.pp_rank, info.pp, info.ep_rank, info.ep)
    if memory is not None:
        memory.keep(trainer.iteration, rank_dir, files)
    return begin_checkpoint(cfg.checkpoint.save, trainer.iteration, rank_dir, files,
                            is_rank0=info.rank == 0, background=background,
                            keep_last=cfg.checkpoint.keepLastCheckpoints)


def _check_layout(args, cfg, where) -> None:
    p = cfg.parallel
    for name, ours in (("tensor_model_parallel_size", p.tensorModelParallelSize),
                       ("pipeline_model_parallel_size", p.pipelineModelParallelSize),
                       ("expert_model_parallel_size", p.expertModelParallelSize),
                       ("virtual_pipeline_model_parallel_size", cfg.virtual_pipeline_size),
                       ("num_experts", cfg.model.numExperts),
                       ("num_layers", cfg.model.numLayers), ("hidden_size", cfg.model.hiddenSize)):
        theirs = getattr(args, name, ours)
        if theirs != ours:
            raise CheckpointMismatch(
                f"{where}: saved with {name}={theirs} but this run has {ours}; reshard it first with "
                f"`ascend-engine convert` (mcore -> mcore) or match the config")


def _read_rank_file(root, trainer, collective: bool = True) -> tuple[int | str, object, dict, bytes | None] | None:
    """(iteration, folder, state, distributed-optimizer shards) of this rank in ``root``'s newest checkpoint that
    every rank can read and verify; None when there is none yet.

    A checkpoint whose files do not match its manifest (or that cannot be unpickled) is skipped with a warning
    for the next older one, the same on every rank (``collective``: they agree over one all-gather). Without
    ``collective`` (a reference model read by some ranks only) damage is an error instead.
    """
    info = trainer.info
    latest = read_latest(root)
    if latest is None:
        if info.rank == 0:
            print(f"no checkpoint in {root} (no latest_checkpointed_iteration.txt): starting fresh",
                  file=sys.stderr, flush=True)
        return None
    candidates = [latest]
    if collective and latest != RELEASE:
        candidates += [i for i in reversed(saved_iterations(root)) if i < latest]
    problems: list[str] = []
    for iteration in candidates:
        found, problem, mismatch = None, None, None
        try:
            found = _read_candidate(root, iteration, trainer)
        except CorruptCheckpoint as e:
            problem = str(e)
        except CheckpointMismatch as e:
            mismatch = str(e)
        if not collective:
            if problem or mismatch:
                raise CheckpointMismatch(mismatch or f"damaged checkpoint: {problem}")
            return found
        seen = _gather_over_world((problem, mismatch))
        mismatches = [m for _, m in seen if m]
        if mismatches:  # every rank stops, not only those that saw it
            raise CheckpointMismatch(mismatch or mismatches[0])
        if not any(p for p, _ in seen):
            if problems:
                _report_fallback(root, latest, iteration, problems, info.rank == 0)
            return found
        problems += sorted({p for p, _ in seen if p})
    raise CheckpointMismatch(f"{root}: no loadable checkpoint: " + "; ".join(problems))


def _read_candidate(root, iteration, trainer) -> tuple[int | str, object, dict, bytes | None]:
    """This rank's files of one checkpoint, verified against its manifest (when it has one) and unpickled."""
    cfg, info = trainer.cfg, trainer.info
    top = iteration_dir(root, iteration)
    if not top.is_dir():
        raise CorruptCheckpoint(top, "missing (the tracker file names it)")
    entries = read_manifest(top)
    rank = rank_dir_name(info.tp_rank, info.pp_rank, info.pp, info.ep_rank, info.ep)
    folder = top / rank
    if not (folder / MODEL_FILE).is_file() and entries is None:
        raise CheckpointMismatch(f"{folder / MODEL_FILE}: missing; the checkpoint does not have this run's "
                                 "tensor/pipeline layout")
    if entries is not None and f"{rank}/{MODEL_FILE}" not in entries:
        raise CheckpointMismatch(f"{folder / MODEL_FILE}: missing; the checkpoint does not have this run's "
                                 "tensor/pipeline layout")
    data = read_verified(top, f"{rank}/{MODEL_FILE}", entries)
    try:
        state = torch.load(io.BytesIO(data), map_location="cpu", weights_only=False)
    except Exception as e:  # a damaged file without a manifest to say so
        raise CorruptCheckpoint(folder / MODEL_FILE, f"cannot be unpickled ({type(e).__name__}: {e})") from None
    if "args" in state:
        _check_layout(state["args"], cfg, folder / MODEL_FILE)
    shards = None
    reads_shards = (cfg.parallel.useDistributedOptimizer and cfg.checkpoint.loadOptim and info.dp_rank == 0
                    and "optimizer" in state and iteration != RELEASE)
    if reads_shards and entries is not None:  # unverifiable shards are left to the optimizer's own loader
        shards = read_verified(top, f"{rank}/{DISTRIB_OPTIM_FILE}", entries)
    return iteration, folder, state, shards


def _gather_over_world(obj) -> list:
    if not torch.distributed.is_initialized():
        return [obj]
    out = [None] * torch.distributed.get_world_size()
    torch.distributed.all_gather_object(out, obj)
    return out


def _report_fallback(root, latest, used, problems: list[str], rank0: bool) -> None:
    """Loud on purpose: a warning in the log naming each damaged file, and an event line the operator turns
    into a Warning event on the job."""
    from ..telemetry import emit_event

    if not rank0:
        return
    message = (f"checkpoint {root}: iteration {latest} is damaged ({'; '.join(problems)}); "
               f"resuming from iteration {used}, the newest one that verifies")
    print(f"WARNING {message}", file=sys.stderr, flush=True)
    emit_event("Warning", "CheckpointFallback", message)


def _load_model(trainer, state: dict, where, adapters: bool) -> None:
    """Base weights (adapters excluded, with LoRA) or adapter weights only, every expected key present; one state
    dict per model chunk (``model0``, ``model1``, ... with virtual pipeline stages)."""

    for i, chunk in enumerate(trainer.chunks):
        key = "model" if len(trainer.chunks) == 1 else f"model{i}"
        if key not in state:
            raise CheckpointMismatch(f"{where}: no '{key}' state dict; the checkpoint has another number of virtual "
                                     f"pipeline stages (numLayersPerVirtualPipelineStage)")
        _load_chunk(unwrap(chunk), state[key], where, adapters)


def _load_chunk(gpt, saved: dict, where, adapters: bool) -> None:
    from ..models.lora import is_adapter_key
    from ..models.score_head import from_language_model

    saved = from_language_model(gpt, saved)
    expected = {k for k in gpt.state_dict() if is_adapter_key(k) == adapters and not k.endswith("._extra_state")}
    given = {k: v for k, v in saved.items() if is_adapter_key(k) == adapters}
    missing = sorted(expected - set(given))
    if missing:
        what = "adapter" if adapters else "model"
        raise CheckpointMismatch(f"{where}: {what} tensors missing, e.g. {missing[0]} ({len(missing)} in all); "
                                 "check loraTargetModules and the model shape")
    result = gpt.load_state_dict(given, strict=False)
    unexpected = [k for k in result.unexpected_keys if not k.endswith("._extra_state")]
    if unexpected:
        raise CheckpointMismatch(f"{where}: tensors this model does not have, e.g. {unexpected[0]}")


def _restore_scheduler(trainer, saved: dict, where) -> None:
    """The schedule position always comes from the checkpoint; its shape only if it agrees with this run or the
    run says which one wins (the scheduler was built with the same choice, see ``train.optim``).

    megatron-core's ``OptimizerParamScheduler.load_state_dict`` does not set the step count, it adds the saved one
    to the live one (``self.step(increment=num_steps)``), and sets the weight-decay values after that step. A
    freshly built scheduler is at 0, so a resume comes out right, but a numerics rollback reloads into the running
    scheduler: 11 steps + the checkpoint's 8 put the schedule at 19 and a cosine decay at its floor for the rest
    of the run. So the count is zeroed first, and the rates are set again once every value is loaded."""
    o = trainer.cfg.optimizer
    differences = schedule_differences(trainer.scheduler, saved)
    if differences and not (o.overrideOptParamScheduler or o.useCheckpointOptParamScheduler):
        raise CheckpointMismatch(mismatch_message(where, differences))
    trainer.scheduler.num_steps = 0
    trainer.scheduler.load_state_dict(saved)
    trainer.scheduler.step(increment=0)  # lr and weight decay from the loaded count and the loaded values
    if differences and trainer.info.rank == 0:
        kept = "this run's" if o.overrideOptParamScheduler else "the checkpoint's"
        print(f"learning-rate schedule: using {kept} values where they differ: {'; '.join(differences)}",
              flush=True)


def _resume(trainer, iteration, folder, state, shards: bytes | None, rollback: bool = False) -> None:
    """Optimizer, scheduler, RNG, iteration and data position, as ``cfg.checkpoint`` allows (everything, for a
    numerics ``rollback``, which keeps the run's own record of skipped windows instead of the checkpoint's)."""
    cfg, info, ck = trainer.cfg, trainer.info, trainer.cfg.checkpoint
    if (ck.loadOptim or rollback) and "optimizer" in state:
        if cfg.parallel.useDistributedOptimizer:
            load_distributed_optimizer(trainer.optimizer, state["optimizer"],
                                       io.BytesIO(shards) if shards is not None else str(folder / DISTRIB_OPTIM_FILE))
        else:
            trainer.optimizer.load_state_dict(state["optimizer"])
        _restore_scheduler(trainer, state["opt_param_scheduler"], folder / MODEL_FILE)
    if (ck.loadRng or rollback) and "rng_state" in state:
        rngs = state["rng_state"]
        set_rng_state(rngs[info.dp_rank] if len(rngs) == info.dp else rngs[0])
    saved_dp = getattr(state.get("args"), "data_parallel_size", info.dp)
    if saved_dp != info.dp and info.rank == 0 and not rollback:
        print(f"data-parallel size {saved_dp} -> {info.dp}: the same global batch of {cfg.training.globalBatchSize} "
              f"samples in {trainer.num_micro} micro-batches per rank and step; optimizer state resharded",
              flush=True)
    trainer.iteration = int(state["iteration"])
    trainer.consumed = int(getattr(state.get("args"), "consumed_train_samples", trainer.iteration
                                   * cfg.training.globalBatchSize))
    trainer.last_checkpoint = trainer.iteration
    if "numerics" in state and not rollback:
        trainer.numerics.load_state_dict(state["numerics"])


def rollback_root(cfg) -> str | None:
    """Where a numerics rollback reloads from: the run's own checkpoints (checkpoint.save) once it has one, else
    the checkpoint it resumed from (checkpoint.load, not a fine-tuning start or a frozen LoRA base)."""
    ck = cfg.checkpoint
    if ck.save and read_latest(ck.save) not in (None, RELEASE):
        return ck.save
    resumed = cfg.lora.loraLoad if cfg.lora.enabled else None if ck.finetune else ck.load
    return resumed if resumed and read_latest(resumed) not in (None, RELEASE) else None


def rollback_training_checkpoint(trainer, root) -> int | None:
    """Collective: reload everything of ``root``'s newest verified checkpoint (model or LoRA adapters, optimizer,
    scheduler, RNG, iteration, data position) into the running trainer; returns its iteration."""
    found = _read_rank_file(root, trainer)
    if found is None or found[0] == RELEASE:
        return None
    iteration, folder, state, shards = found
    _load_model(trainer, state, folder, adapters=trainer.cfg.lora.enabled)
    _resume(trainer, iteration, folder, state, shards, rollback=True)
    if "optimizer" not in state:
        trainer.optimizer.reload_model_params()
    return trainer.iteration


def load_training_checkpoint(trainer) -> str | None:
    """Restore what ``cfg.checkpoint`` (and ``cfg.lora``) ask for; returns what was loaded, for the log.

    ``finetune`` loads weights only and starts at iteration 0; ``loadOptim``/``loadRng`` false skip those parts.
    With LoRA the base in ``checkpoint.load`` is always weights only; ``lora.loraLoad`` resumes the adapters.
    A missing tracker file is not an error (the first run of a job that saves to the same folder).
    """
    cfg = trainer.cfg
    ck, lora = cfg.checkpoint, cfg.lora
    loaded = []
    base = _read_rank_file(ck.load, trainer) if ck.load else None
    if base is not None:
        iteration, folder, state, shards = base
        _load_model(trainer, state, folder, adapters=False)
        if not lora.enabled and not ck.finetune and iteration != RELEASE:
            _resume(trainer, iteration, folder, state, shards)
            loaded.append(f"{ck.load} at iteration {iteration}")
        else:
            loaded.append(f"{ck.load} (weights only{', frozen LoRA base' if lora.enabled else ''})")
    adapter = _read_rank_file(lora.loraLoad, trainer) if lora.loraLoad else None
    if adapter is not None:
        iteration, folder, state, shards = adapter
        _load_model(trainer, state, folder, adapters=True)
        if not ck.finetune and iteration != RELEASE:
            _resume(trainer, iteration, folder, state, shards)
        loaded.append(f"LoRA adapters {lora.loraLoad} at iteration {iteration}")
    if not loaded:
        return None
    if trainer.iteration == 0 or not ck.loadOptim:
        trainer.optimizer.reload_model_params()  # copy the loaded weights into fp32 main params
    return "; ".join(loaded)


def load_from_memory(trainer, memory) -> str | None:
    """Collective, after an in-process restart: the run's newest checkpoint from host memory (this rank's, or sent
    by the peer that holds its replica), restored as ``load_training_checkpoint`` restores its files; None on
    every rank when the memory cannot serve every rank (the caller then reads the files). Only for a run that
    resumes from its own checkpoints (``checkpoint.load`` is ``checkpoint.save``, no LoRA, no fine-tuning start),
    which is what the memory holds."""
    from .memory import load_state

    cfg, info = trainer.cfg, trainer.info
    ck = cfg.checkpoint
    if cfg.lora.enabled or ck.finetune or not ck.save or ck.load != ck.save or not torch.distributed.is_initialized():
        return None
    rank_dir = rank_dir_name(info.tp_rank, info.pp_rank, info.pp, info.ep_rank, info.ep)
    found = memory.restore(trainer, rank_dir)
    if found is None:
        return None
    iteration, files = found
    state, shards = load_state(files)
    folder = iteration_dir(ck.save, iteration) / rank_dir
    _load_model(trainer, state, folder, adapters=False)
    _resume(trainer, iteration, folder, state, shards if info.dp_rank == 0 else None)
    if trainer.iteration == 0 or not ck.loadOptim:
        trainer.optimizer.reload_model_params()
    return f"{ck.save} at iteration {iteration} from host memory"


def load_model_weights(gpt, root, trainer, score_head: bool = False) -> None:
    """The full weights of ``root``'s latest checkpoint into ``gpt`` (this rank's TP/PP part), nothing else: the
    frozen DPO reference, or with ``score_head`` GRPO's reward model, which must be an ORM checkpoint (a language
    model's would otherwise load with a fresh, random score head). A folder without a checkpoint is an error here,
    not a fresh start."""
    found = _read_rank_file(root, trainer, collective=False)
    if found is None:
        raise CheckpointMismatch(f"{root}: no checkpoint (latest_checkpointed_iteration.txt missing)")
    _, folder, state, _ = found
    if "model" not in state:
        raise CheckpointMismatch(f"{folder}: a checkpoint with virtual pipeline stages cannot be a reference model")
    args = state.get("args")
    if score_head and not (getattr(args, "score_head", False) or "score.weight" in state["model"]):
        raise CheckpointMismatch(f"{root}: not a reward model: the checkpoint has no score head (score.weight); "
                                 "train one with train.stage orm")
    _load_chunk(gpt, state["model"], folder, adapters=False)
