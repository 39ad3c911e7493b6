"""Tables aligned by display width (pure): wide characters, combining marks, the cut last column."""

from __future__ import annotations

from omnigent.repl.table import clip, display_width, format_table


def test_display_width_counts_terminal_columns():
    assert display_width("abc") == 3
    assert display_width("日本語") == 6
    assert display_width("cafe\u0301") == 4  # a combining accent takes no column
    assert display_width("😀") == 2
    assert display_width("👍🏽") == 2  # a skin tone modifies the glyph before it
    assert display_width("a\u200db") == 2
    assert display_width("") == 0


def test_columns_align_with_wide_and_combining_characters():
    lines = format_table(("#", "Title", "ID"), [("1", "日本語のタイトル", "conv_1"), ("2", "cafe\u0301 ☕", "conv_2"),
                                                ("3", "plain", "conv_3")])
    starts = {display_width(line[:line.index("conv_")]) for line in lines[1:]}
    assert len(starts) == 1  # every id starts in the same column
    assert lines[0].split() == ["#", "Title", "ID"]
    assert all(line == line.rstrip() for line in lines)


def test_the_last_column_is_cut_to_max_width_and_never_splits_a_wide_character():
    lines = format_table(("a", "b"), [("x", "日本語のタイトル")], max_width=10)
    assert lines == ["a  b", "x  日本語…"]
    assert all(display_width(line) <= 10 for line in lines)
    assert clip("日本語", 4) == "日…"
    assert clip("short", 10) == "short"
    assert format_table((), []) == []
