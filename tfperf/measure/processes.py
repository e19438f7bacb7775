"""Timing in other processes: cold starts in fresh interpreters, and timers served by a process of their own.

What happens once per process (imports, loading, a first call) is timed in fresh processes, pyperf's
way. What is fixed when a process starts (thread pools, a Keras backend) can only be compared across
processes: each such process serves its timers (`serve_timers`) and takes samples when asked, one
process at a time, so that `interleave` runs them in shuffled rounds like timers of one process. A
child process reports to its parent one way: lines that start with `PROTOCOL`, each one JSON value
(`reply`, read back with `replies` and `last_reply`), so that whatever else the child prints (a
model, TensorFlow's logs) is never mistaken for an answer. NumPy only: no TensorFlow here.
"""

from __future__ import annotations

import json
import os
import queue
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from tfperf.measure.measurement import Measurement

PROTOCOL = "TFPERF "  # prefix of every line a child process answers its parent with
_ENDED = object()  # what the reader of a timer server's answers puts last, when its output ends


class ChildError(RuntimeError):
    """A child process failed, ended without answering, or did not answer in time; the message says which."""


def reply(value: Any) -> str:
    """The line a child process prints to hand `value` (anything JSON can hold) to its parent."""
    return PROTOCOL + json.dumps(value)


def replies(output: str) -> list[Any]:
    """Every value a child process printed with `reply`, in order; other lines are ignored."""
    return [json.loads(line[len(PROTOCOL):]) for line in output.splitlines() if line.startswith(PROTOCOL)]


def rank0_replies(output: str) -> list[Any]:
    """What rank 0 replied (`reply`) in a launcher's output (horovodrun prefixes each line `[rank]<stdout>:`)."""
    return replies("\n".join(line.split(":", 1)[1] for line in output.splitlines() if line.startswith("[0]<stdout>:")))


def last_reply(output: str, who: str = "the child process") -> Any:
    """The last value a child printed with `reply`; ChildError when it printed none."""
    found = replies(output)
    if not found:
        raise ChildError(f"{who} exited without printing its result")
    return found[-1]


def child_env(env: Mapping[str, str] | None) -> dict[str, str]:
    """A child's environment (default: this process's) with GPU memory growth unless it says otherwise: a
    TensorFlow process maps nearly all memory of every GPU it sees, and the next one would starve."""
    merged = dict(os.environ if env is None else env)
    merged.setdefault("TF_FORCE_GPU_ALLOW_GROWTH", "true")
    return merged


def run_child(argv: Sequence[object], *, env: dict[str, str] | None = None, who: str = "the child process",
              timeout: float | None = None) -> Any:
    """Run a child process to its end and return the last value it printed with `reply`; ChildError
    with its exit code and last stderr lines when it fails or answers nothing."""
    done = subprocess.run([str(a) for a in argv], capture_output=True, text=True, stdin=subprocess.DEVNULL,
                          env=child_env(env), timeout=timeout)
    if done.returncode != 0:
        tail = " | ".join(done.stderr.strip().splitlines()[-3:])
        raise ChildError(f"{who} exited with {done.returncode}: {tail or 'no output'}")
    return last_reply(done.stdout, who)


def fresh_processes(argv: Sequence[str], runs: int, *, timeout: float = 600) -> dict[str, Measurement]:
    """Run `argv` `runs` times, each in a fresh process, one after another (pyperf's way of timing what
    happens once per process: imports, loading, a first call). Each run replies (`reply`) with a dict
    of named times in seconds; the result holds one Measurement per name.
    """
    if runs < 1:
        raise ValueError(f"runs must be at least 1, got {runs}")
    taken: dict[str, list[float]] = {}
    for _ in range(runs):
        times = run_child(argv, timeout=timeout, who=Path(str(argv[0])).name)
        for name, seconds in times.items():
            taken.setdefault(name, []).append(float(seconds))
    return {name: Measurement(name=name, samples_s=tuple(samples)) for name, samples in taken.items()}


def _say(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def serve_timers(timers: Sequence, *, warmup: int = 1, lines=None, say=None) -> None:
    """A timer server's side (run in the child): start each timer, say so, then answer `take NAME N`
    with N samples of NAME until `quit` or the end of input. `lines` and `say` default to stdin and stdout."""
    lines = lines if lines is not None else sys.stdin
    say = say or _say
    by_name = {t.name: t for t in timers}
    for t in timers:
        t.start(warmup)
    say(reply({t.name: {"first_call_s": t.first_call_s, "overhead_s": t.overhead_s(),
                        "block_size": int(t.block_size), "items_per_call": t.items_per_call} for t in timers}))
    for line in lines:
        words = line.split()
        if not words or words[0] == "quit":
            return
        name, count = " ".join(words[1:-1]), int(words[-1])
        say(reply(by_name[name].take(count)))


class TimerServer:
    """A child process started with `argv` that serves timers (`serve_timers`); `timer` gives their
    stand-ins here (`RemoteTimer`), for `interleave`. Use it as a context manager: the process ends with it.

    Args:
        timeout: seconds to wait for any one answer (and for the process to end after `quit`).
        name: what messages call it (default: the script it runs).
    """

    def __init__(self, argv: Sequence[str], *, env: dict[str, str] | None = None, timeout: float = 600,
                 name: str | None = None):
        self.argv = [str(a) for a in argv]
        self.timeout = timeout
        self.name = name or next((Path(a).name for a in self.argv if a.endswith(".py")), Path(self.argv[0]).name)
        # stderr to a file: a pipe nobody reads while the process logs would fill and stall it.
        self.errors = tempfile.TemporaryFile(mode="w+")
        self.proc = subprocess.Popen(self.argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=self.errors, text=True, env=child_env(env))
        # Answers are read by a thread, so that waiting for one can give up at a deadline, or when
        # another process it depends on (a worker of the same cluster) has failed.
        self._answers: queue.Queue = queue.Queue()
        threading.Thread(target=self._read_answers, daemon=True).start()
        self._ready: dict[str, dict] | None = None
        self._used: dict[str, list[float]] = {}  # per timer: the process's CPU seconds and wall seconds taking it
        self.result: Any = None  # what the process replied after `quit` (its last reply), once closed

    def timer(self, remote: str, name: str | None = None, *, peers: Sequence[TimerServer] = ()) -> RemoteTimer:
        """A stand-in here for the process's timer `remote`, named `name` (default the same), waiting
        for the process to be ready. Start several processes before asking: they start side by side."""
        if self._ready is None:
            self._ready = self._answer(peers)
        if remote not in self._ready:
            raise ValueError(f"{self.name} has no timer {remote!r}; it has {sorted(self._ready)}")
        return RemoteTimer(self, remote, name=name or remote, **self._ready[remote])

    def next_reply(self) -> Any:
        """The next value the process replied: what a child says of itself before its timers are ready."""
        return self._answer()

    def _read_answers(self) -> None:
        for line in self.proc.stdout:
            if line.startswith(PROTOCOL):
                self._answers.put(json.loads(line[len(PROTOCOL):]))
        self._answers.put(_ENDED)

    def _answer(self, peers: Sequence[TimerServer] = ()) -> Any:
        """The next answer; ChildError when this process or one of `peers` ends without it, or when
        none comes within `timeout`."""
        deadline = time.monotonic() + self.timeout
        while True:
            try:
                answer = self._answers.get(timeout=0.2)
            except queue.Empty:
                for p in peers:
                    if p is not self and p.proc.poll() not in (None, 0):
                        p._fail()
                if time.monotonic() > deadline:
                    raise ChildError(f"{self.name} gave no answer within {self.timeout:.0f} s") from None
                continue
            if answer is _ENDED:
                self._fail()
            return answer

    def _fail(self) -> None:
        """Raise what ended the process: its exit code and the last lines of its stderr."""
        self.proc.wait(timeout=self.timeout)
        self.errors.seek(0)
        tail = " | ".join(self.errors.read().strip().splitlines()[-3:])
        raise ChildError(f"{self.name} exited with {self.proc.returncode}: {tail or 'no output'}")

    def take(self, name: str, samples: int) -> list[float]:
        """`samples` samples of the timer `name`, taken in the process while this one waits; the process's CPU
        time meanwhile is added to what `cores_used` reports."""
        cpu, wall = self._cpu_s(), time.perf_counter()
        self.ask(name, samples)
        taken = self.samples()
        used = self._used.setdefault(name, [0.0, 0.0])
        used[0] += self._cpu_s() - cpu
        used[1] += time.perf_counter() - wall
        return taken

    def cores_used(self, name: str) -> float | None:
        """The cores the process kept busy while it took the samples of `name`: its CPU time (every thread's)
        over the wall time; what a thread setting actually did, whatever it asked for. None before any sample."""
        cpu, wall = self._used.get(name, (0.0, 0.0))
        return cpu / wall if wall > 0 else None

    def _cpu_s(self) -> float:
        """The child's CPU time so far, user and system, all threads."""
        import psutil

        try:
            times = psutil.Process(self.proc.pid).cpu_times()
        except psutil.Error:  # it has ended: what `samples` reports
            return 0.0
        return times.user + times.system

    def ask(self, name: str, samples: int) -> None:
        """Ask for `samples` samples of the timer `name` without waiting for them (see `samples`)."""
        try:
            self.proc.stdin.write(f"take {name} {samples}\n")
            self.proc.stdin.flush()
        except OSError:  # it has ended: `samples` says how, from its stderr
            pass

    def samples(self, peers: Sequence[TimerServer] = ()) -> list[float]:
        """The samples last asked for, once the process has taken them (see `_answer` for `peers`)."""
        return [float(s) for s in self._answer(peers)]

    def close(self) -> None:
        """Ask the process to end, and make sure it does: it may finish work of its own after `quit`
        (a cluster's last collectives), for up to `timeout` seconds, and reply with a result (`result`)."""
        self.quit()
        if self.proc.poll() is None:
            try:
                self.proc.wait(timeout=self.timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        while True:  # what it replied after the last answer read: its result, if it gave one
            try:
                answer = self._answers.get(timeout=5)
            except queue.Empty:
                break
            if answer is _ENDED:
                break
            self.result = answer
        self.errors.close()

    def quit(self) -> None:
        """Say `quit` (the end of input) without waiting for the process to end."""
        if not self.proc.stdin.closed:
            try:
                self.proc.stdin.write("quit\n")
                self.proc.stdin.close()
            except OSError:  # it has already ended
                pass

    def __enter__(self) -> TimerServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class TimerCluster:
    """Timer servers that take every sample together, as the workers of one cluster must (each step
    is a collective): all are asked at once, and the first one's samples (the chief's) count."""

    def __init__(self, processes: Sequence[TimerServer]):
        if not processes:
            raise ValueError("a timer cluster needs at least one process")
        self.processes = list(processes)

    def timer(self, remote: str, name: str | None = None) -> RemoteTimer:
        """A stand-in here for the timer `remote` that every process serves, once all are ready."""
        stand_ins = [p.timer(remote, name, peers=self.processes) for p in self.processes]
        return RemoteTimer(self, remote, name=stand_ins[0].name, first_call_s=stand_ins[0].first_call_s,
                           overhead_s=stand_ins[0].overhead_s(), block_size=stand_ins[0].block_size,
                           items_per_call=stand_ins[0].items_per_call)

    def take(self, name: str, samples: int) -> list[float]:
        for p in self.processes:
            p.ask(name, samples)
        taken = [p.samples(peers=self.processes) for p in self.processes]
        return taken[0]

    def close(self) -> None:
        """Ask every process to end (all at once: a cluster's last collectives need them all), and wait."""
        for p in self.processes:
            p.quit()
        for p in self.processes:
            p.close()

    def __enter__(self) -> TimerCluster:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class RemoteTimer:
    """The stand-in here for a Timer that a TimerServer (or a TimerCluster) runs: what `interleave` needs
    of a Timer (start, take, profile), its samples taken in the other process."""

    def __init__(self, process: TimerServer | TimerCluster, remote: str, *, name: str, first_call_s: float | None,
                 overhead_s: float | None, block_size: int, items_per_call: int):
        self.process, self.remote, self.name = process, remote, name
        self.first_call_s, self._overhead_s = first_call_s, overhead_s
        self.block_size, self.items_per_call = block_size, items_per_call

    def start(self, warmup: int = 1) -> float | None:
        """Nothing to do: the process started and warmed its timers before it said it was ready."""
        return self.first_call_s

    def take(self, samples: int) -> list[float]:
        return self.process.take(self.remote, samples)

    def cores_used(self) -> float | None:
        """The cores its process kept busy while sampling (a TimerServer's; None for a cluster)."""
        return self.process.cores_used(self.remote) if isinstance(self.process, TimerServer) else None

    def overhead_s(self) -> float | None:
        return self._overhead_s

    def profile(self, profile_dir: str | None, *, steps: int = 10) -> None:
        if profile_dir is not None:
            raise ValueError(f"{self.name}: a timer in another process cannot be profiled from here")

    def _measurement(self, samples: Sequence[float], *, rounds: int) -> Measurement:
        return Measurement(name=self.name, samples_s=tuple(float(s) for s in samples), block_size=self.block_size,
                           items_per_call=self.items_per_call, rounds=rounds, first_call_s=self.first_call_s,
                           overhead_s=self._overhead_s)
