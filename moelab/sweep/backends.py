"""Where a sweep's points run: in this process, in a local process pool, or as Ray tasks.

Every backend yields ``(key, parquet bytes)`` as points finish; the driver writes the cache, so Ray
workers on other machines need no shared file system (only moelab installed at the same version).
"""

from __future__ import annotations

import logging
import multiprocessing as mp
import os
import socket
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from typing import Any

Point = tuple[str, dict[str, Any]]
#: ``call(fn, name, key, params) -> (key, parquet bytes)``: runs one point (the driver's encoder)
Call = Callable[[Callable[..., Any], str, str, dict[str, Any]], tuple[str, bytes]]


def execute(backend: str, call: Call, fn: Callable[..., Any], name: str, todo: Sequence[Point], *,
            workers: int | None = None, address: str | None = None) -> Iterator[tuple[str, bytes]]:
    """Run ``call(fn, name, key, params)`` for each point of ``todo`` on ``backend``; yields results in
    completion order. ``call`` must be a module-level function (it is pickled to the workers)."""
    if backend == "ray":
        return _ray(call, fn, name, todo, workers=workers, address=address)
    if address is not None:
        raise ValueError(f"--address/address is only for the ray backend; got backend={backend!r}")
    if not todo:
        return iter(())
    if backend == "serial":
        return (call(fn, name, k, p) for k, p in todo)
    return _local(call, fn, name, todo, workers=workers)


def start_method(fn: Callable[..., Any]) -> str:
    """The start method of the local process pool for ``fn``.

    ``spawn`` (fresh interpreters, safe beside threads such as BLAS, torch or a Ray driver in this process)
    for a function that lives in an importable module. A function defined in the running script or
    notebook (module ``__main__``) gets ``fork`` where the platform has it: a spawned worker would
    re-run the script from the top (it has no ``if __name__ == "__main__":`` guard) or, from a notebook,
    could not find the function at all.

    Parameters
    ----------
    fn : callable
        The sweep's point function.

    Returns
    -------
    str
        ``"spawn"`` or ``"fork"``.

    Raises
    ------
    ValueError
        For a ``__main__`` function on a platform without ``fork`` (Windows), saying what to change.
    """
    if getattr(fn, "__module__", None) != "__main__":
        return "spawn"
    if "fork" in mp.get_all_start_methods():
        return "fork"
    raise ValueError(
        f"the local backend cannot run {getattr(fn, '__qualname__', fn)!r}, defined in your script or notebook "
        "(__main__), on this platform (no fork): move it into a module you import (e.g. mypoints.py), or put the "
        "run_sweep call under `if __name__ == \"__main__\":` in a script, or use backend=\"serial\"")


def _local(call: Call, fn: Callable[..., Any], name: str, todo: Sequence[Point], *,
           workers: int | None) -> Iterator[tuple[str, bytes]]:
    n = min(workers or os.cpu_count() or 1, len(todo))
    with ProcessPoolExecutor(max_workers=n, mp_context=mp.get_context(start_method(fn))) as pool:
        futures = [pool.submit(call, fn, name, k, p) for k, p in todo]
        try:
            for fut in as_completed(futures):
                yield fut.result()
        except BaseException:
            for fut in futures:
                fut.cancel()
            raise


# ------------------------------------------------------------------------------------------------ Ray

def ray_address(address: str | None = None) -> str | None:
    """The Ray cluster to join: ``address``, else ``$RAY_ADDRESS``, else None (a local instance)."""
    address = address if address is not None else os.environ.get("RAY_ADDRESS")
    address = address.strip() if address else None
    return address or None


def check_reachable(address: str, timeout_s: float = 3.0) -> None:
    """Refuse an address whose host:port does not accept a TCP connection (before Ray waits on it)."""
    if address in ("auto", "local"):
        return
    hostport = address.split("://", 1)[-1].rstrip("/")
    host, sep, port = hostport.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"Ray address must be host:port, ray://host:port or 'auto'; got {address!r}")
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout_s):
            pass
    except OSError as exc:
        raise ValueError(f"cannot reach the Ray cluster at {address!r} ({exc.strerror or exc}); start it with "
                         "`ray start --head` or fix --address / RAY_ADDRESS") from None


def ray_session(workers: int | None = None, address: str | None = None) -> tuple[Any, bool]:
    """``(ray, started_here)``: the running Ray session (reused), else one joined (``address`` or
    ``$RAY_ADDRESS``) or started on this machine with ``workers`` CPUs and no dashboard."""
    try:
        import ray  # lazy: Ray is an optional extra and slow to import
    except ImportError:
        raise ValueError("the ray backend needs Ray: pip install 'moelab[ray]'") from None
    address = ray_address(address)
    if address is not None:  # a bad address is an error even when a Ray session is already open
        check_reachable(address)
    if ray.is_initialized():
        return ray, False
    if address is None:
        try:
            ray.init(num_cpus=workers or min(4, os.cpu_count() or 1), include_dashboard=False,
                     logging_level=logging.WARNING, log_to_driver=True)
        except Exception as exc:  # Ray raises bare Exceptions when its daemons miss their start-up deadline
            ray.shutdown()
            raise RuntimeError(
                f"could not start Ray on this machine ({str(exc).strip().splitlines()[-1]}); on a heavily loaded "
                "machine Ray's agents can miss their start-up deadline: retry, or start a cluster with "
                "`ray start --head` and pass its address with --address") from None
        return ray, True
    try:
        ray.init(address=address, logging_level=logging.WARNING)
    except (ConnectionError, RuntimeError, TimeoutError) as exc:
        raise ValueError(f"cannot join the Ray cluster at {address!r}: {str(exc).strip().splitlines()[0]}") from None
    return ray, True


def _ray(call: Call, fn: Callable[..., Any], name: str, todo: Sequence[Point], *, workers: int | None,
         address: str | None) -> Iterator[tuple[str, bytes]]:
    if not todo:  # nothing to compute: start no Ray, but still refuse a bad address
        joined = ray_address(address)
        if joined is not None:
            check_reachable(joined)
        return
    ray, started = ray_session(workers, address)
    try:
        task = ray.remote(num_cpus=1, max_retries=0)(call)
        fn_ref = ray.put(fn)
        pending = [task.remote(fn_ref, name, k, p) for k, p in todo]
        try:
            while pending:
                done, pending = ray.wait(pending, num_returns=1)
                try:
                    yield ray.get(done[0])
                except ray.exceptions.RayTaskError as exc:  # re-raise the point's own error
                    cause = getattr(exc, "cause", None)
                    raise (cause if isinstance(cause, Exception) else exc) from None
        except BaseException:
            for ref in pending:
                ray.cancel(ref, force=True)
            raise
    finally:
        if started:
            ray.shutdown()
