"""The planning layer: model presets, GPU catalog, deployment specs and the per-rank workload generator."""

from tracegen.bundle import TraceBundle
from tracegen.spec import load_spec
from tracegen.workload import generate

__all__ = ["TraceBundle", "generate", "load_spec"]
