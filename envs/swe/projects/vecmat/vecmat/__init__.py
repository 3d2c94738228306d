"""Small dense vectors and matrices as lists of floats: products, determinants, linear solves."""

from vecmat.linalg import Matrix, SingularMatrixError, solve
from vecmat.vector import add, cross, dot, lerp, norm, normalize, scale, sub

__all__ = ["Matrix", "SingularMatrixError", "add", "cross", "dot", "lerp", "norm", "normalize", "scale", "solve", "sub"]
