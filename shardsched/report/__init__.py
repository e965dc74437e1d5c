"""Pictures of runs and plans (matplotlib, Agg backend: no display needed)."""
