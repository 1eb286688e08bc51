"""What bounding user code costs: a reward-function call (the JSONL task) and a calculator tool
call, each in-process against through the sandbox's helper process (earl.runtime.sandbox), side
by side in one run; microseconds per call and their ratio.

In-process means what the runtime did before: the reward function called directly, the tool on
a worker thread with a timeout (which cannot stop it). The sandbox pickles the call, sends it
over a pipe and waits under the timeout (which kills the helper when it overruns).

    PYTHONPATH=$PWD python benchmarks/bench_sandbox.py [--calls 2000]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from earl.runtime.envs import make_env
from earl.runtime.envs.tools import TOOLS, calculator_tool, run_tool
from earl.runtime.sandbox import _SANDBOX, load_file_function

REWARD = '''
def score(sample, messages):
    return float(sample["answer"] in messages[-1]["content"])
'''


def per_call_us(fn, calls: int) -> float:
    fn()  # warm: the helper process starts, files are imported
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - t0) / calls * 1e6


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calls", type=int, default=2000)
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        (Path(d) / "reward.py").write_text(REWARD)
        (Path(d) / "p.jsonl").write_text('{"prompt": "2+3=", "answer": "5"}\n')
        env = make_env(f"jsonl:{d}/p.jsonl", reward=f"{d}/reward.py:score")
        env.reset(0)
        env.messages.append({"role": "assistant", "content": "it is 5"})
        sample, msgs = env.sample, env.messages
        direct = load_file_function(f"{d}/reward.py", "score")
        rows = [("reward (jsonl)", per_call_us(lambda: direct(sample, [dict(m) for m in msgs]), a.calls),
                 per_call_us(lambda: env._scored(""), a.calls))]
        threads = ThreadPoolExecutor(max_workers=4)
        rows.append(("calculator tool", per_call_us(lambda: threads.submit(calculator_tool, "37*12+5").result(1.0),
                                                    a.calls),
                     per_call_us(lambda: run_tool(TOOLS["calculator"].fn, kwargs={"expression": "37*12+5"},
                                                  timeout_s=1.0), a.calls)))
    print(f"{'call':22s} {'in-process us':>14s} {'sandbox us':>11s} {'ratio':>7s}   ({a.calls} calls each)")
    for name, base, boxed in rows:
        print(f"{name:22s} {base:14.1f} {boxed:11.1f} {boxed / base:7.1f}x")
    print(f"helper restarts: {_SANDBOX.restarts}")


if __name__ == "__main__":
    main()
