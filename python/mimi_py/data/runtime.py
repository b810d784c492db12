"""Ray for :mod:`mimi_py.data`: connecting (or starting a local instance), the codec stages'
actor pool, and the thread count of each actor, set one way for every path.

mimi_py's pool (rayon) reads ``RAYON_NUM_THREADS`` when it first computes, so the count has to
be in the process environment before that: :func:`_thread_vars` is the one description of it,
put in the actors' ``runtime_env`` by :func:`ray_stage_args` and into ``os.environ`` by
:func:`threads_env` (for a stage built outside Ray, or an actor started without that env).
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Iterator
from typing import Any

from .common import need

__all__: list[str] = []  # all shared inside mimi_py.data only

_THREAD_VARS = ("RAYON_NUM_THREADS", "OMP_NUM_THREADS")


def _thread_vars(threads: int) -> dict[str, str]:
    """The environment variables that set the thread count of mimi_py's (rayon's) pool and of
    OpenMP, to ``threads``."""
    return {name: str(int(threads)) for name in _THREAD_VARS}


def threads_env(threads: int | None) -> None:
    """Set :func:`_thread_vars` in this process; only effective before mimi_py's first use."""
    if threads is not None:
        os.environ.update(_thread_vars(threads))


def ray_stage_args(workers: int, threads: int, cluster_cpus: float | None) -> dict[str, Any]:
    """``map_batches`` arguments of a codec stage: ``workers`` actors of ``threads`` CPUs, with
    :func:`_thread_vars` in their environment."""
    ray_data = need("ray.data")
    if cluster_cpus is not None and workers * threads > cluster_cpus:
        # More than the cluster has now: start what fits and let the pool grow (autoscaling).
        compute = ray_data.ActorPoolStrategy(min_size=1, max_size=workers)
    else:
        compute = ray_data.ActorPoolStrategy(size=workers)
    return {"compute": compute, "num_cpus": threads, "runtime_env": {"env_vars": _thread_vars(threads)}}


# Ray's own chatter on a successful run (its INFO/WARNING lines, the token-auth notice, the
# progress-bar notice, the driver core worker's note about actor restarts with constructor
# arguments in the object store) goes to its log files only; errors still reach stderr.
_RAY_LOGGERS = ("ray", "ray.data", "ray.data._internal")


def _quiet_ray() -> None:
    """Keeps Ray's routine lines out of the job's output (they stay in Ray's log files)."""
    os.environ.setdefault("RAY_BACKEND_LOG_LEVEL", "fatal")  # the driver's core worker (C++)
    for name in _RAY_LOGGERS:
        logging.getLogger(name).setLevel(logging.ERROR)


def _init_ray(address: str | None) -> bool:
    """Connect to (or start) Ray; True when this call started it (and should shut it down)."""
    ray = need("ray")
    if ray.is_initialized():
        return False
    _quiet_ray()
    if address is None and not os.environ.get("RAY_ADDRESS"):
        # A local instance listens on the loopback address only, not the machine's interface.
        ray.init(
            include_dashboard=False,
            logging_level=logging.ERROR,
            log_to_driver=False,
            _node_ip_address="127.0.0.1",
        )
    else:
        ray.init(address=address, logging_level=logging.ERROR, log_to_driver=False)
    return True


@contextlib.contextmanager
def ray_session(address: str | None, quiet_bars: bool) -> Iterator[float]:
    """Ray for one job, yielding the cluster's CPU count: an existing connection, else
    ``address`` / ``RAY_ADDRESS``, else a local instance that is shut down at the end. With
    ``quiet_bars`` Ray Data's progress bars are off meanwhile (the job prints its own lines)."""
    started = _init_ray(address)
    try:
        ray, ray_data = need("ray"), need("ray.data")
        ctx = ray_data.DataContext.get_current()
        bars, banner = ctx.enable_progress_bars, ctx.print_on_execution_start
        if quiet_bars:
            ctx.enable_progress_bars, ctx.print_on_execution_start = False, False
        try:
            yield float(ray.cluster_resources().get("CPU", 1))
        finally:
            ctx.enable_progress_bars, ctx.print_on_execution_start = bars, banner
    finally:
        if started:
            need("ray").shutdown()
