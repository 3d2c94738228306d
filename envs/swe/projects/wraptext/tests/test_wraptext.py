import pytest

from wraptext import center, columns, count_lines, fill, indent, justify, truncate, words, wrap

TEXT = "the quick brown fox jumps over the lazy dog"


def test_words_split_on_whitespace():
    """words() splits on runs of spaces, tabs and newlines and drops empty words."""
    assert words("  a\tbb \n ccc  ") == ["a", "bb", "ccc"]
    assert words("") == []
    assert words("one") == ["one"]


def test_wrap_greedy():
    """Wrapping at width 10 packs as many words per line as fit."""
    assert wrap(TEXT, 10) == ["the quick", "brown fox", "jumps over", "the lazy", "dog"]


def test_wrap_exact_fit():
    """A line that exactly fills the width is allowed."""
    assert wrap("aaa bbb ccc", 7) == ["aaa bbb", "ccc"]
    assert wrap("aaa bbb", 7) == ["aaa bbb"]


def test_wrap_breaks_long_words():
    """Words longer than the width are cut into width-sized pieces unless told not to."""
    assert wrap("abcdefghij xy", 4) == ["abcd", "efgh", "ij", "xy"]
    assert wrap("abcdefghij xy", 4, break_long_words=False) == ["abcdefghij", "xy"]


def test_wrap_rejects_bad_width():
    """A width below 1 raises ValueError."""
    with pytest.raises(ValueError):
        wrap("a", 0)
    assert wrap("a b", 1) == ["a", "b"]


def test_wrap_blank_text():
    """Blank text wraps to no lines."""
    assert wrap("   ", 5) == []
    assert count_lines("   ", 5) == 0
    assert count_lines(TEXT, 10) == 5


def test_justify_distributes_spaces_left_first():
    """Justifying pads gaps evenly and gives the leftover spaces to the leftmost gaps."""
    assert justify("a b c", 9) == "a   b   c"
    assert justify("a b c", 8) == "a   b  c"
    assert justify("ab cd", 5) == "ab cd"


def test_justify_single_word_and_overflow():
    """A single word is left aligned; a line too long for the width raises ValueError."""
    assert justify("word", 7) == "word   "
    with pytest.raises(ValueError):
        justify("aaaa bbbb", 8)


def test_fill_plain_and_justified():
    """fill joins wrapped lines; justified fill leaves the last line ragged."""
    assert fill(TEXT, 10) == "the quick\nbrown fox\njumps over\nthe lazy\ndog"
    assert fill("aa b cc dd", 6, justified=True) == "aa   b\ncc dd"


def test_center():
    """Centering puts the odd extra padding on the right and never cuts text."""
    assert center("ab", 6) == "  ab  "
    assert center("ab", 5) == " ab  "
    assert center("ab", 7, "*") == "**ab***"
    assert center("abcdef", 3) == "abcdef"
    assert center("abc", 3) == "abc"


def test_truncate_short_text_unchanged():
    """Text that fits is returned unchanged, including exactly max_chars long."""
    assert truncate("hello", 5) == "hello"
    assert truncate("hi", 10) == "hi"


def test_truncate_at_word_boundary():
    """Truncation prefers to cut at a space in the second half of the kept text."""
    assert truncate("hello wonderful world", 20) == "hello wonderful..."
    assert truncate("hello wonderful world", 15) == "hello wonder..."
    assert truncate("one two three four", 14) == "one two..."


def test_truncate_mid_word():
    """Without a late enough space the text is cut mid-word."""
    assert truncate("abcdefghijklmnop", 10) == "abcdefg..."
    assert truncate("ab cdefghijklmnop", 10) == "ab cdef..."
    assert truncate("abcdefghij", 6, ellipsis="~") == "abcde~"


def test_truncate_rejects_tiny_limit():
    """A limit shorter than the ellipsis raises ValueError."""
    with pytest.raises(ValueError):
        truncate("abcdef", 2)
    assert truncate("abcdef", 3) == "..."


def test_indent():
    """indent prefixes non-blank lines and can use a separate first-line prefix."""
    assert indent("a\n\nb", "> ") == "> a\n\n> b"
    assert indent("a\nb", "  ", first_prefix="- ") == "- a\n  b"
    assert indent("a\nb", "  ", first_prefix="") == "a\n  b"


def test_columns_layout():
    """Items are laid out column-major, columns padded to their widest item."""
    items = ["a", "bbb", "cc", "d", "eeee", "f", "g"]
    assert columns(items, 3) == [
        "a    d     g",
        "bbb  eeee",
        "cc   f",
    ]
    assert columns(items, 3, gap=1) == ["a   d    g", "bbb eeee", "cc  f"]


def test_columns_edges():
    """One column stacks items; an empty list gives no rows; zero columns is an error."""
    assert columns(["x", "y"], 1) == ["x", "y"]
    assert columns([], 2) == []
    assert columns(["x", "y", "z"], 5) == ["x  y  z"]
    with pytest.raises(ValueError):
        columns(["x"], 0)
