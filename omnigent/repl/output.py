"""What `omnigent run -p` prints: text, one JSON object, or JSON lines (`--output-format`).

Version 1 of the shapes (`FORMAT_VERSION`). Within a version fields are only
ever added, never renamed or removed; a change that would break a reader
gets version 2.

`text` (the default): the answer on stdout, nothing else. On stderr, one
line per tool call (`  ⚙ shell: ls`) and per result (`  ↳ …`), and every
notice (model retries, recovered steps, calls not approved, errors).

`json`: one object on stdout when the turn has ended::

    {"version": 1, "session_id": "conv_…", "result": "the answer", "is_error": false,
     "num_steps": 2, "usage": {"input_tokens": 812, "output_tokens": 64, "total_tokens": 876},
     "duration_ms": 1532}

`stream-json`: one JSON object per line on stdout, as the turn happens::

    {"type": "init", "version": 1, "session_id": "conv_…"}             first, exactly once
    {"type": "text", "delta": "…"}                                       answer text as it arrives
    {"type": "tool_call", "call_id": "…", "tool": "shell", "arguments": "{\\"command\\": \\"ls\\"}", "step": 1}
    {"type": "tool_result", "call_id": "…", "tool": "shell", "status": "completed", "output": "…"}
    {"type": "incident", "message": "recovered: shell (step 1) was marked interrupted: …"}
    {"type": "result", "version": 1, "session_id": …, "result": …, "is_error": …,
     "num_steps": …, "usage": …, "duration_ms": …}                     last, exactly once

Fields:
- `result`: the text of the turn's last model step, i.e. the assistant text
  after the last tool call or result (text the model wrote before calling a
  tool is not the answer; it is in the `text` lines). "" when there is none.
- `is_error`: the turn failed (the `max_steps` bound included), was
  cancelled, or could not be followed to its end. The reason is also said
  on stderr (`Error: …`) and the exit code is 1. A call that was not approved
  is not an error: the model is told and the turn goes on.
- `num_steps`: the model steps the turn took (one per model call that completed).
- `usage`: the turn's tokens summed over its model steps (zeros when the
  endpoint reports none).
- `duration_ms`: from the message being posted to the turn's end.
- `tool_call.arguments` is the JSON text the model sent; `tool_result.status`
  is `completed`, `error`, `timeout`, `refused`, `not_approved`,
  `interrupted`, `cancelled` or `not_run`.

JSON is written with non-ASCII characters as they are, except U+007F-U+009F,
which are escaped (`\\u009b`) like the C0 controls are, so a terminal showing
the lines cannot be driven by them.
"""

from __future__ import annotations

import json
import re
import sys
from typing import Any, TextIO

from protocol import events as ev

from ..client import message_text
from . import steps
from .render import no_text_notice, rebound_notice, retry_notice
from .safe import neutralise
from .steps import final_text

FORMAT_VERSION = 1
FORMATS = ("text", "json", "stream-json")
_C1 = re.compile("[\x7f-\x9f]")


def dumps(obj: Any) -> str:
    """One line of JSON, C1 controls escaped (see module doc)."""
    return _C1.sub(lambda m: f"\\u{ord(m.group()):04x}", json.dumps(obj, ensure_ascii=False))


def usage_of(raw: Any) -> dict[str, int]:
    """{input_tokens, output_tokens, total_tokens} from a Responses or a Chat Completions usage dict."""
    raw = raw if isinstance(raw, dict) else {}

    def num(*names: str) -> int:
        for name in names:
            value = raw.get(name)
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                return int(value)
        return 0

    inp, out = num("input_tokens", "prompt_tokens"), num("output_tokens", "completion_tokens")
    return {"input_tokens": inp, "output_tokens": out, "total_tokens": num("total_tokens") or inp + out}


class Output:
    """Follows one `-p` turn's events and prints them in `fmt` (one of FORMATS)."""

    def __init__(self, fmt: str = "text", *, out: TextIO | None = None, err: TextIO | None = None) -> None:
        if fmt not in FORMATS:
            raise ValueError(f"output format must be one of {FORMATS}")
        self.fmt = fmt
        self.out = out or sys.stdout
        self.err = err or sys.stderr
        self.session_id: str | None = None
        self.calls = steps.Calls()
        self._steps: set[tuple[Any, Any]] = set()  # (turn_id, step) of each completed model step
        self._usage: dict[str, Any] | None = None   # the turn's sum so far (session.usage)
        self._answer: list[str] = []                # texts since the last tool call or result
        self._deltas: list[str] = []                # the message streaming now
        self._streamed: list[str] = []              # every delta of the turn (a dropped stream's partial)
        self._refused: set[str] = set()
        self._held: dict[str, tuple[str | None, str, Any]] = {}  # calls seen only as the model's items
        self._completed: dict[str, Any] | None = None
        self._inited = False
        self._finished = False

    # --- printing -------------------------------------------------------------

    def _line(self, obj: dict[str, Any]) -> None:
        self.out.write(dumps(obj) + "\n")
        self.out.flush()

    def _say(self, text: str) -> None:
        """A line on stderr, in every format."""
        self.err.write(text + "\n")
        self.err.flush()

    def _incident(self, message: str) -> None:
        if self.fmt == "stream-json":
            self._line({"type": "incident", "message": message})
        self._say(message)

    # --- the turn -------------------------------------------------------------

    def init(self, session_id: str | None) -> None:
        """The session is known (None: it could not be created); stream-json says so first."""
        self.session_id = session_id
        if self.fmt == "stream-json" and not self._inited:
            self._line({"type": "init", "version": FORMAT_VERSION, "session_id": session_id})
        self._inited = True

    def event(self, event: dict[str, Any]) -> None:
        kind = event.get("type")
        call, result = steps.event_call(event), steps.event_result(event)
        if call is not None and kind == ev.ITEM_DONE:
            # the model's call item: announced when it starts or is asked about (those say its step)
            self._held.setdefault(call[0] or "", call)
            self._answer.clear()
            self._deltas.clear()
        elif call is not None:
            held = self._held.pop(call[0] or "", None)
            if held is not None and "arguments" not in event:  # a completion: the model's item has them
                call = held
            self._call(event, *call)
        if result is not None:
            held = self._held.pop(result[0] or "", None)
            if held is not None:
                self._call({}, *held)
            self._result(*result)
        if call is not None or result is not None:
            return
        if kind == ev.RESPONSE_CREATED:
            self._deltas.clear()
            self._answer.clear()
        elif kind == ev.TEXT_DELTA:
            self._deltas.append(event["delta"])
            self._streamed.append(event["delta"])
            if self.fmt == "stream-json":
                self._line({"type": "text", "delta": event["delta"]})
        elif kind == ev.ITEM_DONE:
            item = event.get("item") or {}
            if item.get("type", "message") == "message" and item.get("role") == "assistant":
                text = message_text(item)
                if not self._deltas and text and self.fmt == "stream-json":
                    self._line({"type": "text", "delta": text})  # the model sent no deltas
                self._answer.append(text or "".join(self._deltas))
                self._deltas.clear()
        elif kind == ev.USAGE:
            self._steps.add((event.get("turn_id"), event.get("step")))
            self._usage = event.get("turn")
        elif kind == ev.COMPLETED:
            self._completed = event.get("response") or {}
        elif kind == ev.MODEL_RETRY:
            self._incident(retry_notice(event))
        elif kind == ev.RUNNER_REBOUND:
            self._incident(rebound_notice(event))
        elif kind == ev.STEP_RECOVERED:
            self._incident(steps.recovered_notice(event))
        elif kind == ev.APPROVAL_RESOLVED and event.get("decision") == "timeout":
            approval = str(event.get("approval_id"))
            if approval not in self._refused:
                self._refused.add(approval)
                self._incident(steps.not_approved_line(
                    str(event.get("tool") or self.calls.tool_of(event.get("call_id")))))

    def _call(self, event: dict[str, Any], call_id: str | None, tool: str, arguments: Any) -> None:
        line = self.calls.call(call_id, tool, arguments)
        self._answer.clear()
        self._deltas.clear()
        if line is None:
            return
        if self.fmt == "stream-json":
            self._line({"type": "tool_call", "call_id": call_id, "tool": tool,
                        "arguments": arguments if isinstance(arguments, str) else json.dumps(arguments),
                        "step": event.get("step")})
        elif self.fmt == "text":
            self._say(line)

    def _result(self, call_id: str | None, output: Any, status: str | None) -> None:
        line = self.calls.result(call_id, output, status)
        self._answer.clear()
        self._deltas.clear()
        if line is None:
            return
        if self.fmt == "stream-json":
            self._line({"type": "tool_result", "call_id": call_id, "tool": self.calls.tool_of(call_id),
                        "status": status or "completed", "output": output if isinstance(output, str)
                        else json.dumps(output)})
        elif self.fmt == "text":
            self._say(line)

    # --- the end ----------------------------------------------------------------

    def answer(self) -> str:
        output = (self._completed or {}).get("output")
        if isinstance(output, list) and output:
            return final_text([i for i in output if isinstance(i, dict)])
        return "".join(self._answer) or "".join(self._deltas)

    def summary(self, *, is_error: bool, duration_ms: float, answer: str | None = None) -> dict[str, Any]:
        completed = self._completed or {}
        usage = completed.get("usage") if isinstance(completed.get("usage"), dict) else self._usage
        num_steps = len(self._steps) or (1 if self._completed is not None else 0)
        return {"version": FORMAT_VERSION, "session_id": self.session_id,
                "result": "" if self._completed is None else (self.answer() if answer is None else answer),
                "is_error": is_error, "num_steps": num_steps, "usage": usage_of(usage),
                "duration_ms": max(0, int(duration_ms))}

    def finish(self, *, status: str, error: dict[str, Any] | None = None, duration_ms: float = 0,
               quiet: bool = False) -> int:
        """Print the outcome once (`status`: completed|failed|cancelled|lost); returns the exit code.

        `quiet`: the caller says the error itself (no `Error:` line here).
        """
        if self._finished:
            return 0 if status == "completed" else 1
        self._finished = True
        answer = self.answer()  # before the held calls are shown (showing one starts a new answer)
        for held in list(self._held.values()):  # calls that never started (the turn ended first)
            self._call({}, *held)
        self._held.clear()
        self.init(self.session_id)  # stream-json: an init line even when the session never came to be
        is_error = status != "completed"
        if is_error:
            error = error or {}
            partial = "".join(self._streamed)
            if self.fmt == "text" and error.get("code") == "stream_dropped" and partial:
                self.out.write(neutralise(partial) + "\n")  # the partial answer; the error line says it is one
                self.out.flush()
            message = error.get("message") or ("the turn was cancelled" if status == "cancelled" else status)
            if not quiet:
                self._say(f"Error: {neutralise(str(message))}")
        if self.fmt == "text":
            if not is_error:
                text = answer
                notice = no_text_notice((self._completed or {}).get("output") or ())
                if not text.strip():
                    self._say(notice or "(the model's answer was empty)")
                else:
                    self.out.write(neutralise(text) + "\n")
                    self.out.flush()
        else:
            summary = self.summary(is_error=is_error, duration_ms=duration_ms, answer=answer)
            self._line({"type": "result", **summary} if self.fmt == "stream-json" else summary)
        return 1 if is_error else 0
