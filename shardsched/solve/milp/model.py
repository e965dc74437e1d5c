"""The MILP's containers: columns and rows accumulated in Python and handed to HiGHS once,
the sum of two linear expressions, and the units every row is written in."""
from __future__ import annotations

import math

import highspy
import numpy as np

from shardsched.core.types import Strategy

FS, SGO, REP = Strategy.FULL_SHARD, Strategy.SHARD_GRAD_OP, Strategy.REPLICATE
FSN, HS, HSGO = Strategy.FULL_SHARD_NODE, Strategy.HYBRID_SHARD, Strategy.HYBRID_SHARD_GRAD_OP
GiB = float(1 << 30)


class _Model:
    """Columns and rows accumulated in Python, passed to HiGHS once (rowwise)."""

    def __init__(self):
        self.lb, self.ub, self.integer, self.cost, self.rows = [], [], [], [], []
        self.offset = 0.0
        """The objective's constant term."""

    def var(self, lb=0.0, ub=1.0, *, integer=False) -> int:
        self.lb.append(lb)
        self.ub.append(ub)
        self.integer.append(integer)
        self.cost.append(0.0)
        return len(self.lb) - 1

    def row(self, terms: dict[int, float], lo=-math.inf, hi=math.inf) -> None:
        self.rows.append(({k: v for k, v in terms.items() if v != 0.0}, lo, hi))

    def ge(self, lhs: dict, rhs: dict, const: float = 0.0) -> None:
        """sum(lhs) >= sum(rhs) + const."""
        self.row(_add(lhs, rhs, -1.0), lo=const)

    def lp(self) -> highspy.HighsLp:
        lp = highspy.HighsLp()
        lp.num_col_, lp.num_row_ = len(self.lb), len(self.rows)
        lp.col_cost_ = np.array(self.cost)
        lp.offset_ = self.offset
        lp.col_lower_, lp.col_upper_ = np.array(self.lb), np.array(self.ub)
        lp.row_lower_ = np.array([lo for _, lo, _ in self.rows], dtype=float)
        lp.row_upper_ = np.array([hi for _, _, hi in self.rows], dtype=float)
        starts, index, value = [0], [], []
        for terms, _, _ in self.rows:
            index += list(terms)
            value += list(terms.values())
            starts.append(len(index))
        lp.a_matrix_.format_ = highspy.MatrixFormat.kRowwise
        lp.a_matrix_.start_ = np.array(starts, dtype=np.int32)
        lp.a_matrix_.index_ = np.array(index, dtype=np.int32)
        lp.a_matrix_.value_ = np.array(value, dtype=float)
        lp.a_matrix_.num_col_, lp.a_matrix_.num_row_ = lp.num_col_, lp.num_row_
        lp.integrality_ = [highspy.HighsVarType.kInteger if i else highspy.HighsVarType.kContinuous
                           for i in self.integer]
        return lp


def _add(a: dict, b: dict, sign: float = 1.0) -> dict:
    out = dict(a)
    for k, v in b.items():
        out[k] = out.get(k, 0.0) + sign * v
    return out

