"""docs/troubleshooting.md lists every message the lab prints for bad input (exit 2).

The messages are collected from the code by an AST walk over ``orchestrator/``: the first argument of every
``raise UsageError(...)`` / ``SpecError(...)`` / ``LeaseHeldError(...)``, every string appended to a ``...problems``
list, and the strings returned by the functions that build such messages (``*_problem``, ``*_message``). Each
message's leading constant words (up to ``MAX_WORDS`` words of its literal text, in order, the formatted values
between them free) must appear in the page. A message whose text is all formatted values passes another one's
text through and is checked where that one is written."""

from __future__ import annotations

import ast
import json
import re
from dataclasses import dataclass
from pathlib import Path

import pytest

from orchestrator.errors import SpecError
from orchestrator.search.tune import NO_SEARCH_EXAMPLE, param_space
from orchestrator.spec.load import load_spec

ROOT = Path(__file__).resolve().parent.parent
PAGE = ROOT / "docs" / "troubleshooting.md"
ERRORS = {"UsageError", "SpecError", "LeaseHeldError"}
BUILDERS = re.compile(r"(_problem|_message)$")  # functions whose returned strings are messages
# builders whose messages are not bad input: a live search trial's continuation check (a ValueError inside the lab)
NOT_INPUT = {"continue_spec_problem"}
MAX_WORDS = 6
GAP = 12  # words of the page allowed where the code formats a value in (a placeholder such as 'X' or `N`)
WORD = re.compile(r"[A-Za-z0-9_]+")  # words: what a page may quote around them (`code`, quotes, KEY.) is free


@dataclass(frozen=True)
class Message:
    """One message site: ``where`` (file:line) and its literal pieces (None for each formatted value)."""

    where: str
    pieces: tuple[str | None, ...]

    def key(self) -> list[list[str]]:
        """The message's leading constant words, grouped by literal piece (the formatted values between them left
        out), ``MAX_WORDS`` words at most; [] when its literal text has fewer than 2 words."""
        out, count = [], 0
        for piece in self.pieces:
            words = WORD.findall(piece or "")[:MAX_WORDS - count]
            if words:
                out.append(words)
                count += len(words)
            if count == MAX_WORDS:
                break
        return out if count >= 2 else []


def _pieces(node: ast.expr) -> list[str | None]:
    """The literal text pieces of a message expression, in order, None where a value is formatted in."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return [node.value]
    if isinstance(node, ast.JoinedStr):
        return [v.value if isinstance(v, ast.Constant) else None for v in node.values]
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        return _pieces(node.left) + _pieces(node.right)
    return [None]


def _messages(node: ast.expr) -> list[list[str | None]]:
    """The messages of an expression: each element of a list literal (``[first] + rest`` its literal part), both
    branches of ``a if c else b``, else the expression itself."""
    if isinstance(node, (ast.List, ast.Tuple)):
        return [m for e in node.elts for m in _messages(e)]
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add) and isinstance(node.left, ast.List):
        return _messages(node.left)
    if isinstance(node, ast.IfExp):
        return _messages(node.body) + _messages(node.orelse)
    return [_pieces(node)]


def _message_nodes(tree: ast.AST) -> list[ast.expr]:
    """The message expressions of a module (see the module docstring)."""
    found: list[ast.expr] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Raise) and isinstance(node.exc, ast.Call) and node.exc.args \
                and getattr(node.exc.func, "id", None) in ERRORS:
            found.append(node.exc.args[0])
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.args \
                and node.func.attr in ("append", "extend") and isinstance(node.func.value, ast.Name) \
                and node.func.value.id.endswith("problems"):
            found.append(node.args[0])
        elif isinstance(node, ast.AugAssign) and isinstance(node.target, ast.Name) \
                and node.target.id.endswith("problems"):
            found.append(node.value)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and BUILDERS.search(node.name) \
                and node.name not in NOT_INPUT:
            found += [ret.value for ret in ast.walk(node) if isinstance(ret, ast.Return) and ret.value is not None]
    return found


def collect_messages(root: Path = ROOT / "orchestrator") -> list[Message]:
    """Every bad-input message site under ``root`` whose text has a key (see ``Message.key``)."""
    out = []
    for path in sorted(root.rglob("*.py")):
        for node in _message_nodes(ast.parse(path.read_text())):
            for pieces in _messages(node):
                message = Message(f"{path.relative_to(ROOT)}:{node.lineno}", tuple(pieces))
                if message.key():
                    out.append(message)
    return out


def page_words(text: str) -> str:
    """The page as one space-separated lower-case word stream (the same ``WORD`` tokens as the keys)."""
    return " ".join(WORD.findall(text)).lower()


def listed(message: Message, words: str) -> bool:
    """The message's key appears in the page's word stream: each group's words in a row, the groups in order with
    at most ``GAP`` words between them."""
    groups = [r"(?<!\S)" + " ".join(re.escape(w.lower()) for w in group) + r"(?!\S)" for group in message.key()]
    return re.search(rf"(?: \S+){{0,{GAP}}} ".join(groups), words) is not None


def missing(text: str) -> list[str]:
    """The messages of the code whose key ``text`` lacks, as ``file:line: key``."""
    words = page_words(text)
    return [f"{m.where}: {' ... '.join(' '.join(g) for g in m.key())}" for m in collect_messages()
            if not listed(m, words)]


def test_collector_sees_the_messages():
    """The walk finds the raises, problem lists and builders the lab has (a broken walk would find none): a few
    known keys, value for value."""
    keys = {m.where.split(":")[0] + ": " + " | ".join(" ".join(g) for g in m.key()) for m in collect_messages()}
    assert len(keys) > 120
    assert "orchestrator/spec/files.py: spec file | does not exist" in keys
    assert "orchestrator/store/predir.py: name | expected a plain directory name" in keys
    assert "orchestrator/search/pbt_replay.py: trial | the PBT run | has trials" in keys


def test_every_bad_input_message_is_in_troubleshooting():
    """Each message's leading words appear in docs/troubleshooting.md; the failure lists those that do not."""
    gaps = missing(PAGE.read_text())
    assert not gaps, "add these messages (and what to do) to docs/troubleshooting.md:\n" + "\n".join(gaps)


def test_a_message_removed_from_the_page_is_reported():
    """The check can fail: the page without its ``--pbt-replay`` and ``--name`` rows misses their messages."""
    text = PAGE.read_text()
    kept = "\n".join(line for line in text.splitlines() if "--pbt-replay" not in line and "--name '" not in line)
    gaps = missing(kept)
    assert any("pbt_replay.py" in gap for gap in gaps), gaps
    assert any("orchestrator/store/predir.py" in gap and "plain directory" in gap for gap in gaps), gaps


def test_no_search_section_example_runs_with_every_search_method():
    """The example the "no search section" error suggests is a search section that the basic search and PBT and
    PB2 all accept on the demo spec (a ``grid_search`` example would be refused by PBT)."""
    demo = str(ROOT / "specs" / "demo.json")
    with pytest.raises(SpecError, match="no search section; use train mode, or add e.g. \"search\""):
        param_space(load_spec(demo, "ppo_cartpole"))
    search = json.dumps(json.loads("{" + NO_SEARCH_EXAMPLE + "}")["search"])
    population = ["meta.max_trial=4", "meta.max_session=1", "env.max_frame=4096", "meta.log_frequency=256",
                  "meta.checkpoint_frequency=256", f"search={search}"]
    for scheduler in (None, "PBT", "PB2"):
        extra = [] if scheduler is None else \
            [f'meta.search_scheduler={{"name": "{scheduler}", "perturbation_interval": 1024}}']
        spec = load_spec(demo, "ppo_cartpole", population + extra)
        assert list(param_space(spec)) == ["agent.net.optim_spec.lr"]
