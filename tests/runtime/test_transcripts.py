"""Episode transcripts: `earl run` writes a few of rank 0's own episodes to episodes.jsonl every
`transcript_every` steps (and at the last step); `earl show RUN` prints them with roles, tool
calls and rewards."""

import json

from typer.testing import CliRunner

from earl.cli import app
from earl.runtime.metrics import format_transcripts, transcript
from earl.runtime.rollout import Trajectory, Turn


def test_run_writes_transcripts_and_show_prints_them(tmp_path):
    out = tmp_path / "run"
    r = CliRunner().invoke(app, ["run", "--steps", "3", "--quiet", "--out", str(out), "--set", "groups=6",
                                 "--set", "plots=false", "--set", "transcript_every=2",
                                 "--set", "transcript_episodes=3"])
    assert r.exit_code == 0, r.output
    rows = [json.loads(x) for x in (out / "episodes.jsonl").read_text().splitlines()]
    assert [x["step"] for x in rows] == [2, 2, 2, 3, 3, 3]
    assert [x["episode"] for x in rows[:3]] == [0, 2, 5]  # spread over the step's episodes
    first = rows[0]["messages"]
    assert first[0]["role"] == "user" and first[0]["content"].startswith("tic-tac-toe x")
    assert first[1]["role"] == "assistant"
    r = CliRunner().invoke(app, ["show", str(out), "-n", "2"])
    assert r.exit_code == 0, r.output
    assert r.output.count("== step 3") == 2 and "assistant:" in r.output and "reward" in r.output
    r = CliRunner().invoke(app, ["show", str(out), "--step", "1"])
    assert r.exit_code == 2 and "steps with transcripts: 2, 3" in r.output


def test_show_prints_tool_calls(tmp_path):
    t = Trajectory(episode_id=7, group_id=3, reward=1.0, outcome="correct", turns=[Turn(5, 9, 0.0)] * 2)
    t.messages = [{"role": "user", "content": "2+3="},
                  {"role": "assistant", "content": '<tool_call>{"name": "calculator", "arguments": '
                                                   '{"expression": "2+3"}}</tool_call>'},
                  {"role": "tool", "content": "5"}, {"role": "assistant", "content": "5"}]
    (tmp_path / "episodes.jsonl").write_text(json.dumps(transcript(t, 4)) + "\n")
    text = format_transcripts(tmp_path)
    assert "== step 4  episode 7 (group 3)  reward +1.000  correct  2 turn(s)" in text
    assert '-> tool call calculator: {"expression": "2+3"}' in text
    assert "     tool: 5" in text


def test_show_errors_are_one_line(tmp_path):
    r = CliRunner().invoke(app, ["show", str(tmp_path / "nope")])
    assert r.exit_code == 2 and "not found" in r.output
    r = CliRunner().invoke(app, ["show", str(tmp_path)])
    assert r.exit_code == 2 and "no episodes.jsonl" in r.output


def test_fewer_episodes_than_asked_are_all_written(tmp_path):
    from earl.runtime.metrics import RunRecorder

    rec = RunRecorder(tmp_path, tensorboard=False)
    trajs = [Trajectory(episode_id=e, group_id=e) for e in (4, 0)]
    rec.log_transcripts(1, trajs, 4)
    rec.log_transcripts(2, trajs, 1)
    assert [(r["step"], r["episode"]) for r in rec.episodes.rows] == [(1, 0), (1, 4), (2, 0)]


def test_wandb_without_the_package_is_a_one_line_error(tmp_path):
    import importlib.util

    import pytest
    if importlib.util.find_spec("wandb") is not None:
        pytest.skip("wandb is installed")
    r = CliRunner().invoke(app, ["run", "--steps", "1", "--out", str(tmp_path / "r"), "--set", "wandb=true"])
    assert r.exit_code == 2 and "pip install wandb" in r.output
