"""A tiny arithmetic expression evaluator: lexer, recursive-descent parser, evaluator."""

from calc.evaluator import CalcError, evaluate
from calc.lexer import Token, tokenize

__all__ = ["CalcError", "Token", "evaluate", "tokenize"]
