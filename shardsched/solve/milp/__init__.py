"""The schedule MILP for one grouping: strategies and AllGather launch points.

One concern a module:
  model       the containers (columns and rows, handed to HiGHS once) and the units rows are in;
  costs       the per-unit constants of a Problem (`costs_of`);
  decisions   the binary decisions, their columns and launch windows, and `_Build`, which writes
              the rows through its mixins:
  times       the time rows (the replay's recurrence, deadlines, big-M);
  memory      the memory rows (every moment of `sim.memory.step_memory`);
  objective   the step minimised, and `lower_bound` on it with no solve;
  highs       the HiGHS driver (`solve`, `relaxation_bound`).
For fixed binaries the MILP's objective is the replay's step time (tests/solve/test_milp_vs_brute.py
and test_levers_vs_brute.py check objective == replay == brute force).
"""
from shardsched.solve.milp.costs import Costs, Selective, costs_of
from shardsched.solve.milp.decisions import _Build, windows
from shardsched.solve.milp.highs import NODES, MilpResult, _new_highs, relaxation_bound, solve
from shardsched.solve.milp.memory import MEMORY_MARGIN_GIB
from shardsched.solve.milp.model import FS, FSN, HS, HSGO, REP, SGO, GiB
from shardsched.solve.milp.objective import lower_bound

__all__ = ["Costs", "FS", "FSN", "GiB", "HS", "HSGO", "MEMORY_MARGIN_GIB", "MilpResult", "NODES", "REP", "SGO",
           "Selective", "costs_of", "lower_bound", "relaxation_bound", "solve", "windows"]
