"""Plain-text helpers: word splitting, wrapping, justification, truncation, columns."""

from wraptext.wrap import center, columns, count_lines, fill, indent, justify, truncate, words, wrap

__all__ = ["center", "columns", "count_lines", "fill", "indent", "justify", "truncate", "words", "wrap"]
