"""The command line parsed once: ``cli.parse`` builds one frozen ``Command`` (the mode word split at its first ``@``,
the options typed) that the mode receives as it is; the mode table ``cli.MODES`` makes the parser's help, ``--help``,
the unknown-mode message and docs/reference/cli.md, so a row added to it shows everywhere and runs."""

import dataclasses
from pathlib import Path

import pytest

from orchestrator import cli
from orchestrator.commandline import Command, split_mode
from orchestrator.spec.session_spec import parse_target

REPO = Path(__file__).resolve().parents[2]
DEMO = str(REPO / "specs" / "demo.json")


def test_parse_builds_a_frozen_command_with_the_mode_word_split_once(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    cmd = cli.parse([DEMO, "ppo_cartpole", "train@latest", "-s", "env.max_frame=400", "-s", "meta.max_session=2",
                     "--data-dir", "runs", "--allow-fresh", "--quiet"])
    assert isinstance(cmd, Command)
    assert (cmd.spec_file, cmd.spec_name, cmd.word, cmd.mode, cmd.target) == (DEMO, "ppo_cartpole", "train@latest",
                                                                             "train", "latest")
    assert cmd.overrides == ("env.max_frame=400", "meta.max_session=2")
    assert cmd.data_dir == str(tmp_path / "runs")  # absolute: actors may run in another working directory
    assert (cmd.allow_fresh, cmd.quiet, cmd.name, cmd.address, cmd.episodes) == (True, True, None, None, None)
    with pytest.raises(dataclasses.FrozenInstanceError):
        cmd.target = "elsewhere"
    with pytest.raises(dataclasses.FrozenInstanceError):
        cmd.overrides = ()


def test_train_with_a_name_and_a_predir_target():
    named = cli.parse([DEMO, "ppo_cartpole", "train", "--name", "job-7", "--data-dir", "s3://bucket/runs"])
    assert (named.mode, named.target, named.name, named.data_dir) == ("train", None, "job-7", "s3://bucket/runs")
    resumed = cli.parse([DEMO, "ppo_cartpole", "train@/d/ppo_cartpole_2026_01_01_000000"])
    assert (resumed.mode, resumed.target) == ("train", "/d/ppo_cartpole_2026_01_01_000000")
    assert split_mode("train@") == ("train", "") and split_mode("dev") == ("dev", None)


def test_enjoy_target_keeps_its_checkpoint_suffix_for_the_enjoy_mode():
    cmd = cli.parse([DEMO, "ppo_cartpole", "enjoy@/d/run/ppo_cartpole_t0_s1_spec.json@latest", "--episodes", "3",
                     "--seed", "9"])
    assert (cmd.mode, cmd.target, cmd.episodes, cmd.seed) == ("enjoy", "/d/run/ppo_cartpole_t0_s1_spec.json@latest",
                                                              3, 9)
    assert parse_target(cmd.target, cmd.ckpt) == ("/d/run/ppo_cartpole_t0_s1_spec.json", "latest")
    assert parse_target("/d/run/ppo_cartpole_t0_s1_spec.json", None)[1] == "best"


def probe_row(seen: list) -> cli.Mode:
    """A mode row that records the command it runs and exits 0 (no spec check)."""
    return cli.Mode("probe", True, (("probe", "a probe mode for tests"), ("probe@THING", "the probe of THING")),
                    lambda cmd: seen.append(cmd) or 0, preflight=False)


def test_a_row_added_to_the_mode_table_is_in_help_and_runs_with_the_one_command(monkeypatch, capsys):
    seen: list[Command] = []
    monkeypatch.setattr(cli, "MODES", (*cli.MODES, probe_row(seen)))
    built = []
    parse = cli.parse
    monkeypatch.setattr(cli, "parse", lambda argv: built.append(parse(argv)) or built[-1])
    assert cli.main([DEMO, "ppo_cartpole", "probe@x", "-s", "env.max_frame=10"]) == 0
    assert len(built) == 1 and seen == built and seen[0] is built[0]  # parsed once, passed down as it is
    assert (seen[0].mode, seen[0].target, seen[0].overrides) == ("probe", "x", ("env.max_frame=10",))
    with pytest.raises(SystemExit):
        cli.main(["--help"])
    out = capsys.readouterr().out
    assert "  probe@THING          the probe of THING" in out and "probe, probe@THING" in " ".join(out.split())
    with pytest.raises(SystemExit) as exit_:
        cli.main([DEMO, "ppo_cartpole", "prob"])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert f"unknown mode 'prob'; expected one of: {', '.join(cli.mode_words())}" in err
    assert err.rstrip().endswith("did you mean 'probe'?") and "probe@THING" in err


def test_a_mode_without_target_refuses_one():
    with pytest.raises(cli.UsageError, match=r"unknown mode 'dev@x'; expected one of: dev, train, "):
        cli.dispatch(cli.parse([DEMO, "ppo_cartpole", "dev@x"]))
    with pytest.raises(cli.UsageError, match="--name applies to the modes train and search, not 'dev'"):
        cli.dispatch(cli.parse([DEMO, "ppo_cartpole", "dev", "--name", "job"]))


def modes_block(text: str) -> list[str]:
    """The words of the ``modes:`` list in a help text or page (its lines that start with two spaces and a word)."""
    lines = text[text.index("\nmodes:\n") + 8:].split("\n\n")[0].splitlines()
    return [line.split()[0] for line in lines if line.startswith("  ") and not line.startswith("   ")]


def test_help_and_reference_page_list_exactly_the_table_modes():
    words = [word for row in cli.MODES for word, _ in row.forms]
    assert words == cli.mode_words() and len(words) == len(set(words))
    help_text = cli.build_parser().format_help()
    assert modes_block(help_text) == words
    assert f"one of: {', '.join(words)}" in " ".join(help_text.split())
    page = (REPO / "docs" / "reference" / "cli.md").read_text()
    assert modes_block(page) == words
    assert f"| `mode` |  |  | one of: {', '.join(words)} |" in page
    assert [f"## lab {sub.name}" in page for sub in cli.SUBCOMMANDS] == [True] * len(cli.SUBCOMMANDS)
    assert modes_block(cli.__doc__) == words  # the module docstring's list comes from the table too
