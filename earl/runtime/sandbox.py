"""User code (reward functions, tools) runs in a separate long-lived process, each call bounded.

A reward function that never returns, or a tool whose loop never ends, must not stall the
run: a thread cannot be stopped, a process can. Each rank keeps one helper process (started on
the first call, `python -c "...serve(R, W)"`: no re-import of the caller's `__main__`, no torch)
and sends it one call at a time over a pipe: the target (a user file's function, or a picklable
callable), its arguments, and gets back ("ok", value) or ("err", "Type: message"). A call that
overruns its timeout kills the helper (SIGKILL) and reports a timeout; a helper that dies
(os._exit, a segfault) reports its exit code; either way the next call starts a fresh helper.
The helper exits on its own when the caller's end of the pipe closes or the caller dies.

A helper can also hold objects between calls (a user's environment instance): `hold` builds one
under a key, `apply_held` calls a function on it. A restart loses them; `Sandbox.generation`
counts starts, so their owner can tell and rebuild (earl.runtime.envs.user replays its episode).

Callables that cannot be pickled (closures, lambdas) run on a worker thread with the same
timeout instead (the thread is abandoned, not stopped: use module-level functions to be bounded).

    PYTHONPATH=$PWD python -m pytest -q tests/runtime/test_sandbox.py
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import os
import pickle
import subprocess
import sys
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from multiprocessing.connection import Connection
from pathlib import Path

STARTUP_TIMEOUT_S = 60.0  # seconds a new helper process may take to import and report ready
_THREADS = ThreadPoolExecutor(max_workers=4, thread_name_prefix="earl-user")
_SERVE = "import sys; from earl.runtime.sandbox import serve; serve(int(sys.argv[1]), int(sys.argv[2]))"


class UserCodeError(Exception):
    """A user function's call failed: raised, timed out, crashed, or returned something unsendable."""


@functools.lru_cache(maxsize=16)
def _load_module(path: str, _mtime_ns: int):
    spec = importlib.util.spec_from_file_location(f"earl_user_{abs(hash(path))}", path)
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except Exception as e:  # noqa: BLE001 - the user's module failing to import is their error
        raise ValueError(f"file {path} failed to import: {type(e).__name__}: {e}") from None
    return module


def load_file_module(path: str | Path):
    """The Python file at `path` as a module (imported once while unchanged); ValueError if it
    fails to import."""
    p = Path(path).resolve()
    return _load_module(str(p), p.stat().st_mtime_ns)


def load_file_function(path: str | Path, func: str):
    """FUNC from the Python file at `path` (imported once while unchanged); ValueError if the
    file fails to import or holds no such function."""
    module = load_file_module(path)
    fn = getattr(module, func, None)
    if not callable(fn):
        names = sorted(n for n, v in vars(module).items() if callable(v) and not n.startswith("_"))
        raise ValueError(f"function {func!r} not found in {path}; functions there: {', '.join(names) or 'none'}")
    return fn


def _resolve(target):
    """A callable from a target: ("file", PATH, NAME), ("module", MODULE, NAME) or itself."""
    if isinstance(target, tuple) and len(target) == 3 and target[0] == "file":
        return load_file_function(target[1], target[2])
    if isinstance(target, tuple) and len(target) == 3 and target[0] == "module":
        return getattr(importlib.import_module(target[1]), target[2])
    return target


_HELD: dict[str, object] = {}  # objects this helper holds between calls, by their owner's key


def hold(key: str, factory, args: tuple = (), kwargs: dict | None = None, drop: tuple = ()) -> None:
    """Build `factory(*args, **kwargs)` (a target, as in `call`) and keep it under `key`; the
    keys in `drop` are released first."""
    for k in drop:
        _HELD.pop(k, None)
    _HELD[key] = _resolve(factory)(*args, **(kwargs or {}))


def apply_held(key: str, fn, args: tuple = (), drop: tuple = ()):
    """fn(the object held under `key`, *args); the keys in `drop` are released first."""
    for k in drop:
        _HELD.pop(k, None)
    if key not in _HELD:
        raise LookupError(f"no object held under {key!r} (the helper restarted)")
    return fn(_HELD[key], *args)


def serve(read_fd: int, write_fd: int) -> None:
    """The helper's loop: one call at a time until the caller closes its end."""
    inbox, outbox = Connection(read_fd, writable=False), Connection(write_fd, readable=False)
    parent = os.getppid()

    def watch():  # the caller died without closing the pipe (SIGKILL): do not outlive it
        while True:
            threading.Event().wait(1.0)
            if os.getppid() != parent:
                os._exit(0)

    threading.Thread(target=watch, daemon=True).start()
    outbox.send_bytes(b"ready")
    while True:
        try:
            target, args, kwargs = pickle.loads(inbox.recv_bytes())
        except EOFError:
            return
        try:
            reply = ("ok", _resolve(target)(*args, **kwargs))
        except Exception as e:  # noqa: BLE001 - the user's failure is the reply
            reply = ("err", f"{type(e).__name__}: {e}")
        try:
            data = pickle.dumps(reply)
        except Exception as e:  # noqa: BLE001 - an unpicklable return value
            data = pickle.dumps(("err", f"returned an unsendable {type(reply[1]).__name__} ({e})"))
        outbox.send_bytes(data)


class Sandbox:
    """One helper process; `call` runs a target there under a timeout (thread-safe, serial)."""

    def __init__(self):
        self.proc: subprocess.Popen | None = None
        self.send: Connection | None = None
        self.recv: Connection | None = None
        self.lock = threading.Lock()
        self.restarts = 0  # helpers killed or lost (timeouts and crashes)
        self.generation = 0  # helpers started so far (objects held by an older one are gone)

    def _start(self) -> None:
        to_child_r, to_child_w = os.pipe()
        from_child_r, from_child_w = os.pipe()
        env = dict(os.environ)
        root = str(Path(__file__).resolve().parents[2])  # the earl checkout this module came from
        # and this process's import path, so `package.module` targets import there as here
        env["PYTHONPATH"] = os.pathsep.join([root, *filter(None, sys.path), *filter(None, [env.get("PYTHONPATH")])])
        self.proc = subprocess.Popen([sys.executable, "-c", _SERVE, str(to_child_r), str(from_child_w)],
                                     pass_fds=(to_child_r, from_child_w), stdin=subprocess.DEVNULL, env=env)
        os.close(to_child_r)
        os.close(from_child_w)
        self.generation += 1
        self.send, self.recv = Connection(to_child_w, readable=False), Connection(from_child_r, writable=False)
        # the call's timeout starts once the helper is up (its start is not the user's time)
        try:
            ok = self.recv.poll(STARTUP_TIMEOUT_S) and self.recv.recv_bytes() == b"ready"
        except (EOFError, OSError):
            ok = False
        if not ok:
            self._stop()
            raise UserCodeError(f"its helper process did not start within {STARTUP_TIMEOUT_S:g}s")

    def _stop(self) -> None:
        if self.proc is not None:
            if self.proc.poll() is None:
                self.proc.kill()
            self.proc.wait()
        for c in (self.send, self.recv):
            if c is not None:
                c.close()
        self.proc = self.send = self.recv = None

    def close(self) -> None:
        with self.lock:
            self._stop()

    def ensure_started(self) -> int:
        """Start the helper unless it runs; its generation (UserCodeError if it cannot start)."""
        with self.lock:
            if self.proc is None or self.proc.poll() is not None:
                self._stop()
                self._start()
            return self.generation

    def call(self, target, args: tuple = (), kwargs: dict | None = None, *, timeout_s: float):
        """target(*args, **kwargs) in the helper; its value, or UserCodeError saying why not.
        `target`: a picklable callable or ("file", PATH, FUNC)."""
        payload = pickle.dumps((target, tuple(args), dict(kwargs or {})))
        with self.lock:
            if self.proc is None or self.proc.poll() is not None:
                self._stop()
                self._start()
            try:
                self.send.send_bytes(payload)
                ready = self.recv.poll(timeout_s)
                status, value = pickle.loads(self.recv.recv_bytes()) if ready else (None, None)
            except (EOFError, OSError):
                code = self.proc.wait()
                self.restarts += 1
                self._stop()
                raise UserCodeError(f"its process died (exit code {code})") from None
            if not ready:
                self.restarts += 1
                self._stop()
                raise UserCodeError(f"timed out after {timeout_s:g}s (stopped)")
        if status == "err":
            raise UserCodeError(value)
        return value


_SANDBOX = Sandbox()


def call_user(fn: Callable | tuple, args: tuple = (), kwargs: dict | None = None, *, timeout_s: float):
    """fn(*args, **kwargs) bounded by `timeout_s`: in this rank's helper process when `fn` can be
    sent there (a ("file", PATH, FUNC) target or a picklable callable), else on a thread.
    Returns the value; raises UserCodeError with the reason otherwise."""
    if not isinstance(fn, tuple):
        try:
            pickle.dumps(fn)
        except (pickle.PicklingError, AttributeError, TypeError):
            future = _THREADS.submit(fn, *args, **(kwargs or {}))
            try:
                return future.result(timeout=timeout_s)
            except FutureTimeout:
                raise UserCodeError(f"timed out after {timeout_s:g}s (its thread keeps running)") from None
            except Exception as e:  # noqa: BLE001 - the user's failure becomes the error
                raise UserCodeError(f"{type(e).__name__}: {e}") from None
    return _SANDBOX.call(fn, args, kwargs, timeout_s=timeout_s)
