"""Distributed least squares with a different local optimum per worker.

Worker i holds f_i(x) = 1/(2m) ||A_i x - b_i||^2; the team minimises
f(x) = (1/n) sum_i f_i(x), whose optimum is known in closed form:
x* = (sum_i A_i^T A_i)^-1 sum_i A_i^T b_i. The parameters are cut into
`pieces` tensors, so Crossover's segments have something to cut along.

`DiagonalLeastSquares` is the same with diagonal A_i = diag(h) (shared) and
optimum c_i per worker: x* = mean_i c_i; its gradient costs O(P) per worker,
which the large simulations need.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch


def _pieces(dim: int, pieces: int) -> tuple[int, ...]:
    base, extra = divmod(dim, pieces)
    return tuple(base + (k < extra) for k in range(pieces))


@dataclass(frozen=True, kw_only=True)
class LeastSquares:
    a: torch.Tensor
    """(n, m, d) design matrices, float64."""
    b: torch.Tensor
    """(n, m) targets; b_i = A_i x_i* + noise, x_i* differing per worker."""
    pieces: tuple[int, ...]
    """Sizes of the parameter tensors the d coordinates are cut into."""
    separable: ClassVar[bool] = False
    """Coordinates are coupled through A_i: the simulator runs step by step."""

    @classmethod
    def make(cls, *, workers: int, dim: int, rows: int, pieces: int = 4, seed: int = 0, spread: float = 1.0,
             dtype: torch.dtype = torch.float64) -> "LeastSquares":
        """Local optima x_i* = common + spread * noise_i: `spread` sets how much workers disagree."""
        g = torch.Generator().manual_seed(seed)
        a = torch.randn(workers, rows, dim, generator=g, dtype=torch.float64) / dim ** 0.5
        local_opt = torch.randn(dim, generator=g, dtype=torch.float64) + spread * torch.randn(
            workers, dim, generator=g, dtype=torch.float64)
        b = torch.einsum("nmd,nd->nm", a, local_opt) + 0.1 * torch.randn(workers, rows, generator=g,
                                                                         dtype=torch.float64)
        return cls(a=a.to(dtype), b=b.to(dtype), pieces=_pieces(dim, pieces))

    @property
    def workers(self) -> int:
        return self.a.shape[0]

    @property
    def dim(self) -> int:
        return self.a.shape[2]

    def grad(self, z: torch.Tensor) -> torch.Tensor:
        """(n, d) gradients of every worker's f_i at its own row of z."""
        resid = torch.einsum("nmd,nd->nm", self.a, z) - self.b
        return torch.einsum("nmd,nm->nd", self.a, resid) / self.a.shape[1]

    def optimum(self) -> torch.Tensor:
        h = torch.einsum("nmd,nme->de", self.a, self.a)
        r = torch.einsum("nmd,nm->d", self.a, self.b)
        return torch.linalg.solve(h, r)

    def initial(self) -> torch.Tensor:
        return torch.zeros(self.dim, dtype=self.a.dtype)


@dataclass(frozen=True, kw_only=True)
class DiagonalLeastSquares:
    h: torch.Tensor
    """(d,) curvature shared by all workers, in [0.5, 1.5]."""
    c: torch.Tensor
    """(n, d) each worker's own optimum."""
    pieces: tuple[int, ...]
    separable: ClassVar[bool] = True
    """The gradient of coordinate j depends on coordinate j only: the blocked simulator applies."""

    @classmethod
    def make(cls, *, workers: int, dim: int, pieces: int = 4, seed: int = 0,
             dtype: torch.dtype = torch.float32) -> "DiagonalLeastSquares":
        g = torch.Generator().manual_seed(seed)
        h = 0.5 + torch.rand(dim, generator=g, dtype=dtype)
        c = torch.randn(workers, dim, generator=g, dtype=dtype)
        return cls(h=h, c=c, pieces=_pieces(dim, pieces))

    @classmethod
    def empty(cls, *, workers: int, dim: int, pieces: int = 4,
              dtype: torch.dtype = torch.float32) -> "DiagonalLeastSquares":
        """make()'s shapes and dtype without its data (torch.empty touches no memory): for the work
        that needs only the shapes, done while make() runs (commands/gossip.py)."""
        return cls(h=torch.empty(dim, dtype=dtype), c=torch.empty(workers, dim, dtype=dtype),
                   pieces=_pieces(dim, pieces))

    @property
    def workers(self) -> int:
        return self.c.shape[0]

    @property
    def dim(self) -> int:
        return self.c.shape[1]

    def grad(self, z: torch.Tensor) -> torch.Tensor:
        return (z - self.c).mul_(self.h)

    def optimum(self) -> torch.Tensor:
        return self.c.mean(dim=0)

    def initial(self) -> torch.Tensor:
        return torch.zeros(self.dim, dtype=self.c.dtype)


class PiecewiseLinear(torch.nn.Module):
    """The least-squares model for real workers: x cut into `pieces` parameter tensors."""

    def __init__(self, pieces: tuple[int, ...], init: torch.Tensor):
        super().__init__()
        self.parts = torch.nn.ParameterList(torch.nn.Parameter(t.clone()) for t in init.split(list(pieces)))

    def forward(self, a: torch.Tensor) -> torch.Tensor:
        return a @ torch.cat(list(self.parts))


def local_loss(model: PiecewiseLinear, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """f_i = 1/(2m) ||A_i x - b_i||^2, whose gradient is A_i^T (A_i x - b_i) / m."""
    return 0.5 * ((model(a) - b) ** 2).mean()
