"""A replay as speedscope's own file format (https://www.speedscope.app/file-format-schema.json).

speedscope reads Chrome-trace JSON too, but makes a frame of each event's name plus its args, so every op
of a Chrome-trace timeline is a frame of its own and Left Heavy or Sandwich list thousands of one-op frames
(issue 26 item 6). Here frames are shared: one per op kind, layer and phase (`timeline.frame_name`).

Profiles: first "all ranks", a sampled profile whose samples are (resource, op kind, frame) stacks (kind:
the frame without its layer, `mlp_up_gate.fwd` over `L14.mlp_up_gate.fwd`) weighted by the op time summed
over every rank (communication's active time, from its peers' arrival to its end) (speedscope's one view across ranks: Left Heavy ranks op kinds by total time);
then one evented profile per rank and lane ("rank 3 compute", "rank 3 comm #2"), exact integer ns, ops of a
lane never overlapping (the Chrome-trace timeline's lanes).
"""

from __future__ import annotations

import re
from collections import defaultdict

import polars as pl
from xsim.replay.export.timeline import _lanes, frame_name
from xsim.replay.result import ReplayResult

SCHEMA = "https://www.speedscope.app/file-format-schema.json"
# The generator's layer prefix (`L14.`): the all-ranks profile stacks an op kind over its layers.
_LAYER = re.compile(r"^L\d+\.")


def speedscope_doc(result: ReplayResult) -> dict:
    """The replay as a speedscope document: shared frames, an all-ranks profile, a profile per rank lane."""
    ops = result.ops.filter(pl.col("resource") != "none").sort(["rank", "start_ns", "end_ns", "node_id"])
    lane_of, _ = _lanes(ops)
    frames: dict[str, int] = {}

    def frame(name: str) -> int:
        return frames.setdefault(name, len(frames))

    events: dict[tuple[int, str, int], list[dict]] = defaultdict(list)
    summed: dict[tuple[int, ...], int] = defaultdict(int)
    cols = ops.select("rank", "resource", "start_ns", "end_ns", "wait_ns", "name").rows()
    for i, (rank, res, s, e, wait, name) in enumerate(cols):
        f = frame(frame_name(name))
        lane = events[(rank, res, lane_of[i])]
        lane.append({"type": "O", "frame": f, "at": s})
        lane.append({"type": "C", "frame": f, "at": e})
        kind = _LAYER.sub("", frame_name(name))
        below = (frame(kind), f) if kind != frame_name(name) else (f,)
        # Communication counts its active time: a recv posted early waits for its sender in a lane of its
        # own while others run, and those waits overlap (the ranks table counts waiting once, as wait_ns).
        summed[(frame(res), *below)] += e - s - (min(wait or 0, e - s) if res == "comm" else 0)
    finish = list(result.per_rank_finish_ns)
    stacks = sorted(summed.items(), key=lambda kv: (-kv[1], kv[0]))
    total = sum(w for _, w in stacks)
    profiles: list[dict] = [
        {
            "type": "sampled",
            "name": f"all {len(finish)} ranks: op time summed (ns)",
            "unit": "nanoseconds",
            "startValue": 0,
            "endValue": total,
            "samples": [list(k) for k, _ in stacks],
            "weights": [w for _, w in stacks],
        }
    ]
    for rank, res, lane in sorted(events, key=lambda k: (k[0], ("compute", "comm", "cpu").index(k[1]), k[2])):
        suffix = "" if lane == 0 else f" #{lane + 1}"
        profiles.append(
            {
                "type": "evented",
                "name": f"rank {rank} {res}{suffix}",
                "unit": "nanoseconds",
                "startValue": 0,
                "endValue": finish[rank] if rank < len(finish) else 0,
                "events": events[(rank, res, lane)],
            }
        )
    return {
        "$schema": SCHEMA,
        "shared": {"frames": [{"name": n} for n in frames]},
        "profiles": profiles,
        "name": "xsim replay",
        "activeProfileIndex": 0,
        "exporter": "xsim",
    }
