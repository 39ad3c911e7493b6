"""What one simulation seed does: a fault schedule drawn from `random.Random`, nothing else.

A `Plan` is pure data drawn from the seed alone: the pool size, the restart
policy, the recovery knobs, when each session posts its messages, and when
runners are killed from outside. What the n-th launched runner process does
(fail or stall at start, hang while idle, and per turn: answer, die, hang,
fail like a model error, linger after death, answer twice) is drawn on demand
by `launch_script(seed, n)` from its own `Random(f"{seed}/launch/{n}")`, so it
does not depend on how many draws other parts of the run made first.

Every knob is drawn within the range the real defaults live in, some seeds
calm and some hostile (a seed's `hostility` scales every fault probability),
so both long healthy runs and crash loops that exhaust the restart intensity
come up.

Agent steps: a model step may answer with tool calls (read-only and
side-effecting, one to three at once), and each ToolStart a process gets
answers, dies at start, dies mid-tool, dies right after its result or
hangs, drawn from the process's own `Random(f"{seed}/launch/{n}/tools")`.
Each session has a permission mode (auto, ask, deny) and, under ask, an
approval timeout (None: a watching client answers allow, deny or always
after a drawn delay; 0: refused at once; or a few seconds), from
`session_setup(seed, i)`.
"""

from __future__ import annotations

import random
import signal
from dataclasses import dataclass

from supervisor import RestartPolicy
from tests.support.fake_runners import SIGKILL, RunnerScript, ToolScript, TurnScript

SIGTERM = int(signal.SIGTERM)


@dataclass(frozen=True)
class Post:
    """One user message: at time `at`, or `at` seconds after the session's previous turn ended."""

    at: float
    after_previous: bool


@dataclass(frozen=True)
class Kill:
    """An external `kill -SIG` of a live runner process at `at` (if any is alive).

    `victim` in [0, 1) picks among the live processes in launch order. With
    `post_session` set, that session posts a message `post_delay` s after the
    kill, while the slot is respawning.
    """

    at: float
    victim: float
    sig: int
    post_session: int | None = None
    post_delay: float = 0.0


@dataclass(frozen=True)
class Plan:
    seed: int
    hostility: float
    runners: int
    policy: RestartPolicy
    max_attempts: int
    ping_interval: float
    ping_allowance: float
    runner_wait: float
    startup_timeout: float
    sessions: tuple[tuple[Post, ...], ...]
    kills: tuple[Kill, ...]

    def describe(self) -> str:
        p = self.policy
        return (f"seed {self.seed}: hostility {self.hostility:.2f}, {self.runners} runner(s), "
                f"{len(self.sessions)} session(s) with {[len(s) for s in self.sessions]} message(s), "
                f"{len(self.kills)} external kill(s); policy base {p.base:.3f} factor {p.factor} "
                f"cap {p.cap:.2f} jitter {p.jitter} reset_after {p.reset_after} intensity {p.intensity} "
                f"period {p.period}; attempts {self.max_attempts}, ping {self.ping_interval:.2f} s "
                f"x {self.ping_allowance:.1f}, runner_wait {self.runner_wait:.1f} s, "
                f"startup_timeout {self.startup_timeout:.1f} s")


def draw_plan(seed: int) -> Plan:
    rng = random.Random(f"{seed}/plan")
    hostility = rng.choice([0.0, 0.3, 0.6, 1.0, 1.5])
    policy = RestartPolicy(
        base=round(rng.uniform(0.05, 1.0), 3), factor=rng.choice([1.5, 2.0]), cap=round(rng.uniform(1.0, 6.0), 2),
        jitter=rng.choice([0.0, 0.1, 0.25]), reset_after=rng.choice([5.0, 30.0]),
        intensity=rng.randint(2, 6), period=rng.choice([10.0, 30.0]),
    )
    sessions = []
    for _ in range(rng.randint(1, 4)):
        posts = []
        for _ in range(rng.randint(1, 4)):
            if rng.random() < 0.5:
                posts.append(Post(round(rng.uniform(0, 3), 3), after_previous=True))
            else:
                posts.append(Post(round(rng.uniform(0, 30), 3), after_previous=False))
        sessions.append(tuple(posts))
    kills = []
    for _ in range(rng.choices([0, 1, 2, 3, 5], weights=[3, 3, 2, 1, 1])[0] if hostility else 0):
        during = rng.random() < 0.4
        kills.append(Kill(
            at=round(rng.uniform(0, 30), 3), victim=rng.random(),
            sig=SIGKILL if rng.random() < 0.8 else SIGTERM,
            post_session=rng.randrange(len(sessions)) if during else None,
            post_delay=round(rng.uniform(0, 1.0), 3),
        ))
    return Plan(
        seed=seed, hostility=hostility, runners=rng.choice([1, 1, 2, 3]), policy=policy,
        max_attempts=rng.randint(1, 4), ping_interval=rng.choice([0.5, 1.0]),
        ping_allowance=rng.choice([3.0, 5.0]), runner_wait=rng.choice([5.0, 30.0]),
        startup_timeout=rng.choice([3.0, 20.0]), sessions=tuple(sessions),
        kills=tuple(sorted(kills, key=lambda k: k.at)),
    )


TOOL_CALLS = (("read_file", '{"path": "a.txt"}'), ("grep", '{"pattern": "x"}'),
              ("shell", '{"command": "echo 1 >> f"}'), ("shell", '{"command": "make"}'),
              ("write_file", '{"path": "b.txt", "content": "b"}'), ("edit_file", '{"path": "b.txt", '
                                                                     '"old_string": "b", "new_string": "c"}'))


@dataclass(frozen=True)
class SessionSetup:
    mode: str                          # the session's permission mode
    approval_timeout: float | None     # its messages' (ask only); None: a client answers
    answer_delay: float                # how long the watching client takes to answer


def session_setup(seed: int, index: int) -> SessionSetup:
    rng = random.Random(f"{seed}/session/{index}")
    mode = rng.choice(["auto", "auto", "ask", "ask", "deny"])
    return SessionSetup(mode, rng.choice([None, None, 0.0, 3.0]), round(rng.uniform(0, 4), 3))


def decision(seed: int, session: int, n: int) -> str:
    """The watching client's answer to the n-th approval of a session."""
    return random.Random(f"{seed}/approve/{session}/{n}").choice(["allow", "allow", "deny", "always"])


def launch_script(plan: Plan, index: int) -> RunnerScript:
    """What the `index`-th launched process does, from its own stream of the seed."""
    rng = random.Random(f"{plan.seed}/launch/{index}")
    h = plan.hostility
    tag = f"#{index}"
    roll = rng.random()
    if roll < 0.12 * h:  # exits before its hello: a failing start
        return RunnerScript(start_exit=rng.choice([1, 3, 70]), start_exit_after=round(rng.uniform(0, 1), 3),
                            log_line=f"fake runner {tag} cannot start")
    if roll < 0.15 * h:  # never says hello: the host's startup timeout kills it
        return RunnerScript(hello_after=1e6)
    hello_after = round(rng.uniform(0.5, 5.0), 3) if rng.random() < 0.2 * h else round(rng.uniform(0, 0.2), 3)
    hang_after = round(rng.uniform(0, 30), 3) if rng.random() < 0.05 * h else None
    turns = tuple(_turn_script(rng, h, f"{tag}.{i}") for i in range(6))
    tools_rng = random.Random(f"{plan.seed}/launch/{index}/tools")
    turns = tuple(_with_calls(tools_rng, turn) for turn in turns)
    tools = tuple(_tool_script(tools_rng, h, f"{tag}.tool{i}") for i in range(6))
    return RunnerScript(turns=turns, default_turn=TurnScript("answer", after=0.5, text=f"answer {tag}.default"),
                        hello_after=hello_after, hang_after=hang_after, tools=tools)


def _with_calls(rng: random.Random, turn: TurnScript) -> TurnScript:
    """An answer becomes a step with tool calls, sometimes."""
    if turn.action != "answer" or rng.random() >= 0.35:
        return turn
    picked = tuple(rng.choice(TOOL_CALLS) for _ in range(rng.randint(1, 3)))
    return TurnScript("answer", after=turn.after, text=turn.text if rng.random() < 0.3 else "", calls=picked,
                      die_after=rng.random() < 0.03)


def _tool_script(rng: random.Random, h: float, tag: str) -> ToolScript:
    after = round(rng.uniform(0.05, 3.0), 3)
    roll = rng.random()
    if (roll := roll - 0.05 * h) < 0:
        return ToolScript("die", after=0.0)
    if (roll := roll - 0.06 * h) < 0:
        return ToolScript("die", after=after, partial=f"partial {tag}\n")
    if (roll := roll - 0.03 * h) < 0:
        return ToolScript("result", after=after, output=f"out {tag}", die_after=True)
    if (roll := roll - 0.02 * h) < 0:
        return ToolScript("hang", after=after)
    return ToolScript("result", after=after, output=f"out {tag}",
                      status=rng.choice(["completed", "completed", "completed", "error", "timeout"]))


def _turn_script(rng: random.Random, h: float, tag: str) -> TurnScript:
    after = round(rng.uniform(0.05, 3.0), 3)
    text = f"answer {tag}"
    roll = rng.random()
    if (roll := roll - 0.06 * h) < 0:
        return TurnScript("die", after=after, returncode=rng.choice([-SIGKILL, -SIGTERM, 1, 0]),
                          partial=f"partial {tag}" if rng.random() < 0.5 else "")
    if (roll := roll - 0.03 * h) < 0:
        return TurnScript("hang", after=after)
    if (roll := roll - 0.06 * h) < 0:
        return TurnScript("fail", after=after, code="model_error", message=f"the fake model failed {tag}",
                          partial=f"partial {tag}" if rng.random() < 0.3 else "")
    if (roll := roll - 0.02 * h) < 0:
        return TurnScript("exit_linger", after=after, returncode=1, partial=f"partial {tag}",
                          linger=round(rng.uniform(0, 1.5), 3), text=f"late {tag}")
    if (roll := roll - 0.03 * h) < 0:
        return TurnScript("duplicate", after=after, text=text, duplicate_text=f"duplicate {tag}")
    return TurnScript("answer", after=after, text=text)
