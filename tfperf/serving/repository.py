"""The models a server serves, as TF Serving keeps them: a folder of numbered versions (saved_models/<name>/),
the highest one served; a version published later is inspected, loaded, checked against the rows its export
was checked on, warmed and swapped in while the old one still answers; one that is broken or unsafe is
refused with a log line and the old one keeps serving. A single export folder is served as version 1 (or
the number its folder has)."""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from tfperf.deploy.errors import ModelError, first_line
from tfperf.serving.batcher import Batcher
from tfperf.serving.configs import ServingConfig
from tfperf.serving.runtimes import PLATFORMS
from tfperf.serving.protocols.tensors import Tensor, dtype_name
from tfperf.records import units

AVAILABLE, LOADING, END = "AVAILABLE", "LOADING", "END"


class NotServed(LookupError):
    """A version the repository is not serving: each protocol's edge answers it as its own "not found"."""


def export_versions(source: Path) -> dict[int, Path]:
    """The versions a source offers: {n: folder} for a folder of numbered exports, {n or 1: source} for one."""
    from tfperf.deploy.formats import format_of, versions

    if format_of(source) is not None:
        number = int(source.name) if source.name.isascii() and source.name.isdigit() else 1
        return {number: source}
    return {v: source / str(v) for v in versions(source) if format_of(source / str(v)) is not None}


def checked(runner, path: Path, outputs_of: Callable[[dict], dict]) -> list[Tensor]:
    """The export's outputs as tensors, after answering the rows its export was checked on as it did then
    (within the tolerance of its format, or of the difference its check recorded); ModelError otherwise. An
    export made elsewhere (no check rows) is run once on zeros (empty strings for a string input)."""
    from tfperf.deploy.formats import FLOAT_TOLERANCE, agreement, read_metadata
    from tfperf.deploy.layout import read_checks

    checks = read_checks(path)
    recorded = (read_metadata(path).get("agreement") or {}).get("outputs") or {}
    if not checks:
        rows = {s.name: np.full((1, *[d or 1 for d in s.shape[1:]]), b"" if s.dtype == "string" else 0,
                                dtype=object if s.dtype == "string" else s.dtype) for s in runner.inputs}
        answer = outputs_of(rows)
    for check in checks:
        answer = outputs_of(dict(check.inputs))
        for name, found in agreement(check.reference, answer).items():
            allowed = max(FLOAT_TOLERANCE, 1.01 * float((recorded.get(name) or {}).get("relative", 0.0)))
            if found["relative"] > allowed:
                raise ModelError(f"{path}: output {name!r} differs from its export's check by "
                                 f"{units.number(found['relative'], 3)} "
                                 f"of its scale (over {units.number(allowed, 3)})")
    return [Tensor(n, dtype_name(np.asarray(a)), (None, *np.asarray(a).shape[1:])) for n, a in sorted(answer.items())]


@dataclasses.dataclass
class Version:
    """One loaded version: its runner, the server (batcher) in front of it, and what it takes and answers."""

    number: int
    path: Path
    format: str
    signature: str
    inputs: tuple[Tensor, ...]
    outputs: tuple[Tensor, ...]
    server: Batcher
    in_flight: int = 0
    config: ServingConfig | None = None  # how it is served: the repository's, with this version's runtime

    @property
    def platform(self) -> str:
        return PLATFORMS.get(self.format, self.format)


class Repository:
    """One model name, its versions and the one served; `poll()` (from a thread of its own) swaps in new ones."""

    def __init__(self, name: str, source: Path | str, config: ServingConfig, *, trust: bool = False,
                 signature: str | None = None, log: Callable[[str], None] = print,
                 on_batch: Callable[..., None] | None = None):
        self.name, self.source, self.config = name, Path(source), config
        self.trust, self.signature, self.log, self.on_batch = trust, signature, log, on_batch
        self.states: dict[int, str] = {}
        self.errors: dict[int, str] = {}
        self._refused: dict[int, float] = {}  # version -> its folder's mtime when refused (retried if it changes)
        self._lock = threading.Lock()
        self.current: Version | None = None
        self._stop = threading.Event()
        self._watcher: threading.Thread | None = None

    def load(self, number: int, path: Path) -> Version:
        """Inspect, load, check and warm one version (it is not served until `swap`)."""
        from tfperf.deploy.formats import format_of
        from tfperf.deploy.inspection import check_safe
        from tfperf.deploy.layout import load

        check_safe(path, trust=self.trust)
        fmt = format_of(path).name
        config = dataclasses.replace(self.config, runtime=fmt,
                                     threads=self.config.threads if fmt != "savedmodel" else None)
        runner = load(path, signature=self.signature)
        server = config.server(path, signature=self.signature, on_batch=self._batched)
        limit = server.options.max_batch_size if not server.whole_requests else None

        def answer(rows: dict) -> dict:
            """Through the server, as a client's requests would go, a batch's worth at a time."""
            count = len(next(iter(rows.values())))
            step = limit or count
            parts = [server.submit({k: v[i:i + step] for k, v in rows.items()}).result(timeout=120)
                     for i in range(0, count, step)]
            return {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}

        try:
            outputs = checked(runner, path, answer)
        except BaseException:
            server.close()
            raise
        inputs = tuple(Tensor(s.name, s.dtype, tuple(s.shape)) for s in runner.inputs)
        return Version(number, path, fmt, runner.signature, inputs, tuple(outputs), server, config=config)

    def _batched(self, rows: int, waits: list[float], compute_s: float) -> None:
        """A batch a version ran, passed to whoever watches (the server's metrics, set after loading)."""
        if self.on_batch is not None:
            self.on_batch(rows, waits, compute_s)

    def start(self) -> Version:
        """Serve the highest version that loads; ModelError naming why none did."""
        offered = export_versions(self.source)
        if not offered:
            raise ModelError(f"{self.source} holds no export: give a model, an export folder, or a folder of "
                             f"numbered versions (saved_models/<name>/)")
        reasons = []
        for number in sorted(offered, reverse=True):
            try:
                self._swap(self._attempt(number, offered[number]))
                return self.current
            except ModelError as exc:
                reasons.append(f"version {number}: {exc}")
        raise ModelError("no version could be served: " + "; ".join(reasons)[:300])

    def _attempt(self, number: int, path: Path) -> Version:
        self.states[number] = LOADING
        started = time.perf_counter()
        try:
            version = self.load(number, path)
        except Exception as exc:  # noqa: BLE001  (a broken version is refused, whatever broke it)
            self.states[number] = END
            self.errors[number] = first_line(exc)
            self._refused[number] = path.stat().st_mtime if path.exists() else 0.0
            self.log(f"{self.name}: version {number} refused: {first_line(exc)}")
            raise ModelError(first_line(exc)) from None
        self.log(f"{self.name}: version {number} ({version.format}) loaded, checked and warmed in "
                 f"{time.perf_counter() - started:.1f} s")
        return version

    def _swap(self, version: Version) -> None:
        with self._lock:
            old, self.current = self.current, version
            self.states[version.number] = AVAILABLE
            self.errors.pop(version.number, None)
        if old is not None:
            self.states[old.number] = END
            threading.Thread(target=self._retire, args=(old,), daemon=True).start()
            self.log(f"{self.name}: serving version {version.number} (version {old.number} drains and ends)")

    def _retire(self, old: Version, timeout_s: float = 60.0) -> None:
        """Close an old version once the requests it took have answered."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            with self._lock:
                if not old.in_flight:
                    break
            time.sleep(0.01)
        old.server.close()

    def poll(self) -> None:
        """Serve a version higher than the current one, if one has appeared and passes."""
        offered = export_versions(self.source) if self.source.is_dir() else {}
        current = self.current.number if self.current else 0
        for number in sorted((n for n in offered if n > current), reverse=True):
            path = offered[number]
            if number in self._refused and self._refused[number] == path.stat().st_mtime:
                continue
            try:
                self._swap(self._attempt(number, path))
                return
            except ModelError:
                continue

    def watch(self, every_s: float = 1.0) -> None:
        """Poll for new versions every `every_s` seconds (TF Serving's file_system_poll_wait_seconds)."""

        def loop() -> None:
            while not self._stop.wait(every_s):
                try:
                    self.poll()
                except OSError as exc:  # the folder went away for a moment: try again next time
                    self.log(f"{self.name}: cannot read {self.source}: {exc}")

        self._watcher = threading.Thread(target=loop, name="versions", daemon=True)
        self._watcher.start()

    def get(self, version: int | None = None) -> Version:
        """The version a request asks for (None: the served one); NotServed when it is not being served."""
        found = self.current
        if found is None or (version is not None and version != found.number):
            state = self.states.get(version) if version is not None else None
            raise NotServed(f"model {self.name!r} version {version} is not being served"
                               + (f" ({state.lower()})" if state else "")
                               + (f"; version {found.number} is" if found else ""))
        return found

    def acquire(self, version: int | None = None) -> Version:
        """`get`, counting the request against the version until `release`: a version being swapped out
        closes only once the requests it took have answered."""
        with self._lock:
            found = self.get(version)
            found.in_flight += 1
            return found

    @staticmethod
    def release(version: Version) -> None:
        """A request that `acquire` counted has answered."""
        version.in_flight -= 1

    def close(self) -> None:
        """Stop watching and close the served version."""
        self._stop.set()
        if self._watcher is not None:
            self._watcher.join()
        if self.current is not None:
            self.current.server.close()
