"""Round trips and malformed frames for the wire protocol."""

import json

import pytest

import protocol as p
from protocol import ProtocolError

SAMPLES = [
    p.Hello(runner_id="runner_1", pid=42, protocol_version=p.PROTOCOL_VERSION, harnesses=["openai-chat"]),
    p.HelloAck(ping_interval=1.5),
    p.TurnStart(turn_id="turn_1", session_id="conv_1", attempt=2, agent={"name": "a"},
                input=[{"type": "message", "role": "user", "content": "hi"}], model="m",
                reasoning_effort="high"),
    p.TurnStart(turn_id="turn_1", session_id="conv_1", attempt=1, agent={}, input=[], model="m"),
    p.TurnEvent(turn_id="turn_1", event={"type": "response.output_text.delta", "delta": "x"}),
    p.TurnCompleted(turn_id="turn_1", response_id="resp_1", output=[{"type": "message"}], usage=None),
    p.TurnFailed(turn_id="turn_1", code="model_error", message="boom"),
    p.TurnFailed(turn_id="turn_1", code="stream_dropped", message="the model's stream ended after 3 characters",
                 output=[{"type": "message", "role": "assistant", "status": "incomplete", "content": []}]),
    p.Cancel(turn_id="turn_1"),
    p.Ping(ts=1.0),
    p.Pong(ts=2),
    p.HostHello(host_id="host_1", pid=1, protocol_version=p.PROTOCOL_VERSION),
    p.RunnerLaunched(runner_id="runner_1", pid=3, log_path="/tmp/x.log"),
    p.RunnerExited(runner_id="runner_1", code=None, signal=9, reason="killed by SIGKILL"),
    p.RunnerOnline(runner_id="runner_1"),
    p.LaunchRunner(request_id="r1"),
    p.KillRunner(runner_id="runner_1", reason="hung"),
]


@pytest.mark.parametrize("frame", SAMPLES, ids=lambda f: f.kind)
def test_round_trip(frame):
    assert p.decode(p.encode(frame)) == frame
    assert p.decode(p.encode(frame).encode()) == frame


def _raw(**data):
    return json.dumps(data)


@pytest.mark.parametrize(
    ("raw", "needle"),
    [
        ("not json", "not JSON"),
        ("[1, 2]", "not a JSON object"),
        (_raw(kind="nope"), "unknown frame kind 'nope'"),
        (_raw(ts=1.0), "unknown frame kind None"),
        (_raw(kind="ping"), "missing field 'ts'"),
        (_raw(kind="ping", ts="soon"), "field 'ts' must be float"),
        (_raw(kind="ping", ts=True), "field 'ts' must be float"),
        (_raw(kind="ping", ts=1, extra=1), "unexpected field 'extra'"),
        (_raw(kind="hello", runner_id="r", pid=1.5, protocol_version=1, harnesses=[]), "field 'pid'"),
        (_raw(kind="hello", runner_id="r", pid=1, protocol_version=1, harnesses=[1]), "field 'harnesses'"),
        (_raw(kind="turn.failed", turn_id="t", code=None, message="m"), "field 'code'"),
        (_raw(kind="hello", runner_id="r", pid=True, protocol_version=1, harnesses=[]), "field 'pid' must be int"),
        (_raw(kind="turn.start", turn_id="t", session_id="s", attempt=1, agent={}, input=[{}, 1], model="m"),
         "field 'input' must be list"),
        (_raw(kind="turn.start", turn_id="t", session_id="s", attempt=1, agent={}, input=[], model="m",
              reasoning_effort=3), "field 'reasoning_effort' must be str | None"),
        (_raw(kind="turn.completed", turn_id="t", response_id="r", output=[], usage=[]), "field 'usage'"),
        (_raw(kind="host.runner_exited", runner_id="r", code=False, signal=None, reason=""), "field 'code'"),
    ],
)
def test_malformed_frames_raise_one_error(raw, needle):
    with pytest.raises(ProtocolError) as info:
        p.decode(raw)
    assert needle in info.value.reason
    assert info.value.close_code == ProtocolError.MALFORMED


def test_other_protocol_version_is_refused():
    raw = _raw(kind="hello", runner_id="r", pid=1, protocol_version=99, harnesses=[])
    with pytest.raises(ProtocolError) as info:
        p.decode(raw)
    assert info.value.close_code == ProtocolError.VERSION
    assert "99" in info.value.reason


def test_oversized_frame_is_refused_before_parsing():
    raw = "x" * (p.MAX_FRAME_BYTES + 1)
    with pytest.raises(ProtocolError) as info:
        p.decode(raw)
    assert info.value.close_code == ProtocolError.TOO_LARGE


def test_events_are_checked():
    ev = p.make_event("response.output_text.delta", turn_id="t", delta="hi")
    assert p.decode_event(json.dumps({**ev, "sequence_number": 3}))["delta"] == "hi"
    retry = p.make_event("session.model.retry", turn_id="t", error="model error 429 (rate limited)", attempt=2,
                         attempts=3, delay=1.2)
    assert p.decode_event(json.dumps(retry)) == retry
    for bad in (
        {"type": "response.nope"},
        {"type": "response.output_text.delta", "turn_id": "t"},
        {"type": "response.created", "turn_id": "t", "attempt": True},
        {"type": "session.heartbeat", "sequence_number": "1"},
        {"type": "session.model.retry", "turn_id": "t", "error": "x", "attempt": 2, "attempts": 3, "delay": "1"},
    ):
        with pytest.raises(ProtocolError):
            p.decode_event(bad)
    with pytest.raises(ProtocolError):
        p.make_event("session.status")


def test_every_frame_class_is_known_to_the_decoder():
    """A frame added to its module but not to that module's list could be sent and never decoded."""
    import protocol.codec
    import protocol.host_frames
    import protocol.runner_frames

    def subclasses(cls):
        for sub in cls.__subclasses__():
            yield sub
            yield from subclasses(sub)

    defined = {cls for cls in subclasses(p.Frame) if cls.__module__.startswith("protocol.")}
    assert defined == set(protocol.codec.FRAME_TYPES.values())
    assert len(protocol.codec.FRAME_TYPES) == len(defined)  # no two share a kind
