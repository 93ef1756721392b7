"""What the README and docs/ tell a reader to type or apply still works with the code (issue 39): a page that
drifts from the CLI, the API or the Makefile fails here, not in a reader's terminal.

For README.md and every docs/**/*.md page:

* every fenced ``yaml`` block is whole Kubernetes documents (apiVersion, kind, metadata.name), and those of our
  API group pass ``validate_text``, the check ``ascend-train validate`` makes; a part of a document is marked
  ``<!-- snippet -->`` on the line before its fence, and the marker is refused on whole documents. A snippet that
  has ``spec:`` must not name a field no kind's schema knows;
* every ``ascend-train`` / ``ascend-engine`` command in a ``bash``/``sh``/``shell``/``console`` block (also behind
  ``torchrun ... -m ascend_engine`` or ``python -m ascend_engine``) parses with the real argument parser, built
  without running anything; every ``make TARGET`` there, or in inline code, is a target of the Makefile;
* every relative link points at a file or folder that exists, and its ``#anchor`` at a heading there;
* every ``examples/*.yaml`` is named by some page.

Nothing runs here: test_docs_commands.py runs every shell block as written, except those marked on the line
before their fence with ``<!-- needs: real cluster -->``, ``needs: device``, ``needs: data``, ``needs: local
cluster`` or ``excerpt``; those are parsed like the rest.
"""
from __future__ import annotations

import argparse
import contextlib
import functools
import importlib
import io
import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import yaml

from ascend_engine.cli import COMMANDS as ENGINE_COMMANDS
from ascend_operator.api.crdgen import crd
from ascend_operator.api.group import API_GROUP
from ascend_operator.api.resources import RESOURCES
from ascend_operator.validation import _unknown_fields, validate_text
from ascend_train.cli import build_parser as ascend_train_parser

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
MARKERS = {"snippet", "needs: real cluster", "needs: device", "needs: data", "needs: local cluster", "excerpt",
           "output"}
SHELLS = {"bash", "sh", "shell", "console"}
FENCE = re.compile(r"^(\s*)(```+|~~~+)\s*([\w+-]*)\s*$")
COMMENT = re.compile(r"^\s*<!--\s*(.*?)\s*-->\s*$")


@dataclass
class Block:
    page: Path
    line: int                       # the fence's line, 1-based
    lang: str
    text: str
    markers: set[str] = field(default_factory=set)

    def where(self, offset: int = 0) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line + offset}"


def rel(page: Path) -> str:
    return page.relative_to(ROOT).as_posix()


@functools.cache
def blocks(page: Path) -> list[Block]:
    """The page's fenced code blocks, each with the markers in the HTML comments just above its fence."""
    lines = page.read_text().splitlines()
    found, n = [], 0
    while n < len(lines):
        match = FENCE.match(lines[n])
        if not match:
            n += 1
            continue
        indent, fence, lang = match.groups()
        start, body = n, []
        n += 1
        while n < len(lines) and not lines[n].strip().startswith(fence):
            body.append(lines[n][len(indent):] if lines[n].startswith(indent) else lines[n].lstrip())
            n += 1
        markers, up = set(), start - 1
        while up >= 0 and (not lines[up].strip() or COMMENT.match(lines[up])):
            if COMMENT.match(lines[up]):
                markers.add(COMMENT.match(lines[up]).group(1))
            up -= 1
        found.append(Block(page, start + 1, lang.lower(), "\n".join(body) + "\n", markers))
        n += 1
    return found


@functools.cache
def prose(page: Path) -> str:
    """The page without its fenced blocks (their lines kept empty, so line numbers stay) and inline code."""
    lines = page.read_text().splitlines()
    for block in blocks(page):
        end = block.line + block.text.count("\n")
        for n in range(block.line - 1, min(end + 1, len(lines))):
            lines[n] = ""
    return "\n".join(lines)


def page_ids() -> list[str]:
    return [rel(p) for p in PAGES]


# ------------------------------------------------------------------ (a) YAML blocks


def _whole(doc) -> bool:
    return (isinstance(doc, dict) and bool(doc.get("apiVersion")) and bool(doc.get("kind"))
            and isinstance(doc.get("metadata"), dict) and bool(doc["metadata"].get("name")))


@functools.cache
def _schemas() -> dict[str, dict]:
    return {kind: crd(resource)["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
            for kind, resource in RESOURCES.items()}


@pytest.mark.parametrize("page", PAGES, ids=page_ids())
def test_yaml_blocks_are_valid_documents_or_marked_snippets(page):
    problems = []
    for block in blocks(page):
        if block.lang not in ("yaml", "yml"):
            continue
        try:
            docs = [d for d in yaml.safe_load_all(block.text) if d is not None]
        except yaml.YAMLError as exc:
            mark = getattr(exc, "problem_mark", None)
            problems.append(f"{block.where(mark.line + 1 if mark else 0)}: not YAML: {exc}")
            continue
        whole = bool(docs) and all(_whole(d) for d in docs)
        if "snippet" in block.markers:
            if whole:
                problems.append(f"{block.where()}: marked <!-- snippet --> but holds whole documents; drop the "
                                "marker so the block is validated")
            for doc in docs:  # a snippet of a spec still names only fields the API knows
                if isinstance(doc, dict) and isinstance(doc.get("spec"), dict):
                    unknown = [[(path, message) for path, message in _unknown_fields({"spec": doc["spec"]}, schema, ())
                                if path[-1] != "..."]  # `train: {...}`: the rest left out
                               for schema in _schemas().values()]
                    if all(unknown):
                        path, message = min(unknown, key=len)[0]
                        problems.append(f"{block.where()}: {'.'.join(map(str, path))}: {message}")
            continue
        if not whole:
            problems.append(f"{block.where()}: not whole Kubernetes documents (apiVersion, kind, metadata.name); "
                            "mark a part of one with <!-- snippet --> on the line before the fence")
            continue
        if any(str(d["apiVersion"]).split("/")[0] == API_GROUP for d in docs):
            _, found = validate_text(block.text, rel(page))
            problems += [f"{block.where(p.line or 0)}: {p.field}: {p.message}" for p in found]
    assert not problems, "\n".join(problems)


def test_markers_are_known():
    unknown = [f"{block.where()}: <!-- {marker} -->" for page in PAGES for block in blocks(page)
               for marker in block.markers if marker not in MARKERS]
    assert not unknown, f"markers are {sorted(MARKERS)}:\n" + "\n".join(unknown)


# ------------------------------------------------------------------ (b, c) commands


def engine_parser(command: str) -> argparse.ArgumentParser:
    """``ascend-engine``'s parser as its ``main`` builds it, with the chosen command's arguments."""
    return _engine_parser(command if command in ENGINE_COMMANDS else None)


@functools.cache
def _engine_parser(command: str | None) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="ascend-engine")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, (module, help_text) in ENGINE_COMMANDS.items():
        p = sub.add_parser(name, help=help_text)
        if name == command:
            importlib.import_module(module).add_arguments(p)
    return parser


@functools.cache
def _train_parser() -> argparse.ArgumentParser:
    return ascend_train_parser()


def _parse(parser: argparse.ArgumentParser, argv: list[str], known_only: bool) -> str | None:
    """None when the command line parses, else argparse's complaint."""
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            if known_only:
                _, unknown = parser.parse_known_args(argv)
                if unknown:  # the engine's main refuses these the same way
                    return f"unrecognized arguments: {' '.join(unknown)}"
            else:
                parser.parse_args(argv)
    except SystemExit as exc:
        if exc.code == 0:  # --help
            return None
        return err.getvalue().strip().splitlines()[-1] if err.getvalue().strip() else f"exit {exc.code}"
    return None


def _open_quote(text: str) -> bool:
    try:
        shlex.split(text, comments=True)
    except ValueError:
        return True
    return False


def command_lines(block: Block) -> list[tuple[int, str]]:
    """(line offset, command line) for a shell block: continuation lines and quoted strings that span lines
    (``GPT_ARGS="..."`` in a launch script) joined; in a console block only the lines after a ``$`` prompt."""
    out, pending, first = [], "", 0
    for offset, raw in enumerate(block.text.splitlines(), start=1):
        line = raw
        if block.lang == "console" and not pending:
            if not line.lstrip().startswith("$ "):
                continue
            line = line.lstrip()[2:]
        if not pending:
            first = offset
        if line.rstrip().endswith("\\"):
            pending += line.rstrip()[:-1] + " "
            continue
        if _open_quote(pending + line):
            pending += line + "\n"
            continue
        out.append((first, pending + line))
        pending = ""
    if pending:
        out.append((first, pending))
    return out


def simple_commands(line: str) -> list[list[str]]:
    """A command line split at ``;``, ``&&``, ``||``, ``|`` and ``&`` into words (comments dropped)."""
    lexer = shlex.shlex(line, posix=True, punctuation_chars=";&|")
    lexer.whitespace_split = True
    commands, words = [], []
    for token in lexer:
        if token and set(token) <= set(";&|"):
            commands.append(words)
            words = []
        else:
            words.append(token)
    commands.append(words)
    wrappers = {"sudo", "env", "time", "exec", "nohup"}
    result = []
    for words in commands:
        while words and (re.match(r"^[A-Za-z_][A-Za-z0-9_]*=", words[0]) or words[0] in wrappers):
            words = words[1:]
        if words:
            result.append(words)
    return result


def check_command(words: list[str], targets: set[str]) -> str | None:
    program = Path(words[0]).name
    if program == "ascend-train":
        return _parse(_train_parser(), words[1:], known_only=False)
    if program == "ascend-engine" or (program in ("torchrun", "python", "python3")
                                       and "-m" in words[:-1] and words[words.index("-m") + 1] == "ascend_engine"):
        argv = words[1:] if program == "ascend-engine" else words[words.index("-m") + 2:]
        return _parse(engine_parser(argv[0] if argv else ""), argv, known_only=True)
    if program == "make":
        missing = [w for w in words[1:] if not w.startswith("-") and "=" not in w and w not in targets]
        return f"no Makefile target {', '.join(missing)}" if missing else None
    return None


@functools.cache
def make_targets() -> set[str]:
    text = (ROOT / "Makefile").read_text()
    return {t for line in re.findall(r"^([A-Za-z0-9_.\- ]+):(?!=)", text, re.M) for t in line.split()}


def test_the_command_checks_catch_drift():
    """The checks themselves: a misspelt flag, a missing subcommand and a missing target are caught."""
    targets = make_targets()
    assert {"demo", "test", "crds"} <= targets
    assert check_command(["ascend-train", "validate", "-f", "job.yaml"], targets) is None
    assert check_command(["ascend-train", "get", "atj", "x", "-o", "yaml"], targets)
    assert check_command(["ascend-engine", "import", "x.sh"], targets)
    assert check_command(["ascend-engine", "train", "--tensor-model-paralel-size", "2"], targets)
    assert check_command(["torchrun", "--nproc-per-node", "2", "-m", "ascend_engine", "train",
                          "--tensor-model-parallel-size", "2"], targets) is None
    assert check_command(["make", "no-such-target"], targets)
    assert simple_commands("A=1 ascend-train local up & ascend-train get atj # note") == \
        [["ascend-train", "local", "up"], ["ascend-train", "get", "atj"]]
    script = Block(ROOT / "README.md", 1, "bash", 'GPT_ARGS="\n    --tp 2 \\\n"\nascend-train get atj \\\n  -A\n')
    assert [line.split() for _, line in command_lines(script)][-1] == ["ascend-train", "get", "atj", "-A"]


@pytest.mark.parametrize("page", PAGES, ids=page_ids())
def test_documented_commands_parse(page):
    targets, problems = make_targets(), []
    for block in blocks(page):
        if block.lang not in SHELLS:
            continue
        for offset, line in command_lines(block):
            try:
                commands = simple_commands(line)
            except ValueError as exc:  # unbalanced quotes
                problems.append(f"{block.where(offset)}: {exc}: {line.strip()}")
                continue
            for words in commands:
                problem = check_command(words, targets)
                if problem:
                    problems.append(f"{block.where(offset)}: {' '.join(words)}\n    {problem}")
    for match in re.finditer(r"`(make(?: [\w.-]+)+)`", prose(page)):
        problem = check_command(match.group(1).split(), targets)
        if problem:
            problems.append(f"{rel(page)}:{prose(page).count(chr(10), 0, match.start()) + 1}: {problem}")
    assert not problems, "\n".join(problems)


# ------------------------------------------------------------------ (d) links


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: links reduced to their text, lower case, punctuation dropped, spaces to -."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading.strip()).lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


@functools.cache
def anchors(page: Path) -> set[str]:
    found: set[str] = set()
    counts: dict[str, int] = {}
    for line in prose(page).splitlines():
        match = re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
        if match:  # a repeated heading gets -1, -2, ... as on GitHub
            base = slug(match.group(1))
            found.add(f"{base}-{counts[base]}" if base in counts else base)
            counts[base] = counts.get(base, 0) + 1
    return found


LINK = re.compile(r"\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")


@pytest.mark.parametrize("page", PAGES, ids=page_ids())
def test_relative_links_resolve(page):
    text = re.sub(r"`[^`\n]*`", "", prose(page))
    problems = []
    for match in LINK.finditer(text):
        target = match.group(1)
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:
            continue
        path, _, anchor = target.partition("#")
        where = f"{rel(page)}:{text.count(chr(10), 0, match.start()) + 1}"
        dest = (page.parent / path).resolve() if path else page
        if not dest.exists():
            problems.append(f"{where}: {target}: no such file")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            problems.append(f"{where}: {target}: no heading #{anchor} in {rel(dest)}")
    assert not problems, "\n".join(problems)


# ------------------------------------------------------------------ (e) examples


def test_every_example_is_named_by_a_page():
    text = "\n".join(p.read_text() for p in PAGES)
    unnamed = [p.name for p in sorted((ROOT / "examples").glob("*.yaml")) if f"examples/{p.name}" not in text]
    assert not unnamed, f"no page names {unnamed}"


@pytest.mark.parametrize("example", sorted((ROOT / "examples").glob("*.yaml")), ids=lambda p: p.name)
def test_commands_quoted_in_example_comments_parse(example):
    """A command an example's comment tells the reader to run (`ascend-train get atj grpo`) parses too."""
    targets, problems = make_targets(), []
    for number, line in enumerate(example.read_text().splitlines(), 1):
        if not line.lstrip().startswith("#"):
            continue
        for quoted in re.findall(r"`([^`]+)`", line):
            for words in simple_commands(quoted):
                if (problem := check_command(words, targets)):
                    problems.append(f"examples/{example.name}:{number}: {quoted}\n    {problem}")
    assert not problems, "\n".join(problems)
