"""Every router of the lab, by name: the one module that imports each router's home.

The router contract and its registry live on the floor (:mod:`moelab.routing.base`); each router
registers itself there when its module is imported. This module sits above the paper folders and
imports every one of those modules, so its :data:`ROUTERS` lists them all: the floor's baselines and
DP balancers, ELDR's locality band and domain oracle, and BalanceRoute's BR-0 / BR-H. Drivers that run
any router (the serving proxy and analysis, cross-paper experiments, the CLI) build them here by name::

    from moelab.routers import make_router
    from moelab.routing import RouterCalibration

    router = make_router("eldr", RouterCalibration(n_workers=8, signatures=calibration_signatures), tau=0.1)

A paper's own experiments import only the floor (:mod:`moelab.routing`): their routers register when
the paper's package is imported, and paper folders never import each other.
"""

from __future__ import annotations

import importlib
from collections.abc import Sequence

# each import registers its module's routers in the floor's registry (the import is the point)
import moelab.balanceroute.routers  # noqa: F401  BR-0, BR-H
import moelab.eldr.routing  # noqa: F401  ELDR's locality band, the domain oracle
import moelab.routing.baselines  # noqa: F401  RR, random, JSQ, P2C, least-KV, vLLM DP
import moelab.routing.dp_balancers  # noqa: F401  vLLM's and SGLang's DP balancers by version
from moelab.routing.base import (
    ROUTERS,
    RouterCalibration,
    available_routers,
    check_supplies,
    make_router,
    requirements,
    router_class,
    router_names,
)


def import_router_modules(modules: Sequence[str], *, flag: str = "--router-module") -> list[str]:
    """Import each of ``modules`` so the routers they register (:func:`register_router`) can be named:
    what ``--router-module MODULE`` does for ``moelab serve-router`` and ``moelab sweep``.

    Parameters
    ----------
    modules : sequence of str
        Importable module names (installed, or their folder on ``PYTHONPATH``, e.g. ``PYTHONPATH=.``). A
        module already imported is not run again.
    flag : str
        The option named in the error (default ``"--router-module"``).

    Returns
    -------
    list of str
        The module names, in the order imported.

    Raises
    ------
    ValueError
        Naming ``flag`` and the module, for a module that cannot be imported.
    """
    if isinstance(modules, (str, bytes)) or not isinstance(modules, Sequence):
        raise ValueError(f"{flag} takes a list of module names; got {modules!r:.60}")
    out = []
    for module in modules:
        if not isinstance(module, str) or not module:
            raise ValueError(f"{flag} must name a module; got {module!r:.60}")
        try:
            importlib.import_module(module)
        except ImportError as exc:
            raise ValueError(f"{flag} {module!r} cannot be imported: {exc}") from None
        out.append(module)
    return out


__all__ = ["ROUTERS", "RouterCalibration", "available_routers", "check_supplies", "import_router_modules", "make_router",
           "requirements", "router_class", "router_names"]
