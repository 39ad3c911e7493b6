"""The terminal Markdown renderer (pure): what it styles, and the characters it never changes."""

from __future__ import annotations

import pytest

from omnigent.repl.markdown import MarkdownStream, inline, plain, render, safe

LITERAL = ["Reply: SESSION_LIFECYCLE_OK", "a_b_c", "2*3*4", "/usr/*/bin/*", "x.*y*", "*a*/b", "snake_case_name and __init__", "a * b * c",
           "def f(*args, **kwargs):", "**unclosed", "see https://x.com/*a*/b_c_d", "[x](http://a/b_c_)",
           "foo`bar`", "5*3 = 15, 2*4 = 8", "_single_ word"]


@pytest.mark.parametrize("text", LITERAL)
def test_what_is_not_emphasis_is_left_exactly_as_it_is(text):
    assert render(text) == text


@pytest.mark.parametrize("text, shown", [
    ("**Reply**: SESSION_LIFECYCLE_OK", "Reply: SESSION_LIFECYCLE_OK"),
    ("*it* and ***both*** and _an emphasised phrase_", "it and both and an emphasised phrase"),
    ("use `a_b*c*` here", "use a_b*c* here"),
    ("# Title with SESSION_LIFECYCLE_OK", "Title with SESSION_LIFECYCLE_OK"),
    ("## Sub ##", "Sub"),
    ("- item **b**", "• item b"),
    ("  * nested", "  • nested"),
    ("3. **third**", "3. third"),
    ("> quoted", "│ quoted"),
    (r"\*not emphasis\*", "*not emphasis*"),
])
def test_rendered_lines_keep_every_word(text, shown):
    rendered = render(text)
    assert rendered != text  # something was styled
    assert plain(rendered) == shown
    assert safe(rendered)


def test_styles_sit_at_word_edges_only():
    rendered = render("**Reply**: SESSION_LIFECYCLE_OK")
    assert rendered == "\x1b[1mReply\x1b[0m: SESSION_LIFECYCLE_OK"
    assert "SESSION_LIFECYCLE_OK" in rendered  # the marker's bytes are contiguous
    assert safe("\x1b[1mab\x1b[0mc") is False  # a code inside a word is what `safe` refuses
    assert inline("x *y* z") == "x \x1b[3my\x1b[0m z"


def test_lines_are_rendered_once_complete_and_never_rewrapped():
    stream = MarkdownStream()
    assert stream.feed("**Rep") == ""  # an unfinished line is held, never shown half-styled
    assert stream.feed("ly**: SESSION_") == ""
    assert stream.feed("LIFECYCLE_OK\nnext ") == "\x1b[1mReply\x1b[0m: SESSION_LIFECYCLE_OK\n"
    assert stream.flush() == "next "  # the message ended: the rest as it is
    long = "word " * 200
    assert render(long) == long  # no newline is ever inserted


def test_fences_stay_visible_and_their_code_is_highlighted_without_changing_it():
    stream = MarkdownStream()
    out = stream.feed("```python\ndef f(a_b):\n    return a_b*2  # *not* emphasis\n```\n**after**\n")
    lines = out.split("\n")
    assert [plain(line) for line in lines] == [
        "```python", "def f(a_b):", "    return a_b*2  # *not* emphasis", "```", "after", ""]
    assert lines[1] != plain(lines[1])  # highlighted
    assert all(safe(line) for line in lines)
    unknown = render("~~~nosuchlanguage\nx *y* z\n~~~")
    assert unknown.split("\n")[1] == "x *y* z"  # in a fence nothing is Markdown


def test_a_flush_ends_an_open_fence():
    stream = MarkdownStream()
    stream.feed("```\ncode *x*\n")
    stream.flush()
    assert stream.feed("*x*\n") == "\x1b[3mx\x1b[0m\n"
