"""Plans the engine has run: every plan executes once under FSDP2 before it is returned.

The planner predicts a plan's peak from a model of what FSDP2 allocates (`sim.memory`, the
MILP rows, greedy's evaluator). A prediction is not a promise: hand-written modules (fused
RNN kernels, `nn.TransformerEncoderLayer`'s fast paths, scatter) hold tensors no hand-derived
moment foresaw. So the plan is run: the same `runtime.parallelize` a training run uses, on
fake tensors (`FakeTensorMode`: shapes and dtypes, no storage, so a 70B model at world 512
verifies on a laptop) over PyTorch's fake process group at the plan's world, one whole step
(its micro-batches, backward, the optimizer step) counted by `FSDPMemTracker`, as
torchtitan's memory estimator does (torchtitan/scripts/estimate/estimation.py).

  `fake`     fake copies of a model and its inputs, or the model built under fake tensors
  `engine`   one plan run once on a fake process group: `verify_plan` -> `core.types.Verified`
  `loop`     the closed loop: a plan whose verified peak is over its budget is planned again
"""
