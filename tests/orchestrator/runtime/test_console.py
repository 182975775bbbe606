"""Warnings print as one ``warning: ...`` line, without ANSI escape codes, in the CLI and in the processes
whose stderr ends in logs."""

import subprocess
import sys
import warnings

from lab_helpers import SPECS, run_cli

from orchestrator.runtime.console import install_warning_format, strip_ansi, warning_line


def test_warning_line_is_one_line_without_location_category_or_colour():
    coloured = "\x1b[33mWARN: The environment CartPole-v0 is out of date.\nUpgrade to v1.\x1b[0m"
    assert warning_line(coloured, DeprecationWarning, "/x/gymnasium/envs/registration.py", 516) == \
        "warning: WARN: The environment CartPole-v0 is out of date. Upgrade to v1.\n"
    assert strip_ansi("\x1b[1;31mred\x1b[0m plain\x1b[K") == "red plain"


def test_installed_format_prints_one_line_for_warnings_warn(capsys, monkeypatch):
    monkeypatch.setattr(warnings, "showwarning", warnings.showwarning)
    install_warning_format()
    with warnings.catch_warnings():
        warnings.simplefilter("always")
        for _ in range(2):  # the same line twice: printed once
            warnings.warn("env 'Pendulum-v0' is not in gymnasium; using its successor 'Pendulum-v1'")
        warnings.warn("another")
    assert capsys.readouterr().err == ("warning: env 'Pendulum-v0' is not in gymnasium; "
                                       "using its successor 'Pendulum-v1'\nwarning: another\n")


def test_a_spec_warning_from_the_cli_is_one_warning_line(tmp_path, capsys, monkeypatch):
    """An old env id the spec maps to its successor: the CLI prints one ``warning:`` line, no
    ``UserWarning`` and no source line."""
    monkeypatch.setattr(warnings, "showwarning", warnings.showwarning)
    code = run_cli(SPECS, "ppo_cartpole", "dev", "--data-dir", str(tmp_path), "-s", "env.name=Acrobot-v0",
                   "-s", "env.max_frame=200", "-s", "meta.log_frequency=200")
    err = capsys.readouterr().err
    assert code == 0, err
    lines = [line for line in err.splitlines() if "Acrobot" in line]
    assert lines == ["warning: env 'Acrobot-v0' is not in gymnasium; using its successor 'Acrobot-v1'"]
    assert "UserWarning" not in err and "warnings.warn" not in err


def test_a_child_process_that_installs_it_logs_gymnasium_deprecations_without_escape_codes():
    code = ("from orchestrator.runtime.console import install_warning_format; install_warning_format(); "
            "import warnings; warnings.simplefilter('always'); "
            "from gymnasium.utils.colorize import colorize; "
            "warnings.warn(colorize('WARN: CartPole-v0 is out of date', 'yellow'), DeprecationWarning)")
    err = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60).stderr
    assert err == "warning: WARN: CartPole-v0 is out of date\n"
