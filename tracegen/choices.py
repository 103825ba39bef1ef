"""Names a deployment spec chooses from: precision, attention, compute model and reshard strategy.

Plain tuples in a module that imports nothing, so that reading a deployment.json (`xsim replay`) need not
load the op cost model (tracegen.ops) or the reshard strategies (tracegen.planner.reshard) to check them.
"""

from __future__ import annotations

PRECISIONS = ("bf16", "fp16", "fp8")
ATTENTIONS = ("flash", "unfused")
COMPUTE_MODELS = ("roofline", "calibrated")
# The keys of tracegen.planner.reshard.STRATEGIES, in its order (a test keeps them equal).
RESHARD_STRATEGIES = ("xsim", "hetauto", "alpacomm", "naive")
