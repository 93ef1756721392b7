"""``ascend-engine import-script tune_xxx.sh -o job.yaml``: a MindSpeed-LLM launch script -> AscendTrainJob.

By default the launch is translated to the engine's ``train`` config; ``--keep-as-is --image IMAGE`` keeps the
script's own ``torchrun ... pretrain_gpt.py`` line as the job's ``trainer`` instead (importer/keep.py). An
evaluation or generation script becomes an evaluation job or a generate command (importer/inference.py).

The YAML starts with comments listing every flag that was not imported (and why) and the paths the job
uses, which need volumes; the same list goes to stderr.
"""
from __future__ import annotations

import argparse
import os
import shlex
import sys
import tempfile
from pathlib import Path

import yaml

from ..config.loader import ConfigError
from .accelerations import NO_EFFECT_REASON
from .job import import_script
from .keep import import_as_is
from .parts import DEFAULT_IMAGE, DEFAULT_RUNTIME, ImportedJob


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("script", help="the launch script (tune_*.sh, pretrain_*.sh; evaluate_*.sh -> an "
                                       "evaluation job; generate_*.sh -> an ascend-engine generate command)")
    parser.add_argument("-o", "--output", help="write the manifest (for generate_*.sh a shell script) here "
                                               "(default: stdout)")
    parser.add_argument("--image", help="image for the pods (default: the Dockerfile's engine-ascend target; "
                                            "with --keep-as-is, required: your MindSpeed-LLM image)")
    parser.add_argument("--runtime", default=DEFAULT_RUNTIME, metavar="NAME",
                        help="the ClusterAscendTrainingRuntime the resources name instead of an image (default: "
                             "%(default)s, the chart's Ascend 910B runtime: the engine's image, devices and HCCL); "
                             "'' names none and writes the engine's image; ignored with --image")
    parser.add_argument("--keep-as-is", action="store_true",
                        help="keep the script's torchrun line as the job's trainer (your image runs your code) "
                             "instead of translating it to the engine")
    parser.add_argument("--workdir", help="--keep-as-is: the container's working directory (the MindSpeed-LLM "
                                          "checkout that has pretrain_gpt.py)")
    parser.add_argument("--name", help="metadata.name (default: from the script's file name)")
    parser.add_argument("--namespace", help="metadata.namespace")
    parser.add_argument("--set", dest="preset", action="append", default=[], metavar="VAR=VALUE",
                        help="override a script variable before evaluation, e.g. --set NNODES=2 (repeatable)")
    parser.add_argument("--strict", action="store_true", help="exit 1 when any flag could not be imported")
    parser.add_argument("--allow-incomplete", action="store_true",
                        help="write the manifest even when it would not train what the script trains "
                             "(unresolved model shape, data or device count; unset variables)")


def _preset(pairs: list[str]) -> dict[str, str]:
    out = {}
    for pair in pairs:
        name, eq, value = pair.partition("=")
        if not eq or not name:
            raise ConfigError(f"--set {pair}: expected VAR=VALUE")
        out[name] = value
    return out


def render(job: ImportedJob, source: str) -> str:
    """The manifest (or, for a generation script, a shell script) with what was left behind as comments."""
    lines = ["#!/bin/sh"] if job.command_line else []
    lines.append(f"# Imported from {source} by `ascend-engine import-script`.")
    if job.gaps:
        lines.append("# INCOMPLETE (written with --allow-incomplete): this job would not train what the script trains:")
        lines += [f"#   {g}" for g in job.gaps]
    if job.skipped:
        lines.append(f"# Flags not imported ({len(job.skipped)}):")
        lines += [f"#   {s}" for s in job.skipped]
    if job.no_effect:
        lines.append(f"# No effect here ({NO_EFFECT_REASON}): {' '.join(job.no_effect)}")
    if job.notes:
        lines.append("# Not carried over:")
        lines += [f"#   {n}" for n in job.notes]
    if job.paths:
        lines.append("# Paths the command reads:" if job.command_line else
                     "# Paths the job uses; mount them with spec.volumes / spec.volumeMounts:")
        lines += [f"#   {p}" for p in job.paths]
    if job.command_line:
        lines += ["# Usage: sh THIS_FILE 'the prompt to continue'", shlex.join(job.command_line) + ' "$1"']
        return "\n".join(lines) + "\n"
    return "\n".join(lines) + "\n" + yaml.safe_dump_all(job.documents, sort_keys=False, allow_unicode=True)


def _write_atomically(path: Path, text: str) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent if str(path.parent) else ".", prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise


def run(args: argparse.Namespace) -> int:
    try:
        text = Path(args.script).read_text(encoding="utf-8")
    except OSError as e:
        raise ConfigError(f"{args.script}: cannot read script: {e.strerror}") from None
    if args.keep_as_is:
        if not args.image:
            raise ConfigError("--keep-as-is runs the script's own code: give the image that has it with --image")
        job = import_as_is(text, args.script, image=args.image, name=args.name, namespace=args.namespace,
                           preset=_preset(args.preset), workdir=args.workdir)
    else:
        job = import_script(text, args.script, image=args.image or DEFAULT_IMAGE,
                            name=args.name, namespace=args.namespace, preset=_preset(args.preset))
        if args.runtime and not args.image:
            job.name_runtime(args.runtime)
    for s in job.skipped:
        print(f"not imported: {s}", file=sys.stderr)
    if job.no_effect:
        print(f"no effect here ({NO_EFFECT_REASON}): {' '.join(job.no_effect)}", file=sys.stderr)
    for note in job.notes:
        print(f"note: {note}", file=sys.stderr)
    for gap in job.gaps:
        print(f"error: {gap}", file=sys.stderr)
    if job.gaps and not args.allow_incomplete:
        print(f"import-script: {args.script}: the job would not train what the script trains; nothing written "
              "(--allow-incomplete writes it anyway)", file=sys.stderr)
        return 1
    document = render(job, args.script)
    if args.output:
        _write_atomically(Path(args.output), document)
    else:
        sys.stdout.write(document)
    kinds = ", ".join(f"{d['kind']} {d['metadata']['name']}" for d in job.documents)
    if job.manifest and args.keep_as_is:
        spec = job.manifest["spec"]
        print(f"import-script: {args.script} -> {args.output or 'stdout'}: {kinds}; the script's own trainer, "
              f"{len(spec['trainer']['args'])} arguments kept, {spec['nnodes']} x {spec['nprocPerNode']} devices",
              file=sys.stderr)
    elif job.command_line:
        print(f"import-script: {args.script} -> {args.output or 'stdout'}: an ascend-engine generate command "
              f"({len(job.skipped)} flags not imported)", file=sys.stderr)
    elif job.manifest and "evaluation" in job.manifest["spec"]:
        spec = job.manifest["spec"]
        print(f"import-script: {args.script} -> {args.output or 'stdout'}: {kinds}; evaluation of "
              f"{', '.join(spec['evaluation']['task'])}, {spec['nnodes']} x {spec['nprocPerNode']} devices, "
              f"{len(job.skipped)} flags not imported", file=sys.stderr)
    elif job.manifest:
        spec = job.manifest["spec"]
        print(f"import-script: {args.script} -> {args.output or 'stdout'}: {kinds}; {job.mapped_count()} training "
              f"settings, {spec['nnodes']} x {spec['nprocPerNode']} devices, {len(job.skipped)} flags not imported",
              file=sys.stderr)
    else:
        print(f"import-script: {args.script} -> {args.output or 'stdout'}: {kinds}", file=sys.stderr)
    return 1 if args.strict and job.skipped else 0
