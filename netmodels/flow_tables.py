"""The `flow` model's flow templates: every distinct flow (bytes, route, latency) numbered once, in numpy.

A collective's plan and a P2P name their flows by template number, so admitting k flows is one gather per
column instead of k tuples unpacked and k link arrays concatenated, and the flows in flight carry one
template number each instead of a CSR of links to keep in step. Routes are rows of a padded matrix
(`links`, `PAD` past the last link), so the links of a batch of flows are one gather too.
"""

from __future__ import annotations

import numpy as np


class FlowTemplates:
    """Routes (padded link rows) and flow templates (bytes, latency, route, narrowest link), growable."""

    def __init__(self, capacity: np.ndarray) -> None:
        self.cap = capacity
        self.pad = len(capacity)  # the padding link: past every real link, never counted as shared
        self.links = np.full((16, 1), self.pad, dtype=np.int64)  # [route, k]: route's k-th link or pad
        self.nroutes = 0
        self.route_mincap = np.zeros(16)
        self.nbytes = np.zeros(64)
        self.lat = np.zeros(64)
        self.route = np.zeros(64, dtype=np.int64)
        self.mincap = np.zeros(64)
        self.n = 0
        self._p2p: dict[tuple[int, float, float], int] = {}
        # The same as Python lists, for per-flow work on a few flows: route -> its links; template -> route,
        # its links, bytes, latency, narrowest link capacity.
        self.route_links: list[tuple[int, ...]] = []
        self.tpl_route: list[int] = []
        self.tpl_links: list[tuple[int, ...]] = []
        self.nbytes_l: list[float] = []
        self.lat_l: list[float] = []
        self.mincap_l: list[float] = []

    def add_route(self, links: np.ndarray) -> int:
        """Number a route (its links in order); its narrowest link is the rate of a flow alone on it."""
        r = self.nroutes
        rows, width = self.links.shape
        if r == rows or len(links) > width:
            grown = np.full((max(rows, 2 * r), max(width, len(links))), self.pad, dtype=np.int64)
            grown[:rows, :width] = self.links
            self.links = grown
            mc = np.zeros(len(grown))
            mc[:rows] = self.route_mincap
            self.route_mincap = mc
        self.links[r, : len(links)] = links
        self.route_mincap[r] = float(self.cap[links].min()) if len(links) else float("inf")
        self.route_links.append(tuple(int(x) for x in links))
        self.nroutes = r + 1
        return r

    def add(self, nbytes: float, route: int, lat: float) -> int:
        """Number a flow of nbytes over route, delivered lat ns after its last byte."""
        k = self.n
        if k == len(self.nbytes):
            self.nbytes, self.lat, self.mincap = (
                np.resize(a, 2 * k) for a in (self.nbytes, self.lat, self.mincap)
            )
            self.route = np.resize(self.route, 2 * k)
        self.nbytes[k], self.lat[k], self.route[k] = nbytes, lat, route
        self.mincap[k] = self.route_mincap[route]
        self.tpl_route.append(route)
        self.tpl_links.append(self.route_links[route])
        self.nbytes_l.append(float(nbytes))
        self.lat_l.append(float(lat))
        self.mincap_l.append(float(self.mincap[k]))
        self.n = k + 1
        return k

    def p2p(self, nbytes: float, route: int, lat: float) -> int:
        """The template of a P2P flow, numbered once per (route, bytes, latency)."""
        key = (route, nbytes, lat)
        k = self._p2p.get(key)
        if k is None:
            k = self._p2p[key] = self.add(nbytes, route, lat)
        return k

    def flow_links(self, tids: np.ndarray) -> np.ndarray:
        """The flows' links as rows padded with `pad` ([flow, k])."""
        return self.links[self.route[tids]]

    def csr(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The CSR (ptr, links) of padded link rows, each flow's links in route order."""
        real = rows != self.pad
        ptr = np.zeros(len(rows) + 1, dtype=np.int64)
        np.cumsum(real.sum(axis=1), out=ptr[1:])
        return ptr, rows[real]
