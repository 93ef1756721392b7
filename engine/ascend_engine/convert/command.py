"""``ascend-engine convert``: HF <-> Megatron-core, Megatron resharding and LoRA merge, with MindSpeed-LLM's flags.

Order of work: open and check the source (and adapter), work out the target layout, run the whole conversion
on shape-only tensors (every error surfaces here, nothing written yet), then write into a temporary folder
and move it into place: a Megatron iteration folder is renamed whole and the tracker file is written last;
HF files are moved in with the index last.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
from pathlib import Path

from ..checkpoint.layout import iteration_dir, write_latest
from ..config.convert import ConvertConfig
from ..config.loader import ConfigError, add_flags, build_config
from ..config.model import ModelConfig
from ..telemetry import Progress, report_result
from .errors import ConvertError
from .families import FAMILIES, Family
from .hf_config import (check_same_model, family_for, hf_config_from_model, model_config_from_hf,
                        score_model_fields)
from .lora import LoraAdapter
from .mcore_layout import model_keys
from .dtypes import describe, from_config_name
from .sources import HFSource, MegatronSource, Unsplit, read_hf_config
from .writers import write_hf, write_megatron

_DEST = "_convert_dests"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.json", "merges.txt",
                   "tokenizer.model", "added_tokens.json", "chat_template.jinja", "generation_config.json")
_HF_DTYPE = {"fp32": "float32", "fp16": "float16", "bf16": "bfloat16"}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", help="YAML file with a ConvertConfig (or a CheckpointConvert resource)")
    parser.set_defaults(**{_DEST: add_flags(parser, ConvertConfig)})


def run(args: argparse.Namespace) -> int:
    cfg = build_config(ConvertConfig, args, getattr(args, _DEST), args.config, section="convert")
    try:
        report_result(convert(cfg))
    except ConvertError as e:
        print(f"ascend-engine convert: error: {e}", file=sys.stderr)
        report_result({"status": "Failed", "reason": "ConvertError", "message": str(e)[:2000]})
        return 1
    return 0


def layer_counts_for(cfg: ConvertConfig, num_layers: int) -> list[int]:
    pp = cfg.targetPipelineParallelSize
    per_chunk = cfg.numLayersPerVirtualPipelineStage
    if per_chunk is not None:  # one entry per virtual stage
        if num_layers % (pp * per_chunk) or num_layers // (pp * per_chunk) < 2:
            raise ConfigError(f"numLayersPerVirtualPipelineStage ({per_chunk}) x targetPipelineParallelSize ({pp}) "
                              f"x 2 or more chunks must make up the model's {num_layers} layers")
        return [per_chunk] * (num_layers // per_chunk)
    if cfg.numLayerList is not None:
        if sum(cfg.numLayerList) != num_layers:
            raise ConfigError(f"numLayerList {cfg.numLayerList} sums to {sum(cfg.numLayerList)}, but the model has "
                              f"{num_layers} layers")
        return list(cfg.numLayerList)
    if num_layers % pp:
        raise ConfigError(f"targetPipelineParallelSize ({pp}) does not divide the model's {num_layers} layers; "
                          f"give numLayerList (--num-layer-list) for an uneven split")
    return [num_layers // pp] * pp


def _check_tp(model: ModelConfig, tp: int, ep: int) -> None:
    sizes = [("numAttentionHeads", model.numAttentionHeads), ("numQueryGroups", model.num_query_groups),
             ("ffnHiddenSize", model.ffn_hidden_size), ("paddedVocabSize", model.padded_vocab_size(tp))]
    if model.numExperts is not None:
        sizes += [("moeFfnHiddenSize", model.moe_ffn_hidden_size),
                  ("moeSharedExpertIntermediateSize", model.moeSharedExpertIntermediateSize or tp)]
    for name, value in sizes:
        if value % tp:
            raise ConfigError(f"targetTensorParallelSize ({tp}) does not divide the model's {name} ({value})")
    if ep > 1 and model.numExperts is None:
        raise ConfigError(f"targetExpertParallelSize ({ep}) needs an MoE model; this one has no experts")
    if model.numExperts is not None and model.numExperts % ep:
        raise ConfigError(f"targetExpertParallelSize ({ep}) does not divide the model's numExperts "
                          f"({model.numExperts})")
    if model.padded_vocab_size(tp) < model.vocabSize:
        raise ConfigError(f"paddedVocabSize ({model.padded_vocab_size(tp)}) is smaller than the vocabulary "
                          f"({model.vocabSize})")


def _open_source(cfg: ConvertConfig):
    if cfg.loadModelType == "hf":
        return HFSource(cfg.loadDir, cfg.modelTypeHf, cfg.makeVocabSizeDivisibleBy, cfg.paddedVocabSize)
    return MegatronSource(cfg.loadDir, cfg.ckptStep)


def _mg_target(cfg: ConvertConfig, source) -> ModelConfig:
    """The source's model with the vocabulary padding asked for; unasked, a Megatron source keeps its own
    padded size when the target TP divides it (so trained padding rows survive a reshard)."""
    asked = cfg.paddedVocabSize is not None or "makeVocabSizeDivisibleBy" in cfg.model_fields_set
    if asked or source.args is None:
        update = {"paddedVocabSize": cfg.paddedVocabSize, "makeVocabSizeDivisibleBy": cfg.makeVocabSizeDivisibleBy}
    elif source.model.padded_vocab_size(1) % cfg.targetTensorParallelSize == 0:
        update = {}
    else:
        update = {"paddedVocabSize": None}
    return source.model.model_copy(update=update)


def _hf_target(cfg: ConvertConfig, source) -> tuple[ModelConfig, Family, dict | None]:
    """Model, family and (when hfConfigDir is given) the config.json to copy."""
    template = read_hf_config(cfg.hfConfigDir) if cfg.hfConfigDir else None
    model = source.model
    if template is not None:
        where = str(Path(cfg.hfConfigDir) / "config.json")
        family = family_for(template, cfg.modelTypeHf, where)
        model = model.model_copy(update={"vocabSize": int(template.get("vocab_size", model.vocabSize))})
        check_same_model(model_config_from_hf(template, where), model, where, cfg.loadDir)
    elif cfg.modelTypeHf:
        family = FAMILIES[cfg.modelTypeHf]
    elif isinstance(source, HFSource):
        family = source.family
    else:
        raise ConfigError("saving HF needs modelTypeHf (--model-type-hf) or hfConfigDir (--hf-cfg-dir)")
    return model, family, template


def _tokenizer_dir(cfg: ConvertConfig) -> Path | None:
    if cfg.hfConfigDir:
        return Path(cfg.hfConfigDir)
    if cfg.tokenizerModel:
        path = Path(cfg.tokenizerModel)
        return path if path.is_dir() else path.parent
    if cfg.loadModelType == "hf":
        return Path(cfg.loadDir)
    return None


def _tokenizer_pad_id(cfg: ConvertConfig) -> int | None:
    """The padding token of the output's tokenizer (its eos token when it has none), if there is a tokenizer."""
    tok = _tokenizer_dir(cfg)
    if tok is None or not any((tok / name).is_file() for name in TOKENIZER_FILES):
        return None
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(tok))
    return tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id


def _check_output(cfg: ConvertConfig, iteration) -> None:
    save = Path(cfg.saveDir)
    if cfg.saveModelType == "mg":
        if iteration_dir(save, iteration).exists():
            raise ConfigError(f"saveDir: {iteration_dir(save, iteration)} already exists; refusing to overwrite it")
    elif save.exists() and (not save.is_dir() or any(save.iterdir())):
        raise ConfigError(f"saveDir: {save} exists and is not an empty folder; refusing to mix an HF model into it")
    if Path(cfg.saveDir).resolve() == Path(cfg.loadDir).resolve():
        raise ConfigError("saveDir must differ from loadDir")


def convert(cfg: ConvertConfig) -> dict:
    """Run one conversion; returns its report (what the operator shows as status.outputs).
    Raises ConvertError/ConfigError before writing on bad input."""
    start = time.monotonic()
    source = _open_source(cfg)
    lora = None
    if cfg.loraLoad:
        lora = LoraAdapter(cfg.loraLoad, source.model, cfg.loraR, cfg.loraAlpha, list(cfg.loraTargetModules))
    unsplit = Unsplit(source, lora)
    dtype = from_config_name(cfg.paramsDtype)
    save = Path(cfg.saveDir)

    if cfg.saveModelType == "mg":
        target = _mg_target(cfg, source)
        tp, ep = cfg.targetTensorParallelSize, cfg.targetExpertParallelSize
        _check_tp(target, tp, ep)
        counts = layer_counts_for(cfg, target.numLayers)
        iteration = source.iteration
        _check_output(cfg, iteration)

        def write(root: Path, meta: bool, progress=None):
            return write_megatron(unsplit, target, root, iteration, tp, counts, dtype, source.args, meta, progress, ep,
                                  len(counts) // cfg.targetPipelineParallelSize if cfg.numLayersPerVirtualPipelineStage
                                  else None)
    else:
        target, family, template = _hf_target(cfg, source)
        _check_output(cfg, None)
        plan: list = []

        def write(root: Path, meta: bool, progress=None):
            return write_hf(unsplit, target, family, root, dtype, cfg.maxShardSizeMb * 1_000_000, meta, plan,
                            progress)

    dry = write(save, meta=True)
    unused = lora.unused(set(model_keys(target))) if lora else []
    if unused:
        raise ConvertError(f"{cfg.loraLoad}: adapter modules not in the model, e.g. {unused[0]}")
    if cfg.saveModelType == "hf":
        plan.extend(dry.hf_plan)
        hf_dtype = _HF_DTYPE.get(cfg.paramsDtype or "", describe(dry.hf_plan[0][1]).torch)
        config = dict(template) if template else hf_config_from_model(target, family, hf_dtype)
        config = score_model_fields(config, family, target, _tokenizer_pad_id(cfg), "config.json")
        config["dtype"] = hf_dtype
        config.pop("torch_dtype", None)

    progress = Progress("convert", total=target.numLayers, unit="layers")
    tmp = _temp_dir(save)
    try:
        totals = write(tmp, meta=False, progress=progress)
        if cfg.saveModelType == "mg":
            save.mkdir(parents=True, exist_ok=True)
            os.replace(iteration_dir(tmp, iteration), iteration_dir(save, iteration))
            write_latest(save, iteration)
        else:
            (tmp / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
            tok = _tokenizer_dir(cfg)
            for name in TOKENIZER_FILES if tok else ():
                if (tok / name).is_file():
                    shutil.copyfile(tok / name, tmp / name)
            _move_in(tmp, save)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    seconds = time.monotonic() - start
    line = (f"{cfg.loadModelType} -> {cfg.saveModelType} {cfg.saveDir}: {totals.tensors} tensors, "
            f"{totals.bytes / 1e6:.1f} MB, {totals.bytes / 1e6 / max(seconds, 1e-9):.1f} MB/s")
    progress.summary(line)
    report = {"status": "Succeeded", "saveDir": cfg.saveDir, "format": cfg.saveModelType,
              "tensors": totals.tensors, "bytes": totals.bytes, "seconds": round(seconds, 2),
              "layers": target.numLayers}
    if cfg.loadModelType == "mg":
        report.update(loadIteration=source.iteration)
    if cfg.saveModelType == "mg":
        report.update(iteration=iteration, tensorModelParallelSize=tp,
                      pipelineModelParallelSize=cfg.targetPipelineParallelSize,
                      expertModelParallelSize=ep)
    return report


def _temp_dir(save: Path) -> Path:
    """A sibling of saveDir (same filesystem, so the final moves are renames)."""
    parent = save.parent
    parent.mkdir(parents=True, exist_ok=True)
    tmp = parent / f".{save.name}.convert-tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    return tmp


def _move_in(tmp: Path, save: Path) -> None:
    """Move finished HF files into saveDir, the index last: a reader never sees an index without its shards."""
    save.mkdir(parents=True, exist_ok=True)
    names = sorted(p.name for p in tmp.iterdir())
    for name in sorted(names, key=lambda n: (n == "model.safetensors.index.json", n == "config.json", n)):
        os.replace(tmp / name, save / name)
