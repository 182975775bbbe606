"""The docs site and the references into it: the site builds with warnings as errors (``mkdocs build --strict``,
offline), the generated reference pages match the code (``tools/gen_reference.py --check``), and every
``docs/FILE.md "Section"`` / ``docs/FILE.md section N`` / ``README "Section"`` reference in the code, the tests, the
benchmarks and the README names a file and a heading that exist; every exit code the code can end with is listed,
with its meaning, in the CLI reference, the README and ``lab --help``."""

from __future__ import annotations

import dataclasses
import importlib.util
import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCANNED = ("orchestrator", "agents", "envs", "bench", "tests", "tools")
SUFFIXES = (".py", ".sh", ".toml", ".md")


def load_generator():
    """``tools/gen_reference.py`` as a module (tools/ is not a package)."""
    spec = importlib.util.spec_from_file_location("gen_reference", ROOT / "tools" / "gen_reference.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_site_builds_strict(tmp_path):
    """``mkdocs build --strict`` into a tmp dir: a broken link or anchor, a missing nav page or a missing snippet
    fails it; nothing is fetched (no plugin of mkdocs.yml uses the network)."""
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    out = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-q", "-d", str(tmp_path / "site")],
                         cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr
    page = (tmp_path / "site" / "algorithms" / "ppo" / "index.html").read_text()
    assert "<code>time_horizon</code>" in page and "<code>128</code>" in page  # the key table came in by snippet
    assert (tmp_path / "site" / "img" / "ppo_acrobot.png").exists()


def test_benchmarks_page_is_short():
    """docs/BENCHMARKS.md stays a page of figures and commands (about 30 KB at most): detail goes to the page a reader
    looks for it on (an algorithm's results, Envs, Clusters, Search, ...)."""
    assert len((ROOT / "docs" / "BENCHMARKS.md").read_bytes()) <= 30_000


def test_generated_references_are_current():
    """The committed docs/reference pages are what the generator writes from the code now."""
    out = subprocess.run([sys.executable, "tools/gen_reference.py", "--check"], cwd=ROOT, capture_output=True,
                         text=True, timeout=300, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert out.returncode == 0, (out.stdout + out.stderr + "\nregenerate: python tools/gen_reference.py")


def test_docstring_fields_parsed():
    """A ``Fields:`` list: one entry per key, continuation lines joined, ``a / b`` documents both, a paragraph after
    the list is not part of it, RST code becomes Markdown code."""
    gen = load_generator()

    @dataclass
    class Example:
        """Example section.

        Fields:
            alpha: the first, ``code``
                continued here.
            beta / gamma: shared meaning.

        Not a field: text.
        """

        alpha: int = 1

    assert gen.docstring_fields(Example) == {"alpha": "the first, `code` continued here.",
                                             "beta": "shared meaning.", "gamma": "shared meaning."}


def test_undocumented_key_is_reported():
    """A field that no class in the MRO documents makes the generator fail naming it."""
    gen = load_generator()

    @dataclass
    class Base:
        """Fields:
            a: documented in the base.
        """

        a: int = 0

    @dataclass
    class Child(Base):
        """No Fields list."""

        b: int = 0

    assert gen.meaning(Child, "a") == "documented in the base."
    with pytest.raises(gen.UndocumentedKey, match="Child.b"):
        gen.meaning(Child, "b")
    undocumented: list[str] = []
    rows = gen.key_table(Child, undocumented)
    assert undocumented == ["Child.b"]
    assert rows[2] == "| `a` | `int` | `0` |  | SLM-Lab | documented in the base. |"


def test_every_spec_key_has_a_meaning_and_origin():
    """Every field of every spec section dataclass is documented, and a declared origin is a non-empty string."""
    gen = load_generator()
    classes = [gen.MetaSpec, gen.EnvSpec, gen.NetSpec, gen.MemorySpec, gen.AlgorithmSpec,
               *{algo.spec_cls for algo in gen.ALGORITHMS.values()}]
    for cls in classes:
        for f in dataclasses.fields(cls):
            assert gen.meaning(cls, f.name), f"{cls.__name__}.{f.name}"
            assert isinstance(f.metadata.get("origin", "SLM-Lab"), str) and f.metadata.get("origin", "x")


def headings(path: Path) -> list[str]:
    """The Markdown headings of ``path`` (outside fenced code), without their ``#`` marks."""
    out, fenced = [], False
    for line in path.read_text().splitlines():
        if line.startswith("```"):
            fenced = not fenced
        elif not fenced and re.match(r"#{1,6} ", line):
            out.append(line.lstrip("#").strip())
    return out


def section_found(title: str, names: list[str]) -> bool:
    """``title`` starts a heading, with or without the heading's ``N.`` number."""
    return any(re.sub(r"^\d+\.\s+", "", name).startswith(title) or name.startswith(title) for name in names)


FILE_REF = re.compile(r"docs/([\w./-]+\.md)")
QUOTED = re.compile(r'`{0,2},?\s+((?:"[^"]+"(?:,\s*|\s+and\s+)?)+)')
NUMBERED = re.compile(r"`{0,2},?\s+(?:sections?\s+(\d+(?:(?:,\s*|\s+and\s+)\d+)*)|(\d+)\))")
README_REF = re.compile(r'README(?:\.md)?`{0,2}\s+"([^"]+)"')


def doc_references(text: str) -> list[tuple[str, str | None]]:
    """``(file, section)`` pairs referenced in ``text``; section None for a bare file reference, ``"N."`` for a
    numbered section. Lines are joined first (comment markers dropped) so a reference may wrap."""
    flat = re.sub(r"\n\s*(?:#+\s*)?", " ", text)
    refs: list[tuple[str, str | None]] = []
    for match in FILE_REF.finditer(flat):
        name, rest = f"docs/{match.group(1)}", flat[match.end():]
        quoted, numbered = QUOTED.match(rest), NUMBERED.match(rest)
        if quoted:
            refs += [(name, title) for title in re.findall(r'"([^"]+)"', quoted.group(1))]
        elif numbered:
            refs += [(name, f"{n}.") for n in re.findall(r"\d+", numbered.group(1) or numbered.group(2))]
        else:
            refs.append((name, None))
    refs += [("README.md", title) for title in README_REF.findall(flat)]
    return refs


def test_reference_parser():
    """The reference forms the code uses, each parsed to its file and sections."""
    text = ('x (docs/BENCHMARKS.md "Process memory", "Start-up and\n    # exit") y docs/ARCHITECTURE.md sections 3, 7'
            '\n(docs/ARCHITECTURE.md 5) ``docs/SCALING.md`` turns; README "SAC targets"; docs/ARCHITECTURE.md '
            "section 4, item 5")
    assert doc_references(text) == [
        ("docs/BENCHMARKS.md", "Process memory"), ("docs/BENCHMARKS.md", "Start-up and exit"),
        ("docs/ARCHITECTURE.md", "3."), ("docs/ARCHITECTURE.md", "7."), ("docs/ARCHITECTURE.md", "5."),
        ("docs/SCALING.md", None), ("docs/ARCHITECTURE.md", "4."), ("README.md", "SAC targets")]
    assert section_found("Layers", ["2. Layers and modules"]) and section_found("5.", ["5. Resume"])
    assert not section_found("Resume", ["4. The checkpoint protocol"])


def test_doc_references_resolve():
    """Every docs/ and README reference in the code, tests, benchmarks, tools and README names an existing file
    and, where it names one, an existing heading."""
    files = [p for d in SCANNED for p in (ROOT / d).rglob("*") if p.suffix in SUFFIXES and p.is_file()]
    files += [ROOT / "README.md", ROOT / "pyproject.toml"]
    broken, count = [], 0
    for path in files:
        if path == Path(__file__).resolve():
            continue
        for target, section in doc_references(path.read_text(errors="replace")):
            count += 1
            where = f"{path.relative_to(ROOT)}: {target}" + (f' "{section}"' if section else "")
            if not (ROOT / target).is_file():
                broken.append(f"{where}: no such file")
            elif section and not section_found(section, headings(ROOT / target)):
                broken.append(f"{where}: no such heading")
    assert count > 20  # the scan sees the references (a broken pattern would find none)
    assert not broken, "\n".join(broken)


def test_readme_install_story_matches_the_torch_pin():
    """The README's CPU-build command installs the version pyproject.toml pins, from PyTorch's CPU wheel index,
    and the two set-up commands are unchanged by it (``pip install -e .`` first)."""
    import tomllib

    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    (pin,) = [d for d in deps if d.startswith("torch==")]
    readme = (ROOT / "README.md").read_text()
    assert f'pip install "{pin}" --index-url https://download.pytorch.org/whl/cpu' in readme
    assert "--extra-index-url https://download.pytorch.org/whl/cpu" in readme
    commands = [line for line in readme.splitlines() if line.startswith("pip install -e")][:2]
    assert [c.split(" && ")[0] for c in commands] == ["pip install -e .", 'pip install -e ".[test]"']
    assert commands[0].endswith("python run_lab.py specs/demo.json ppo_cartpole dev")


def test_every_test_file_a_docstring_or_page_names_exists():
    """Code, tools, bench scripts and docs name test files by path (``tests/...py``): each one exists."""
    named = {}
    for root in ("orchestrator", "agents", "envs", "tools", "bench", "docs"):
        for path in (ROOT / root).rglob("*"):
            if path.suffix in (".py", ".md"):
                for name in re.findall(r"tests/[A-Za-z0-9_/]+\.py", path.read_text(errors="replace")):
                    named.setdefault(name, path.relative_to(ROOT))
    for name in re.findall(r"tests/[A-Za-z0-9_/]+\.py", (ROOT / "README.md").read_text()):
        named.setdefault(name, "README.md")
    missing = {name: str(where) for name, where in named.items() if not (ROOT / name).exists()}
    assert named and not missing, missing


def exit_codes_in_code() -> set[int]:
    """Every exit code the ``lab`` command can end with, read from the code: integer literals (and ``EXIT_*``
    constants of ``orchestrator.errors``) that ``orchestrator/cli.py`` and the modes return or pass to
    ``sys.exit``/``os._exit``; 0 is every mode's success."""
    import ast

    from orchestrator import errors

    constants = {name: value for name, value in vars(errors).items() if name.startswith("EXIT_")}
    codes = {0}
    for path in [ROOT / "orchestrator" / "cli.py", *sorted((ROOT / "orchestrator" / "modes").glob("*.py"))]:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Return):
                value = node.value
            elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and \
                    node.func.attr in ("exit", "_exit") and node.args:
                value = node.args[0]
            else:
                continue
            if isinstance(value, ast.Constant) and type(value.value) is int:
                codes.add(value.value)
            elif isinstance(value, ast.Name) and value.id in constants:
                codes.add(constants[value.id])
    return codes


def test_every_exit_code_is_documented():
    """The exit codes the code can end with are those the CLI reference, the README and ``lab --help`` (the cli
    docstring) list, each with its meaning."""
    from orchestrator import cli

    codes = exit_codes_in_code()
    assert codes == {0, 1, 2, 75, 130}, codes
    pages = {"docs/reference/cli.md": (ROOT / "docs/reference/cli.md").read_text(),
             "README.md": (ROOT / "README.md").read_text(), "orchestrator/cli.py": cli.__doc__}
    for where, text in pages.items():
        line = " ".join(text[text.index("Exit codes"):].split("\n\n", 1)[0].split())
        documented = {int(c) for c in re.findall(r"(?:^Exit codes[^:]*: |; )(\d+) ", line)}
        assert documented == codes, (where, line)
