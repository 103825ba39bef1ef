"""Exports of a replay: result folder, Chrome-trace timeline, annotated trace set, HTML report."""

from xsim.replay.export.annotate import write_annotated
from xsim.replay.export.outputs import save_run
from xsim.replay.export.timeline import timeline_events, write_timeline

__all__ = ["save_run", "timeline_events", "write_annotated", "write_timeline"]
