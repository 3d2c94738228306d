import math

import pytest

from vecmat import Matrix, SingularMatrixError, add, cross, dot, lerp, norm, normalize, scale, solve, sub
from vecmat.vector import angle


def close(a, b, tol=1e-9):
    return all(abs(x - y) <= tol for x, y in zip(a, b)) and len(a) == len(b)


def test_add_sub_scale():
    """Element-wise add and sub, and scaling by a number."""
    assert add([1, 2, 3], [10, 20, 30]) == [11, 22, 33]
    assert sub([10, 20], [1, 2]) == [9, 18]
    assert scale([1, -2], 3) == [3, -6]


def test_length_mismatch():
    """Vectors of different lengths raise ValueError."""
    for fn in (add, sub, dot):
        with pytest.raises(ValueError):
            fn([1, 2], [1, 2, 3])


def test_dot_and_cross():
    """Dot product sums products; cross of x and y is z and is anti-commutative."""
    assert dot([1, 2, 3], [4, 5, 6]) == 32
    assert cross([1, 0, 0], [0, 1, 0]) == [0, 0, 1]
    assert cross([0, 1, 0], [1, 0, 0]) == [0, 0, -1]
    assert cross([2, 3, 4], [5, 6, 7]) == [-3, 6, -3]
    with pytest.raises(ValueError):
        cross([1, 2], [3, 4])


def test_norms():
    """The 1-, 2- and infinity-norms of [3, -4] are 7, 5 and 4; p below 1 is an error."""
    assert norm([3, -4]) == 5
    assert norm([3, -4], p=1) == 7
    assert norm([3, -4], p=math.inf) == 4
    assert norm([], p=math.inf) == 0
    with pytest.raises(ValueError):
        norm([1], p=0.5)


def test_normalize():
    """Normalizing gives a unit vector in the same direction; the zero vector fails."""
    assert close(normalize([3, 4]), [0.6, 0.8])
    with pytest.raises(ValueError):
        normalize([0, 0])


def test_lerp_and_angle():
    """lerp interpolates linearly; the angle between x and y axes is pi/2."""
    assert lerp([0, 10], [10, 20], 0.25) == [2.5, 12.5]
    assert lerp([1, 1], [3, 5], 0) == [1, 1]
    assert lerp([1, 1], [3, 5], 1) == [3, 5]
    assert math.isclose(angle([1, 0], [0, 2]), math.pi / 2)
    assert math.isclose(angle([1, 1], [2, 2]), 0.0, abs_tol=1e-7)


def test_matrix_construction():
    """Matrices need equal-length, non-empty rows; identity and zeros have the right shape."""
    with pytest.raises(ValueError):
        Matrix([[1, 2], [3]])
    with pytest.raises(ValueError):
        Matrix([])
    assert Matrix.identity(2) == Matrix([[1, 0], [0, 1]])
    assert Matrix.zeros(2, 3).shape == (2, 3)
    assert Matrix([[1, 2, 3]])[0, 2] == 3.0


def test_transpose_and_add():
    """Transposing swaps rows and columns; matrices of equal shape add element-wise."""
    m = Matrix([[1, 2, 3], [4, 5, 6]])
    assert m.transpose() == Matrix([[1, 4], [2, 5], [3, 6]])
    assert m + m == Matrix([[2, 4, 6], [8, 10, 12]])
    with pytest.raises(ValueError):
        m + m.transpose()


def test_matmul():
    """Matrix products follow row-by-column and check inner dimensions."""
    a = Matrix([[1, 2], [3, 4], [5, 6]])
    b = Matrix([[7, 8, 9], [10, 11, 12]])
    assert a @ b == Matrix([[27, 30, 33], [61, 68, 75], [95, 106, 117]])
    assert (b @ a).shape == (2, 2)
    with pytest.raises(ValueError):
        a @ a


def test_apply_and_trace():
    """Applying a matrix to a vector and the trace of a square matrix."""
    m = Matrix([[1, 2], [3, 4]])
    assert m.apply([1, 1]) == [3, 7]
    assert m.trace() == 5
    with pytest.raises(ValueError):
        m.apply([1, 2, 3])
    with pytest.raises(ValueError):
        Matrix([[1, 2]]).trace()


def test_determinant():
    """Determinants of 1x1, 2x2 and 3x3 matrices, including a row swap and a singular one."""
    assert Matrix([[7]]).determinant() == 7
    assert math.isclose(Matrix([[1, 2], [3, 4]]).determinant(), -2)
    assert math.isclose(Matrix([[0, 1], [1, 0]]).determinant(), -1)
    assert math.isclose(Matrix([[2, 0, 1], [1, 3, 2], [1, 1, 2]]).determinant(), 6)
    assert Matrix([[1, 2], [2, 4]]).determinant() == 0.0
    with pytest.raises(ValueError):
        Matrix([[1, 2]]).determinant()


def test_power():
    """Matrix powers by repeated squaring: Fibonacci numbers from [[1, 1], [1, 0]]."""
    fib = Matrix([[1, 1], [1, 0]])
    assert fib.power(0) == Matrix.identity(2)
    assert fib.power(1) == fib
    assert fib.power(10) == Matrix([[89, 55], [55, 34]])
    assert fib.power(7) == Matrix([[21, 13], [13, 8]])
    with pytest.raises(ValueError):
        fib.power(-1)


def test_solve():
    """solve finds x with A x = b, also when the first pivot is zero."""
    assert close(solve(Matrix([[2, 1], [1, 3]]), [3, 5]), [0.8, 1.4])
    assert close(solve(Matrix([[0, 1], [1, 0]]), [2, 3]), [3, 2])
    a = Matrix([[3, 2, -1], [2, -2, 4], [-1, 0.5, -1]])
    assert close(solve(a, [1, -2, 0]), [1, -2, -2])


def test_solve_errors():
    """A singular matrix raises SingularMatrixError; mismatched shapes raise ValueError."""
    with pytest.raises(SingularMatrixError):
        solve(Matrix([[1, 2], [2, 4]]), [1, 2])
    with pytest.raises(ValueError):
        solve(Matrix([[1, 2, 3], [4, 5, 6]]), [1, 2])
    with pytest.raises(ValueError):
        solve(Matrix([[1, 0], [0, 1]]), [1, 2, 3])
