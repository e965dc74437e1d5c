"""Solvers that make a Plan: uniform specs (`build`), grouping candidates, the
schedule MILP, the greedy warm start, brute force (tests) and `--strategy auto`."""
