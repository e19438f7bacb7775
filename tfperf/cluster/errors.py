"""The error of local clusters and emulated hosts: apart from both, so that each raises it without importing the
other."""

from __future__ import annotations

from tfperf.measure.processes import ChildError


class ClusterError(ChildError):
    """A task of a local cluster failed or did not finish in time, or hosts could not be made; the message names it
    and its log."""
