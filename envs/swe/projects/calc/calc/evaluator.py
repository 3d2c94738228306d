"""Parse tokens by recursive descent and evaluate them with variables and a few functions.

Grammar (lowest to highest precedence):
    statement := NAME '=' expr | expr
    expr      := term (('+' | '-') term)*
    term      := unary (('*' | '/' | '%') unary)*
    unary     := '-' unary | power
    power     := atom ('^' unary)?          (right associative)
    atom      := NUM | NAME | NAME '(' args ')' | '(' expr ')'
"""

import math

from calc.lexer import LexError, tokenize


class CalcError(ValueError):
    pass


def _clamp(x, lo, hi):
    return max(lo, min(x, hi))


FUNCTIONS = {
    "abs": (abs, 1, 1),
    "min": (min, 1, 8),
    "max": (max, 1, 8),
    "sqrt": (math.sqrt, 1, 1),
    "clamp": (_clamp, 3, 3),
    "round": (round, 1, 2),
}

CONSTANTS = {"pi": math.pi, "e": math.e}


class _Parser:
    def __init__(self, tokens, env):
        self.tokens = tokens
        self.pos = 0
        self.env = env

    def peek(self):
        return self.tokens[self.pos]

    def take(self):
        token = self.tokens[self.pos]
        self.pos += 1
        return token

    def expect(self, value):
        token = self.take()
        if token.value != value:
            raise CalcError(f"expected {value!r} at {token.pos}, got {token.value!r}")
        return token

    def statement(self):
        first, second = self.tokens[0], self.tokens[1]
        if first.kind == "name" and second.value == "=":
            self.pos = 2
            value = self.expr()
            self.env[first.value] = value
            return value
        return self.expr()

    def expr(self):
        value = self.term()
        while self.peek().value in ("+", "-"):
            op = self.take().value
            rhs = self.term()
            value = value + rhs if op == "+" else value - rhs
        return value

    def term(self):
        value = self.unary()
        while self.peek().value in ("*", "/", "%"):
            op = self.take().value
            rhs = self.unary()
            if op == "*":
                value = value * rhs
            elif rhs == 0:
                raise CalcError("division by zero")
            elif op == "/":
                value = value / rhs
            else:
                value = value % rhs
        return value

    def unary(self):
        if self.peek().value == "-":
            self.take()
            return -self.unary()
        return self.power()

    def power(self):
        base = self.atom()
        if self.peek().value == "^":
            self.take()
            exponent = self.unary()
            return base**exponent
        return base

    def atom(self):
        token = self.take()
        if token.kind == "num":
            return token.value
        if token.value == "(":
            value = self.expr()
            self.expect(")")
            return value
        if token.kind == "name":
            if self.peek().value == "(":
                return self.call(token)
            return self.lookup(token)
        raise CalcError(f"unexpected {token.value!r} at {token.pos}")

    def lookup(self, token):
        if token.value in self.env:
            return self.env[token.value]
        if token.value in CONSTANTS:
            return CONSTANTS[token.value]
        raise CalcError(f"unknown name {token.value!r}")

    def call(self, token):
        if token.value not in FUNCTIONS:
            raise CalcError(f"unknown function {token.value!r}")
        fn, min_args, max_args = FUNCTIONS[token.value]
        self.expect("(")
        args = []
        if self.peek().value != ")":
            args.append(self.expr())
            while self.peek().value == ",":
                self.take()
                args.append(self.expr())
        self.expect(")")
        if not min_args <= len(args) <= max_args:
            raise CalcError(f"{token.value} takes {min_args}-{max_args} arguments, got {len(args)}")
        return fn(*args)


def evaluate(text, env=None):
    """Evaluate one statement; assignments store into `env` and return the value."""
    env = {} if env is None else env
    try:
        tokens = tokenize(text)
    except LexError as exc:
        raise CalcError(str(exc)) from exc
    if len(tokens) == 1:
        raise CalcError("empty expression")
    parser = _Parser(tokens, env)
    value = parser.statement()
    if parser.peek().kind != "end":
        raise CalcError(f"trailing input at {parser.peek().pos}")
    return value
