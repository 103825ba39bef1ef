"""Exports of a replay: Chrome-trace/Perfetto timeline and the annotated trace set."""

from replay.export.annotate import write_annotated
from replay.export.timeline import timeline_events, write_timeline

__all__ = ["timeline_events", "write_annotated", "write_timeline"]
