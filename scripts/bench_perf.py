"""Where a process's CPU goes by layer, from `perf`'s on-CPU samples (`bench_sessions.py --perf DIR`).

Why: py-spy (`--profile`) names the Python functions a process was in, but it
samples whatever is not idle, so a process that is runnable and not running
(woken a reader on its vCPU, preempted by it) looks busy in the call it made,
and it cannot say how much of a Python frame's time is the interpreter, the
kernel or SQLite. `perf record -e cpu-clock` counts only the instants a CPU
ran the process, whichever code that was: the split this prints, per process
and phase, in CPU ms a turn, is the one that says which layer a cut must
come from (on 2026-12-08, the server's CPU a lone turn: a plain answer's
65 % the interpreter, 17 % the kernel, 11 % SQLite; a streamed one's 73 / 14 /
8 %; docs/figures-log.md).

It needs `perf` on PATH (refused without it) and the right to sample these
processes (root, or `kernel.perf_event_paranoid` <= 1: without it perf records
nothing, and the report says so). It costs a
little CPU (~1,000 samples a second a process): a run's other figures are not
the ones to report.
"""

from __future__ import annotations

import shutil
import signal
import subprocess
from collections import Counter
from collections.abc import Callable, Iterable
from pathlib import Path

RATE = 999  # samples per second of CPU, per process
# the layers, by shared object: the first whose test matches
_LAYERS = (
    ("interpreter", lambda dso: dso.startswith("libpython") or dso.startswith("python")),
    ("kernel", lambda dso: dso.startswith("[kernel")),
    ("sqlite", lambda dso: "sqlite" in dso),
    ("libc", lambda dso: dso.startswith("libc.") or dso.startswith("libm.") or dso == "[vdso]"),
    ("extensions", lambda dso: ".cpython-" in dso),
)


class PerfSampler:
    """`perf record` of the server and each runner over a phase; `report` splits their CPU by layer."""

    def __init__(self, out: str | None, server_pid: int, children: Callable[[int], Iterable[int]]) -> None:
        self.out, self.server_pid, self._children = out, server_pid, children
        self.exe = shutil.which("perf") if out else None
        if out and self.exe is None:
            raise SystemExit("--perf needs perf (linux-tools) on PATH")
        self._procs: list[subprocess.Popen[bytes]] = []
        self._phases: list[tuple[str, int, list[tuple[str, Path]]]] = []  # (phase, turns, [(who, file)])
        if out:
            Path(out).mkdir(parents=True, exist_ok=True)

    def start(self, phase: str) -> None:
        if not self.exe:
            return
        files = []
        for pid in self._children(self.server_pid):
            who = "server" if pid == self.server_pid else "runners"
            path = Path(self.out) / f"{phase}-{who}-{pid}.perf"
            files.append((who, path))
            self._procs.append(subprocess.Popen(
                [self.exe, "record", "-q", "-e", "cpu-clock", "-F", str(RATE), "-p", str(pid), "-o", str(path)],
                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        self._phases.append((phase, 0, files))

    def stop(self, turns: int) -> None:
        if not self.exe:
            return
        for proc in self._procs:
            proc.send_signal(signal.SIGINT)  # perf writes its file and exits on SIGINT
        for proc in self._procs:
            proc.wait()
        self._procs.clear()
        phase, _, files = self._phases[-1]
        self._phases[-1] = (phase, turns, files)

    def report(self, floor_ms: float) -> list[str]:
        """One line per phase and process kind: CPU a turn as a multiple of `floor_ms` (the per-turn
        floor's CPU a call, timed in the same run) and in ms, in all and by layer."""
        lines = []
        for phase, turns, files in self._phases:
            by_who: dict[str, Counter[str]] = {}
            for who, path in files:
                by_who.setdefault(who, Counter()).update(self._layers(path))
            for who, layers in by_who.items():
                total = sum(layers.values())
                if not total:
                    lines.append(f"{phase} {who}: no samples (perf may not sample them here: run as root, or "
                                 f"with kernel.perf_event_paranoid <= 1)")
                    continue
                if not turns:
                    continue
                parts = ", ".join(f"{name} {_ms(n, turns):.2f} ({n / total:.0%})" for name, n in layers.most_common())
                lines.append(f"{phase} {who}: {_ms(total, turns) / floor_ms:.2f}× the floor's CPU a call, "
                             f"{_ms(total, turns):.2f} ms a turn: {parts}")
        return lines

    def _layers(self, path: Path) -> Counter[str]:
        if not path.exists():
            return Counter()
        out = subprocess.run([self.exe, "report", "-i", str(path), "--stdio", "--no-children", "--sort", "dso",
                              "-F", "sample,dso", "-g", "none"], capture_output=True, text=True).stdout
        layers: Counter[str] = Counter()
        for line in out.splitlines():
            fields = line.split(None, 1)
            if len(fields) != 2 or line.startswith("#") or not fields[0].isdigit():
                continue
            dso = fields[1].strip()
            layer = next((name for name, test in _LAYERS if test(dso)), "other")
            layers[layer] += int(fields[0])
        return layers


def _ms(samples: int, turns: int) -> float:
    """CPU ms a turn from a count of samples taken `RATE` times a second of CPU."""
    return samples / RATE * 1000 / turns
