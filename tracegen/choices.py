"""Names a deployment spec chooses from: precision, attention, compute model, framework, GEMM rates, reshard.

Plain tuples in a module that imports nothing, so that reading a deployment.json (`xsim replay`) need not
load the op cost model (tracegen.ops) or the reshard strategies (tracegen.planner.reshard) to check them.
"""

from __future__ import annotations

PRECISIONS = ("bf16", "fp16", "fp8")
ATTENTIONS = ("flash", "unfused")
COMPUTE_MODELS = ("roofline", "calibrated")
# tracegen.frameworks.FRAMEWORK_NAMES (a test keeps them equal); the first is the default.
FRAMEWORKS = ("megatron-core", "megatron-2021", "megatron-deepspeed")
# tracegen.gemm.GEMM_RATES; the first is the default.
GEMM_RATES = ("sustained", "burst")
# The keys of tracegen.planner.reshard.STRATEGIES, in its order (a test keeps them equal).
RESHARD_STRATEGIES = ("xsim", "hetauto", "alpacomm", "naive")
