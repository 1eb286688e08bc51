"""The CLI's shape: --version, help without type placeholders on flags, one error helper."""

from typer.testing import CliRunner

from earl import __version__
from earl.cli import app

COMMANDS = ("simulate", "run", "calibrate", "validate", "plan", "estimate", "study", "show")


def test_version():
    r = CliRunner().invoke(app, ["--version"])
    assert r.exit_code == 0 and r.output.strip() == f"earl {__version__}"


def test_flags_show_no_bool_placeholder():
    for cmd in COMMANDS:
        r = CliRunner().invoke(app, [cmd, "--help"], env={"COLUMNS": "200"})
        assert r.exit_code == 0, (cmd, r.output)
        assert "<bool>" not in r.output, (cmd, r.output)
        assert "--help" in r.output


def test_bad_set_item_is_one_line_exit_2():
    r = CliRunner().invoke(app, ["simulate", "--set", "nodes"])
    assert r.exit_code == 2
    assert r.output.strip().splitlines() == ["error: --set expects key=value, got 'nodes'"]
