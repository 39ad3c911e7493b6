"""The start-up and recovery figures of issue 10, in one table.

Every start-up figure is a ratio to the floor, `python -c "import openai, trio"`,
timed in the same run pair by pair (each measured run is next to its own floor
run, and the order alternates), so the load of a shared machine cancels out;
the table gives medians of the ratios and the absolutes beside them.

  - cold `omnigent run -p` (fresh HOME each run): wall, and CPU of all its processes
  - `omnigent run --continue` with one piped prompt: the same
  - peak memory of all processes together (sum of PSS, sampled every 5 ms; separate runs,
    since sampling costs CPU)
  - the `-p` timeline (`OMNIGENT_TIMELINE`): median time of each segment between its points
  - recovery with the REPL's warm spare (`bench_recovery.measure`): an idle runner killed ->
    a replacement online and the session rebound; a runner killed mid-turn -> answer shown

CPU is `resource.getrusage(RUSAGE_CHILDREN)` around each run: the CLI waits for its
runners, so theirs is included; the mock LLM's is not (nor is it in the floor).
Every run gets `stdin=DEVNULL`, except the piped prompt of `--continue`.
Prints figures; asserts nothing.

Byte code: with `PYTHONDONTWRITEBYTECODE` set and no `__pycache__`, every run
compiles omnigent's own modules again, which an installed package never does
(pip compiles them; the floor's openai and trio are compiled too). `--compile`
compiles the tree first, as an install would; the table says which was measured.

The figures of issue 10 beyond start-up come from scripts of their own, which this one runs
after its table when asked (each prints its own ratios to its own floor):
  - `--sessions`: many sessions (`bench_sessions.py`: one server, 4 runners, a 50 ms mock,
    100 sessions; about 1 minute);
  - `--history`: flat in conversation length (`bench_history.py`: 10 / 1,000 / 10,000 items;
    a few minutes);
  - `--watchers`: many watchers of one session (`bench_watchers.py`: rates, publish-to-delivery
    delay and memory per watcher at 100 watchers; about 1 minute);
  - `--streaming`: many sessions again, every answer streamed as a model streams it (20 words,
    a delta each 10 ms apart: `bench_sessions.py --stream-words 20 --token-ms 10`): the time to
    the first token beside the whole answer's, and the CPU of a streamed turn; about 3 minutes;
  - `--all`: the four.

Usage: python scripts/bench.py [--runs 9] [--mem-runs 3] [--rounds 5] [--no-recovery] [--compile]
       [--sessions] [--history] [--watchers] [--streaming] [--all]
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "scripts"))

from bench_run import AGENT, alive, pss_kib, start_mock, tagged_pids  # noqa: E402

# the -p timeline's points (shown in the order of their median times); "bench.*" are this script's
POINTS = ["bench.spawn", "cli.start", "early.spawned", "early.adopted", "runner.identity", "runner.online", "runner.prewarmed", "socket.bound", "runner.spawned", "runner.start", "server.ready",
          "front.turn_posting", "runner.openai_imported", "server.hello", "front.turn_started",
          "front.first_output", "front.answer_printed", "runner.exit", "cli.exit", "bench.reaped"]


def _cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def timed(argv: list[str], env: dict[str, str], *, input: str | None = None,
          timeline: Path | None = None, tag: str | None = None) -> tuple[float, float, int]:
    """(wall, CPU of the process and every child it waited for, peak PSS KiB when `tag` is given)."""
    env = dict(env)
    if timeline is not None:
        env["OMNIGENT_TIMELINE"] = str(timeline)
    if tag is not None:
        env["OMNIGENT_BENCH_TAG"] = tag
    cpu0, peak = _cpu(), 0
    if timeline is not None:
        _mark(timeline, "bench.spawn")
    start = time.perf_counter()
    proc = subprocess.Popen(argv, env=env, stdin=subprocess.PIPE if input is not None else subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if tag is not None:
        if input is not None:
            proc.stdin.write(input)
            proc.stdin.close()
            proc.stdin = None  # written whole: communicate() must not flush it again
        while proc.poll() is None:
            peak = max(peak, sum(pss_kib(pid) for pid in tagged_pids(tag) if not _unexeced_fork(pid)))
            time.sleep(0.005)
        out, err = proc.communicate()
    else:
        out, err = proc.communicate(input)
    wall = time.perf_counter() - start
    if timeline is not None:
        _mark(timeline, "bench.reaped")
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(argv[2:])} failed ({proc.returncode}): {err}")
    return wall, _cpu() - cpu0, peak


def _unexeced_fork(pid: int) -> bool:
    """A child between fork and exec (a runner being spawned): its pages are its parent's.

    Read one after the other, the parent's PSS before the fork and the child's after it
    count the shared pages one and a half times: up to ~45 MiB too much in one sample.
    """
    try:
        with open(f"/proc/{pid}/stat") as f:
            ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        with open(f"/proc/{pid}/cmdline", "rb") as f, open(f"/proc/{ppid}/cmdline", "rb") as g:
            return f.read() == g.read()
    except (OSError, ValueError, IndexError):
        return False


def _mark(path: Path, name: str) -> None:
    with open(path, "a") as f:  # same clock and format as omnigent.config.timeline
        f.write(f"{name} {time.monotonic():.6f} {os.getpid()}\n")


def read_timeline(path: Path) -> dict[str, float]:
    """Each point's first time; a runner's points are the first runner's (the spare's come later)."""
    points: dict[str, float] = {}
    for line in path.read_text().splitlines():
        name, at = line.split()[:2]  # (then the pid, and a server's counts where they are taken)
        points.setdefault(name, float(at))
    return points


def fresh_home(env: dict[str, str]) -> tuple[Path, dict[str, str]]:
    home = Path(tempfile.mkdtemp(prefix="omnigent-bench-home-"))
    return home, {**env, "HOME": str(home)}


def startup(env: dict[str, str], runs: int, mem_runs: int) -> dict[str, list]:
    py = sys.executable
    floor_argv = [py, "-c", "import openai, trio"]
    p_argv = [py, "-m", "omnigent", "run", str(AGENT), "-p", "Say hi"]
    c_argv = [py, "-m", "omnigent", "run", str(AGENT), "--continue"]
    cont_home, cont_env = fresh_home(env)
    timed(p_argv, cont_env)  # the conversation --continue resumes; warms the page cache too
    timed(floor_argv, env)
    f: dict[str, list] = {k: [] for k in ("p_wall", "p_cpu", "c_wall", "c_cpu", "floor_wall", "floor_cpu",
                                          "p_ratio", "c_ratio", "p_cpu_ratio", "c_cpu_ratio", "timelines",
                                          "p_pss", "c_pss", "left")}

    def floor() -> tuple[float, float]:
        wall, cpu, _ = timed(floor_argv, env)
        f["floor_wall"].append(wall)
        f["floor_cpu"].append(cpu)
        return wall, cpu

    def one_p() -> tuple[float, float]:
        home, run_env = fresh_home(env)
        tl = home / "timeline"
        tag = uuid.uuid4().hex
        wall, cpu, _ = timed(p_argv, {**run_env, "OMNIGENT_BENCH_TAG": tag}, timeline=tl)
        f["timelines"].append(read_timeline(tl))
        f["left"].append(sum(alive(pid) for pid in tagged_pids(tag)))
        shutil.rmtree(home, ignore_errors=True)
        return wall, cpu

    def one_c() -> tuple[float, float]:
        wall, cpu, _ = timed(c_argv, cont_env, input="Say hi again\n")
        return wall, cpu

    for n in range(runs):
        for kind, run in (("p", one_p), ("c", one_c)) if n % 2 == 0 else (("c", one_c), ("p", one_p)):
            if n % 2 == 0:
                fw, fc = floor()
                wall, cpu = run()
            else:
                wall, cpu = run()
                fw, fc = floor()
            f[f"{kind}_wall"].append(wall)
            f[f"{kind}_cpu"].append(cpu)
            f[f"{kind}_ratio"].append(wall / fw)
            f[f"{kind}_cpu_ratio"].append(cpu / fc)
    for _ in range(mem_runs):
        home, run_env = fresh_home(env)
        f["p_pss"].append(timed(p_argv, run_env, tag=uuid.uuid4().hex)[2])
        shutil.rmtree(home, ignore_errors=True)
        f["c_pss"].append(timed(c_argv, cont_env, input="Say hi again\n", tag=uuid.uuid4().hex)[2])
    shutil.rmtree(cont_home, ignore_errors=True)
    return f


def recovery(url: str, rounds: int) -> dict[str, list[float]]:
    from bench_recovery import measure

    os.environ.update(OPENAI_BASE_URL=f"{url}/v1", OPENAI_API_KEY="mock")
    return measure(1, rounds, url)  # one runner and the warm spare, as the REPL has


def segments(timelines: list[dict[str, float]]) -> list[tuple[str, float, float]]:
    """(segment, median duration, median time since spawn) between consecutive points present in every run."""
    names = [n for n in POINTS if all(n in t for t in timelines)]
    names.sort(key=lambda n: statistics.median(t[n] - t["bench.spawn"] for t in timelines))
    rows = []
    for a, b in zip(names, names[1:]):
        rows.append((f"{a} -> {b}", statistics.median(t[b] - t[a] for t in timelines),
                     statistics.median(t[b] - t["bench.spawn"] for t in timelines)))
    return rows


# the figures of other scripts, run after the table on request: (flag, script and its arguments)
_MORE = (("sessions", ["bench_sessions.py"]), ("history", ["bench_history.py"]), ("watchers", ["bench_watchers.py"]),
         ("streaming", ["bench_sessions.py", "--stream-words", "20", "--token-ms", "10", "--lone", "150",
                        "--paced-s", "10", "--closed-s", "5"]))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=9)
    parser.add_argument("--mem-runs", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=5, help="recovery rounds")
    parser.add_argument("--no-recovery", action="store_true")
    parser.add_argument("--compile", action="store_true", help="compile omnigent's modules first, as pip does")
    for name, command in _MORE:
        parser.add_argument(f"--{name}", action="store_true", help=f"also the figures of {' '.join(command)}")
    parser.add_argument("--all", action="store_true", help="also " + ", ".join(" ".join(c) for _, c in _MORE))
    args = parser.parse_args()
    if args.compile:
        import compileall

        for package in ("omnigent", "protocol", "supervisor"):
            compileall.compile_dir(REPO / package, quiet=1)
    compiled = (REPO / "protocol" / "__pycache__").is_dir()
    mock, url = start_mock()
    env = {**os.environ, "OPENAI_BASE_URL": f"{url}/v1", "OPENAI_API_KEY": "mock"}
    try:
        f = startup(env, args.runs, args.mem_runs)
        rec = None if args.no_recovery else recovery(url, args.rounds)
    finally:
        mock.terminate()
        mock.wait()
    med = statistics.median
    floor_w, floor_c = med(f["floor_wall"]), med(f["floor_cpu"])
    print(f"machine: {os.cpu_count()} cores ({len(os.sched_getaffinity(0))} usable), load average "
          f"{os.getloadavg()[0]:.2f}; {args.runs} alternating pairs, medians"
          + ("; PYTHONDONTWRITEBYTECODE is set" if os.environ.get("PYTHONDONTWRITEBYTECODE") else "")
          + ("; omnigent's modules compiled (__pycache__)" if compiled else "; omnigent's modules not compiled"))
    print(f"floor `python -c \"import openai, trio\"`: wall {floor_w:.3f} s, CPU {floor_c:.3f} s")
    print()
    print("| what | ratio to the floor | absolute |")
    print("| --- | --- | --- |")
    print(f"| cold `run -p`, wall | {med(f['p_ratio']):.2f}× | {med(f['p_wall']):.3f} s |")
    print(f"| cold `run -p`, CPU of all processes | {med(f['p_cpu_ratio']):.2f}× | {med(f['p_cpu']):.3f} s |")
    print(f"| `--continue` + one piped prompt, wall | {med(f['c_ratio']):.2f}× | {med(f['c_wall']):.3f} s |")
    print(f"| `--continue` + one piped prompt, CPU of all processes | {med(f['c_cpu_ratio']):.2f}× "
          f"| {med(f['c_cpu']):.3f} s |")
    print(f"| CPU of `--continue` over `-p` | {med(f['c_cpu']) / med(f['p_cpu']):.2f}× "
          f"| {med(f['c_cpu']) - med(f['p_cpu']):+.3f} s |")
    print(f"| peak PSS of all processes, `-p` / `--continue` (max of {args.mem_runs}) | | "
          f"{max(f['p_pss']) / 1024:.0f} / {max(f['c_pss']) / 1024:.0f} MiB |")
    print(f"| processes left after `-p` exits | | {sum(f['left'])} |")
    if rec is not None:
        print(f"| SIGKILL idle runner -> replacement online, rebound (warm spare, {args.rounds} rounds) "
              f"| {med(rec['idle']) / floor_w:.3f}× | {med(rec['idle']):.3f} s (max {max(rec['idle']):.3f}) |")
        print(f"| SIGKILL mid-turn -> answer shown (warm spare) | {med(rec['midturn']) / floor_w:.3f}× "
              f"| {med(rec['midturn']):.3f} s (max {max(rec['midturn']):.3f}) |")
        print(f"| runner processes' PSS with the spare | | {rec['runner_pss'][0]:.0f} MiB |")
    print()
    print("`-p` timeline (OMNIGENT_TIMELINE), medians:")
    print("| segment | duration | at (since spawn) |")
    print("| --- | --- | --- |")
    for name, duration, at in segments(f["timelines"]):
        print(f"| {name} | {duration * 1000:.0f} ms | {at * 1000:.0f} ms |")
    for name, (script, *script_args) in _MORE:
        if args.all or getattr(args, name):
            print()
            print(f"{' '.join([script, *script_args])}:", flush=True)
            subprocess.run([sys.executable, str(REPO / "scripts" / script), *script_args], check=False,
                           stdin=subprocess.DEVNULL)


if __name__ == "__main__":
    main()
