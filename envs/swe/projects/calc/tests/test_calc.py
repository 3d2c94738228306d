import math

import pytest

from calc import CalcError, Token, evaluate, tokenize


def test_tokenize_numbers_and_ops():
    """Tokenizing '12 + 3.5' gives an int, an operator, a float and an end marker with positions."""
    assert tokenize("12 + 3.5") == [
        Token("num", 12, 0),
        Token("op", "+", 3),
        Token("num", 3.5, 5),
        Token("end", None, 8),
    ]


def test_tokenize_names_and_power():
    """Names may contain digits and underscores, and '**' is read as the power operator '^'."""
    tokens = tokenize("x_1**2")
    assert [(t.kind, t.value) for t in tokens] == [("name", "x_1"), ("op", "^"), ("num", 2), ("end", None)]
    assert tokens[1].pos == 3


def test_tokenize_errors():
    """Unknown characters, two decimal points and a lonely '.' are lexing errors."""
    for bad in ("2 $ 3", "1.2.3", ". + 1"):
        with pytest.raises(ValueError):
            tokenize(bad)


def test_precedence():
    """Multiplication binds tighter than addition, and parentheses override it."""
    assert evaluate("2 + 3 * 4") == 14
    assert evaluate("(2 + 3) * 4") == 20
    assert evaluate("10 - 4 - 3") == 3
    assert evaluate("2 * 3 + 4 * 5") == 26


def test_division_and_modulo():
    """Division is true division; modulo works on integers; both are left associative."""
    assert evaluate("7 / 2") == 3.5
    assert evaluate("17 % 5") == 2
    assert evaluate("100 / 10 / 5") == 2
    assert evaluate("20 % 7 % 4") == 2


def test_division_by_zero():
    """Dividing or taking modulo by zero raises CalcError."""
    with pytest.raises(CalcError):
        evaluate("1 / 0")
    with pytest.raises(CalcError):
        evaluate("1 % (2 - 2)")


def test_power_is_right_associative():
    """2 ^ 3 ^ 2 is 2 ^ 9 = 512, and power binds tighter than multiplication."""
    assert evaluate("2 ^ 3 ^ 2") == 512
    assert evaluate("2 ** 3") == 8
    assert evaluate("3 * 2 ^ 2") == 12


def test_unary_minus():
    """Unary minus applies to the power: -2 ^ 2 is -4; double minus cancels."""
    assert evaluate("-2 ^ 2") == -4
    assert evaluate("--5") == 5
    assert evaluate("3 - -2") == 5
    assert evaluate("2 ^ -1") == 0.5


def test_variables_and_assignment():
    """An assignment stores the value in the environment and returns it."""
    env = {}
    assert evaluate("x = 4 * 2", env) == 8
    assert env == {"x": 8}
    assert evaluate("x + 1", env) == 9
    assert evaluate("y = x", env) == 8
    assert env["y"] == 8


def test_constants_and_shadowing():
    """pi and e are built in, and a variable of the same name shadows them."""
    assert evaluate("pi") == math.pi
    assert evaluate("e") == math.e
    assert evaluate("pi", {"pi": 3}) == 3


def test_unknown_name():
    """Using an undefined variable raises CalcError."""
    with pytest.raises(CalcError):
        evaluate("nope + 1")


def test_functions():
    """Built-in functions abs, min, max, sqrt, clamp and round take their arguments in order."""
    assert evaluate("abs(-3)") == 3
    assert evaluate("min(4, 2, 8)") == 2
    assert evaluate("max(4, 2, 8)") == 8
    assert evaluate("sqrt(16)") == 4.0
    assert evaluate("clamp(15, 0, 10)") == 10
    assert evaluate("clamp(-5, 0, 10)") == 0
    assert evaluate("clamp(5, 0, 10)") == 5
    assert evaluate("round(2.567, 2)") == 2.57


def test_function_arity():
    """Calling a function with too few or too many arguments raises CalcError."""
    with pytest.raises(CalcError):
        evaluate("abs(1, 2)")
    with pytest.raises(CalcError):
        evaluate("clamp(1, 2)")
    with pytest.raises(CalcError):
        evaluate("min()")
    assert evaluate("max(1, 2, 3, 4, 5, 6, 7, 8)") == 8
    with pytest.raises(CalcError):
        evaluate("max(1, 2, 3, 4, 5, 6, 7, 8, 9)")


def test_unknown_function():
    """Calling an unknown function raises CalcError."""
    with pytest.raises(CalcError):
        evaluate("foo(1)")


def test_syntax_errors():
    """Empty input, a missing parenthesis and trailing input are errors."""
    for bad in ("", "   ", "(1 + 2", "1 + 2)", "1 2", "* 3"):
        with pytest.raises(CalcError):
            evaluate(bad)


def test_nested_calls_and_parens():
    """Function calls nest and mix with arithmetic."""
    assert evaluate("max(1, min(5, 3) * 2) + abs(-(2 - 7))") == 11
    assert evaluate("((((3))))") == 3
