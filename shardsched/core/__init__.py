"""The bottom layer: the shared vocabulary (Strategy, Plan, Predicted, ...) that
every other package speaks. It imports nothing of shardsched but `_json`."""
