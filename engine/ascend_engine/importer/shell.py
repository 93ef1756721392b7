"""Just enough of bash to read a MindSpeed-LLM launch script without running it.

The scripts are straight-line: variable assignments (``TP=2``, ``GPT_ARGS="..."`` spanning lines),
``export``, ``$((...))`` arithmetic, ``$VAR`` / ``${VAR}`` / ``${VAR:-default}`` expansion, quotes, comments,
backslash line continuations, pipes (``| tee log``) and redirections. This module evaluates exactly that, in
order, and returns the variables and the simple commands with their words expanded and split as bash would.
What it cannot evaluate (command substitution, positional parameters) is kept as written and reported.
"""
from __future__ import annotations

import ast
import operator
import re
from dataclasses import dataclass, field

_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_ASSIGNMENT = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)=")
_DECLARE = {"export", "declare", "local", "readonly", "typeset"}
_END = "\x00"  # what peek() sees past the end; in no character class below


class ScriptError(ValueError):
    """The script cannot be read; the message names the line."""


@dataclass
class Command:
    words: list[str]
    line: int


@dataclass
class Script:
    variables: dict[str, str] = field(default_factory=dict)
    exported: list[str] = field(default_factory=list)
    commands: list[Command] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    unset: dict[str, int] = field(default_factory=dict)  # variables used but never set -> first line


_ARITH_OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul,
              ast.FloorDiv: operator.floordiv, ast.Div: operator.floordiv, ast.Mod: operator.mod,
              ast.Pow: operator.pow}


def _arithmetic(expr: str, variables: dict[str, str], line: int) -> str:
    """Integer arithmetic as in ``$(( ))``; bare names are variables (unset or empty -> 0)."""
    def value(node: ast.AST) -> int:
        if isinstance(node, ast.Constant) and isinstance(node.value, int):
            return node.value
        if isinstance(node, ast.Name):
            text = variables.get(node.id, "").strip() or "0"
            return _arithmetic_int(text, variables, line)
        if isinstance(node, ast.BinOp) and type(node.op) in _ARITH_OPS:
            return _ARITH_OPS[type(node.op)](value(node.left), value(node.right))
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
            return -value(node.operand) if isinstance(node.op, ast.USub) else value(node.operand)
        raise ScriptError(f"line {line}: cannot evaluate $(( {expr} ))")

    try:
        tree = ast.parse(expr.strip().replace("/", "//"), mode="eval")
    except SyntaxError:
        raise ScriptError(f"line {line}: cannot evaluate $(( {expr} ))") from None
    return str(value(tree.body))


def _arithmetic_int(text: str, variables: dict[str, str], line: int) -> int:
    return int(text) if re.fullmatch(r"-?\d+", text) else int(_arithmetic(text, variables, line))


class _Reader:
    """One pass over the text; assignments take effect as they are read, as in bash."""

    def __init__(self, text: str, preset: dict[str, str]):
        self.text, self.i, self.line = text, 0, 1
        self.script = Script(variables=dict(preset))
        self.preset = set(preset)  # values given by the caller win over the script's own assignments

    # -------------------------------------------------------------- characters
    def peek(self, k: int = 0) -> str:
        j = self.i + k
        return self.text[j] if j < len(self.text) else _END

    def take(self) -> str:
        ch = self.text[self.i]
        self.i += 1
        if ch == "\n":
            self.line += 1
        return ch

    # -------------------------------------------------------------- expansions
    def expand_dollar(self) -> tuple[str, bool]:
        """After a ``$``: the expanded text and whether it came out of an expansion (subject to splitting)."""
        v = self.script.variables
        if self.text.startswith("((", self.i):
            end = self.text.find("))", self.i + 2)
            if end < 0:
                raise ScriptError(f"line {self.line}: unterminated $((")
            expr = self.text[self.i + 2:end]
            self.i = end + 2
            expanded = re.sub(r"\$\{?([A-Za-z_][A-Za-z0-9_]*)\}?", lambda m: v.get(m.group(1), ""), expr)
            return _arithmetic(expanded, v, self.line), True
        if self.peek() == "(":
            depth, start = 0, self.i
            while self.i < len(self.text):
                ch = self.take()
                depth += ch == "("
                depth -= ch == ")"
                if depth == 0:
                    break
            raw = "$" + self.text[start:self.i]
            self.script.warnings.append(f"line {self.line}: command substitution {raw} kept as written")
            return raw, False
        if self.peek() == "{":
            end = self.text.find("}", self.i)
            if end < 0:
                raise ScriptError(f"line {self.line}: unterminated ${{")
            body = self.text[self.i + 1:end]
            self.i = end + 1
            name, _, default = body.partition(":-")
            if not _NAME.fullmatch(name):
                self.script.warnings.append(f"line {self.line}: ${{{body}}} is not supported; left empty")
                return "", True
            return self.lookup(name, default if ":-" in body else None), True
        m = _NAME.match(self.text, self.i)
        if m:
            self.i = m.end()
            return self.lookup(m.group(0), None), True
        if self.peek().isdigit() or self.peek() in "@*#?$!":
            self.script.warnings.append(f"line {self.line}: ${self.take()} (a parameter of the shell) left empty")
            return "", True
        return "$", False

    def lookup(self, name: str, default: str | None) -> str:
        value = self.script.variables.get(name)
        if value is None or (default is not None and value == ""):
            if default is None:
                self.script.warnings.append(f"line {self.line}: ${name} is not set in the script; left empty")
                self.script.unset.setdefault(name, self.line)
                return ""
            return default
        return value

    # -------------------------------------------------------------- words
    def read_word(self, assignment: bool) -> list[str] | None:
        """The next word, split into fields where unquoted expansions contain blanks (not in assignments).

        Returns None at a command separator or end of line (already consumed by the caller's check)."""
        fields: list[str] = []
        current, has_content = "", False
        while self.i < len(self.text):
            ch = self.peek()
            if ch in " \t\n;|&<>":
                break
            if ch == "\\":
                self.take()
                nxt = self.take() if self.i < len(self.text) else ""  # a trailing backslash is dropped
                if nxt != "\n":
                    current += nxt
                    has_content = True
                continue
            if ch == "'":
                self.take()
                end = self.text.find("'", self.i)
                if end < 0:
                    raise ScriptError(f"line {self.line}: unterminated single quote")
                chunk = self.text[self.i:end]
                self.line += chunk.count("\n")
                self.i = end + 1
                current += chunk
                has_content = True
                continue
            if ch == '"':
                self.take()
                current += self.read_double_quoted()
                has_content = True
                continue
            if ch == "$":
                self.take()
                text, splittable = self.expand_dollar()
                if splittable and not assignment:
                    parts = text.split()
                    if text[:1].isspace() and (current or has_content):
                        fields.append(current)
                        current, has_content = "", False
                    for k, part in enumerate(parts):
                        if k:
                            fields.append(current)
                            current = ""
                        current += part
                        has_content = True
                    if parts and text[-1:].isspace():
                        fields.append(current)
                        current, has_content = "", False
                else:
                    current += text
                    has_content = has_content or bool(text)
                continue
            current += self.take()
            has_content = True
        if has_content:
            fields.append(current)
        return fields

    def read_double_quoted(self) -> str:
        out = ""
        while True:
            if self.i >= len(self.text):
                raise ScriptError(f"line {self.line}: unterminated double quote")
            ch = self.take()
            if ch == '"':
                return out
            if ch == "\\" and self.peek() in '$`"\\\n':
                nxt = self.take()
                out += "" if nxt == "\n" else nxt
            elif ch == "$":
                out += self.expand_dollar()[0]
            else:
                out += ch

    def skip_redirection(self) -> None:
        while self.peek() in "<>&":
            self.take()
        while self.peek() in " \t":
            self.take()
        if self.peek() not in "\n;|" + _END:
            self.read_word(assignment=True)

    # -------------------------------------------------------------- commands
    def run(self) -> Script:
        words: list[str] = []
        start_line = self.line
        assignments: list[tuple[str, str]] = []
        while True:
            ch = self.peek()
            if ch in " \t":
                self.take()
                continue
            if ch == "\\" and self.peek(1) == "\n":
                self.take(), self.take()
                continue
            if ch == "#":
                while self.peek() not in ("\n", _END):
                    self.take()
                continue
            if ch in ("\n", ";", "|", "&", _END):
                self.finish(words, assignments, start_line)
                if ch == _END:
                    return self.script
                self.take()
                words, assignments, start_line = [], [], self.line
                continue
            if ch in "<>":
                if words and words[-1].isdigit():
                    words.pop()  # the fd number of `2>&1`
                self.skip_redirection()
                continue
            m = _ASSIGNMENT.match(self.text, self.i)
            if m and (not words or words[0] in _DECLARE):
                self.i = m.end()
                value = "".join(self.read_word(assignment=True) or [])
                if not words:
                    assignments.append((m.group(1), value))
                    self.assign(m.group(1), value)
                else:
                    self.assign(m.group(1), value)
                    words.append(f"{m.group(1)}={value}")
                continue
            words.extend(self.read_word(assignment=False) or [])

    def assign(self, name: str, value: str) -> None:
        if name not in self.preset:
            self.script.variables[name] = value

    def finish(self, words: list[str], assignments: list, line: int) -> None:
        if not words:
            return
        if words[0] in _DECLARE:
            if words[0] == "export":
                for w in words[1:]:
                    name = w.split("=", 1)[0]
                    if _NAME.fullmatch(name) and name not in self.script.exported:
                        self.script.exported.append(name)
            return
        self.script.commands.append(Command(words, line))


def read_script(text: str, preset: dict[str, str] | None = None) -> Script:
    """Evaluate ``text``; ``preset`` variables override the script's own assignments (``--set NODE_RANK=0``)."""
    return _Reader(text, preset or {}).run()
