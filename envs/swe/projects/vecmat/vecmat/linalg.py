"""A row-major matrix type and Gaussian elimination with partial pivoting."""


class SingularMatrixError(ValueError):
    pass


EPS = 1e-12


class Matrix:
    def __init__(self, rows):
        rows = [list(map(float, r)) for r in rows]
        if not rows or not rows[0]:
            raise ValueError("a matrix needs at least one row and one column")
        width = len(rows[0])
        if any(len(r) != width for r in rows):
            raise ValueError("all rows must have the same length")
        self.rows = rows

    @classmethod
    def identity(cls, n):
        return cls([[1.0 if i == j else 0.0 for j in range(n)] for i in range(n)])

    @classmethod
    def zeros(cls, num_rows, num_cols):
        return cls([[0.0] * num_cols for _ in range(num_rows)])

    @property
    def shape(self):
        return len(self.rows), len(self.rows[0])

    def __eq__(self, other):
        return isinstance(other, Matrix) and self.rows == other.rows

    def __repr__(self):
        return f"Matrix({self.rows})"

    def __getitem__(self, index):
        i, j = index
        return self.rows[i][j]

    def transpose(self):
        num_rows, num_cols = self.shape
        return Matrix([[self.rows[i][j] for i in range(num_rows)] for j in range(num_cols)])

    def __add__(self, other):
        if self.shape != other.shape:
            raise ValueError(f"shape mismatch: {self.shape} vs {other.shape}")
        return Matrix([[x + y for x, y in zip(r, s)] for r, s in zip(self.rows, other.rows)])

    def __matmul__(self, other):
        n, k = self.shape
        k2, m = other.shape
        if k != k2:
            raise ValueError(f"cannot multiply {self.shape} by {other.shape}")
        out = [[0.0] * m for _ in range(n)]
        for i in range(n):
            for j in range(m):
                out[i][j] = sum(self.rows[i][t] * other.rows[t][j] for t in range(k))
        return Matrix(out)

    def apply(self, vector):
        if len(vector) != self.shape[1]:
            raise ValueError(f"vector of length {len(vector)} for a matrix of shape {self.shape}")
        return [sum(a * b for a, b in zip(row, vector)) for row in self.rows]

    def trace(self):
        n, m = self.shape
        if n != m:
            raise ValueError("trace needs a square matrix")
        return sum(self.rows[i][i] for i in range(n))

    def determinant(self):
        n, m = self.shape
        if n != m:
            raise ValueError("determinant needs a square matrix")
        a = [row[:] for row in self.rows]
        det = 1.0
        for col in range(n):
            pivot = max(range(col, n), key=lambda r: abs(a[r][col]))
            if abs(a[pivot][col]) < EPS:
                return 0.0
            if pivot != col:
                a[col], a[pivot] = a[pivot], a[col]
                det = -det
            det *= a[col][col]
            for r in range(col + 1, n):
                factor = a[r][col] / a[col][col]
                for c in range(col, n):
                    a[r][c] -= factor * a[col][c]
        return det

    def power(self, exponent):
        if exponent < 0:
            raise ValueError(f"exponent must be >= 0, got {exponent}")
        result = Matrix.identity(self.shape[0])
        base = self
        while exponent > 0:
            if exponent % 2 == 1:
                result = result @ base
            base = base @ base
            exponent //= 2
        return result


def solve(matrix, rhs):
    """Solve matrix @ x = rhs for square, non-singular `matrix`."""
    n, m = matrix.shape
    if n != m or len(rhs) != n:
        raise ValueError(f"need a square matrix and a matching rhs, got {matrix.shape} and {len(rhs)}")
    a = [row[:] + [float(b)] for row, b in zip(matrix.rows, rhs)]
    for col in range(n):
        pivot = max(range(col, n), key=lambda r: abs(a[r][col]))
        if abs(a[pivot][col]) < EPS:
            raise SingularMatrixError("matrix is singular")
        a[col], a[pivot] = a[pivot], a[col]
        for r in range(col + 1, n):
            factor = a[r][col] / a[col][col]
            for c in range(col, n + 1):
                a[r][c] -= factor * a[col][c]
    x = [0.0] * n
    for i in range(n - 1, -1, -1):
        tail = sum(a[i][j] * x[j] for j in range(i + 1, n))
        x[i] = (a[i][n] - tail) / a[i][i]
    return x
