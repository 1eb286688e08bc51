"""Standard tool calls (Hermes/Qwen `<tool_call>` JSON, the tool registry) and prompt datasets
scored by a user's reward function: parsing, errors as observations or one-line errors, reward
function failures counted, `earl run --env jsonl:... --reward ...` end to end, and a
tool-calling episode with a chat-templated tiny HF model."""

import json
import math
import sys
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from earl.cli import app
from earl.runtime.envs import make_env
from earl.runtime.envs.tools import TOOLS, Tool, parse_tool_calls, run_tool_calls

sys.path.insert(0, str(Path(__file__).parent))
from chat_model import build_chat_model  # noqa: E402

CALL = '<tool_call>{{"name": "{name}", "arguments": {args}}}</tool_call>'


def call(name="calculator", **args):
    return CALL.format(name=name, args=json.dumps(args))


def test_tool_calls_parse_and_failures_become_results():
    text = call(expression="2*(3+4)") + " then " + call("rm", path="/") + "<tool_call>{oops</tool_call>"
    calls = parse_tool_calls(text)
    assert [c.name for c in calls] == ["calculator", "rm", ""]
    out = run_tool_calls(calls, TOOLS, 1.0)
    assert out[0] == "14"
    assert out[1].startswith("error: unknown tool 'rm'")
    assert out[2].startswith("error: tool call is not JSON")
    assert run_tool_calls(parse_tool_calls(call(expression="__import__('os')")), TOOLS, 1.0)[0].startswith("error")
    assert "missing expression" in run_tool_calls(parse_tool_calls(call(x=1)), TOOLS, 1.0)[0]
    assert parse_tool_calls("no call here") == []
    assert TOOLS["calculator"].schema()["function"]["parameters"]["required"] == ["expression"]


def test_tool_exceptions_and_timeouts_become_results():
    def boom(x):
        raise RuntimeError("kaput")

    tools = {"slow": Tool(name="slow", description="", parameters={"properties": {"x": {}}},
                          fn=lambda x: time.sleep(1) or "late"),
             "boom": Tool(name="boom", description="", parameters={"properties": {"x": {}}}, fn=boom)}
    out = run_tool_calls(parse_tool_calls(call("slow", x=1) + call("boom", x=1)), tools, 0.05)
    assert out == ["error: tool timed out after 0.05s", "error: kaput"]


def test_calculator_env_takes_standard_calls():
    e = make_env("calculator")
    q = e.reset(3)[3:].strip()
    r = e.step(call(expression=q))
    assert r.role == "tool" and not r.done and r.observation == e.answer
    assert e.tool_schemas[0]["function"]["name"] == "calculator"
    r = e.step(f"ans {e.answer}")
    assert r.done and r.outcome == "correct"


@pytest.fixture
def data(tmp_path):
    rows = [{"prompt": "2+3=", "answer": "5"}, {"messages": [{"role": "system", "content": "be brief"},
                                                             {"role": "user", "content": "7*6="}], "answer": "42"}]
    (tmp_path / "p.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (tmp_path / "reward.py").write_text(
        "def score(sample, messages):\n"
        "    return float(sample['answer'] in messages[-1]['content'])\n"
        "def boom(sample, messages):\n    raise KeyError('x')\n"
        "def nan(sample, messages):\n    return float('nan')\n"
        "def tools_used(sample, messages):\n"
        "    return float(any(m['role'] == 'tool' for m in messages))\n")
    return tmp_path


def test_prompt_dataset_scores_with_the_users_function(data):
    e = make_env(f"jsonl:{data / 'p.jsonl'}", reward=f"{data / 'reward.py'}:score")
    assert e.reset(0) == "2+3=" and e.context == []
    r = e.step("it is 5")
    assert r.done and r.reward == 1.0 and r.outcome == "correct"
    assert e.reset(1) == "7*6=" and e.context == [{"role": "system", "content": "be brief"}]
    r = e.step("41")
    assert r.done and r.reward == 0.0 and r.outcome == "wrong"


@pytest.mark.parametrize("func", ["boom", "nan"])
def test_failing_reward_function_gives_zero_and_is_counted(data, func):
    e = make_env(f"jsonl:{data / 'p.jsonl'}", reward=f"{data / 'reward.py'}:{func}")
    e.reset(0)
    r = e.step("5")
    assert r.done and r.reward == 0.0 and r.outcome == "reward_error" and math.isfinite(r.reward)


def test_prompt_dataset_with_tools_is_multi_turn(data):
    e = make_env(f"jsonl:{data / 'p.jsonl'}", reward=f"{data / 'reward.py'}:tools_used", tools=("calculator",))
    e.reset(0)
    r = e.step(call(expression="2+3"))
    assert not r.done and r.role == "tool" and r.observation == "5"
    assert e.messages[-2]["tool_calls"] == [{"name": "calculator", "arguments": {"expression": "2+3"}}]
    r = e.step("5")
    assert r.done and r.reward == 1.0


def test_prompt_dataset_errors_are_one_line(data, tmp_path):
    reward = f"{data / 'reward.py'}:score"
    with pytest.raises(ValueError, match="not found"):
        make_env(f"jsonl:{tmp_path / 'missing.jsonl'}", reward=reward)
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "a"}\n{"prompt": \n')
    with pytest.raises(ValueError, match=r"bad.jsonl:2: not valid JSON"):
        make_env(f"jsonl:{bad}", reward=reward)
    bad.write_text('{"prompt": "a"}\n\n{"question": "b"}\n')
    with pytest.raises(ValueError, match=r"bad.jsonl:3: a row needs 'prompt'.*question"):
        make_env(f"jsonl:{bad}", reward=reward)
    with pytest.raises(ValueError, match="reward function 'nope' not found.*score"):
        make_env(f"jsonl:{data / 'p.jsonl'}", reward=f"{data / 'reward.py'}:nope")
    with pytest.raises(ValueError, match="reward file .* not found"):
        make_env(f"jsonl:{data / 'p.jsonl'}", reward="missing.py:score")
    with pytest.raises(ValueError, match="needs a reward function"):
        make_env(f"jsonl:{data / 'p.jsonl'}")
    with pytest.raises(ValueError, match="unknown tool"):
        make_env(f"jsonl:{data / 'p.jsonl'}", reward=reward, tools=("shell",))
    r = CliRunner().invoke(app, ["run", "--env", f"jsonl:{data / 'nope.jsonl'}", "--reward", reward])
    assert r.exit_code == 2 and "not found" in r.output and "Traceback" not in r.output


def test_parquet_rows(data):
    pd = pytest.importorskip("pandas")
    pytest.importorskip("pyarrow")
    pd.DataFrame([{"prompt": "2+3=", "answer": "5"}]).to_parquet(data / "p.parquet")
    e = make_env(f"jsonl:{data / 'p.parquet'}", reward=f"{data / 'reward.py'}:score")
    assert e.reset(7) == "2+3="


def test_earl_run_jsonl_with_a_failing_reward(data, tmp_path):
    out = tmp_path / "run"
    r = CliRunner().invoke(app, ["run", "--env", f"jsonl:{data / 'p.jsonl'}", "--reward", f"{data / 'reward.py'}:boom",
                                 "--steps", "2", "--quiet", "--out", str(out), "--set", "groups=2",
                                 "--set", "plots=false", "--set", "sampling.max_new_tokens=4"])
    # every episode's reward failed: the run stops in one line (before training) rather than train on zeros
    assert r.exit_code == 2, r.output
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: step 1: the reward function"), r.stderr
    assert "reward.py:boom failed on 2 of 2 episodes" in lines[0] and "Traceback" not in r.output
    assert not (out / "metrics.jsonl").is_file() or not (out / "metrics.jsonl").read_text().strip()


def test_tool_calling_episode_with_a_chat_model(data, tmp_path):
    """A chat-templated tiny HF model on a dataset with the calculator tool: the schema reaches
    the template, the tool call's result comes back as a `tool` message, ids stay exact."""
    from earl.runtime.engine import SamplingParams, TorchEngine
    from earl.runtime.hf_model import load_policy
    from earl.runtime.rollout import play_episodes

    pol = load_policy(str(build_chat_model(tmp_path / "chat")))
    tok = pol.tokenizer
    env = make_env(f"jsonl:{data / 'p.jsonl'}", reward=f"{data / 'reward.py'}:tools_used", tools=("calculator",))

    class Scripted:  # the random model will not write a tool call: feed the engine a scripted reply
        def __init__(self, eng):
            self.eng, self.tokenizer, self.stats = eng, eng.tokenizer, eng.stats

        def open(self, n, seeds=None):
            inner = self.eng.open(n, seeds)
            replies = iter([call(expression="2+3"), "5"])

            class Batch:
                def generate(self, inputs, params):
                    out = inner.generate(inputs, params)
                    text = next(replies)
                    ids = tok.encode(text) + [tok.eos_id]
                    for g in out.values():
                        g.token_ids, g.logprobs, g.text = ids, [0.0] * len(ids), text
                    return out

                def close(self, rows):
                    inner.close(rows)
            return Batch()

    eng = Scripted(TorchEngine(pol.model, tok, reuse_kv=False))
    (t,) = play_episodes(eng, [env], [0], SamplingParams(max_new_tokens=4), sample_seeds=[0], max_context=4096,
                         group_ids=[0], episode_ids=[0])
    assert t.reward == 1.0 and t.outcome == "correct"
    assert [m["role"] for m in t.messages] == ["user", "assistant", "tool", "assistant"]
    assert t.messages[2]["content"] == "5"
    text = tok.tok.decode(t.token_ids, skip_special_tokens=False)
    assert '"name": "calculator"' in text.split("<|im_start|>user")[0]  # the schema in the system prompt
    assert "<tool_response>\n5\n</tool_response>" in text
    want = tok.encode(tok.tok.apply_chat_template(t.messages, tools=env.tool_schemas, tokenize=False))
    assert want[:len(t.token_ids)] == t.token_ids
