"""A helper process of ``dcost._programs.prepare_elsewhere``: ``python -m dcost._helper FILE``
loads or compiles the programs FILE names into the store and exits 0 when every one is there.

FILE (written by the parent, in the store's private directory) holds ``{"x64": bool,
"where": the store, "tasks": [(module, name, fast, args, kwargs), ...]}``: each task is
``module.name.prepare_as(fast, *args, **kwargs)`` of a program jitted by ``dcost.search._jit``.
"""

from __future__ import annotations

import importlib
import pathlib
import pickle
import sys


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: python -m dcost._helper FILE", file=sys.stderr)
        return 2
    path = pathlib.Path(argv[1])
    with open(path, "rb") as f:
        payload = pickle.load(f)
    path.unlink(missing_ok=True)
    import jax

    from dcost import _programs

    _programs._HELPER_DIRECTORY[:] = [pathlib.Path(payload["where"])]
    if payload["x64"]:
        jax.config.update("jax_enable_x64", True)
    ok = True
    for module, name, fast, args, kwargs in payload["tasks"]:
        program = getattr(importlib.import_module(module), name)
        ok = bool(program.prepare_as(fast, *args, **kwargs)) and ok
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv))
