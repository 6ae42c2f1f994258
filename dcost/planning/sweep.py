"""``dcost.plan_sweep``: many planning questions, sharded over every JAX device and process.

    plans = dcost.plan_sweep([
        dcost.Scenario("llama-3-70b", "h100-sxm", "chat", rate=100.0),
        dcost.Scenario("llama-3-70b", "h100-sxm", "chat", rate=400.0, tpot_slo=(0.03, 0.9)),
        dcost.Scenario("llama-3.1-8b", "b200", "reasoning", rate=20.0, mode="aggregated"),
    ])

A sweep is ``dcost.plan`` run on batches. Scenarios that ask the same question of different
traffic (one model, chip, mode, engine and pair of targets) form a **group**, planned as one
batched ``Traffic``: its checks, layouts and step tables once (``planner._prepare``), then the
planner's own search program on **blocks** of at most ``block`` scenarios (the batch padded to
a power of two by repeating its last scenario, as ``dcost.plan`` pads it). The blocks of every
group are the units of work: block ``t`` (in the order of the groups' first scenarios, then of
the blocks) runs on process ``t mod P`` and, there, on local device ``(t div P) mod D``; every
process then holds every block's search results (their bytes through the ``jax.distributed``
coordinator's key-value store) and assembles the plans in the scenarios' order.

**Exact.** A block is the same programs on the same inputs wherever it runs (the planner's
per-kind searches, compiled with the XLA options ``dcost.plan`` uses, on one device), so the
answers are the same bits for any number of devices and processes; and a group of at most
``block`` scenarios is one block shaped as ``dcost.plan`` shapes that batch, so its answers are
``dcost.plan``'s exactly (``tests/test_sweep.py``, on 2 processes of 2 host devices each). A
larger group's answers are those of ``dcost.plan`` on each block of it (XLA:CPU rounds a few
predicted percentiles of a scenario differently in a batch of another size, in the last bit;
the plans' integers do not depend on it).

**Devices.** Each local device runs its own copy of the search program (JAX compiles a program
for the device its inputs are on; XLA:CPU cannot load one device's executable onto another), so
a process with ``D`` devices compiles it up to ``D`` times (a GPU's persistent cache shares one
compilation; a CPU's keys it by device); one program shared by several devices through
``shard_map`` computed a few reported percentiles in other last bits than the one-device
program (XLA:CPU, JAX 0.10.2), which would break exactness. Blocks are dispatched to every
device before any result is awaited, so devices work at the same time.

**Processes.** Call ``jax.distributed.initialize(...)`` in every process first, then
``plan_sweep`` with the same scenarios in every one; each returns the whole sweep. One process
(the usual case): no collective runs.
"""

from __future__ import annotations

import pickle
from typing import Any, NamedTuple

import jax
import numpy as np

from dcost.planning import planner as PL
from dcost.planning import search as S
from dcost.planning.traffic import Traffic, traffic_names
from dcost.planning.traffic import traffic as traffic_preset
from dcost.specs import Hardware, Model, SpecError

__all__ = ["Scenario", "ScenarioError", "plan_sweep", "assign", "BLOCK"]

BLOCK = 256
"""Most scenarios of one block (a power of two, at least 16): a group of up to ``BLOCK``
scenarios is planned exactly as ``dcost.plan`` plans that batch."""
_TRAFFIC_FIELDS = ("rate", "prompt_tokens", "output_tokens", "prompt_cv", "output_cv", "prefix_hit")


class ScenarioError(SpecError):
    """A bad scenario of a sweep; ``index`` is its position in the list."""

    def __init__(self, index: int, message: str):
        super().__init__(f"plan_sweep: scenario {index}: {message}")
        self.index = index


class Scenario(NamedTuple):
    """One planning question of a sweep (``dcost.plan_sweep``).

    Attributes:
      model: a model preset name or a ``dcost.Model``.
      hardware: a hardware preset name (its FLOP/s at the model's serving precision, as
        ``dcost.plan`` takes names) or a ``dcost.Hardware``.
      traffic: a traffic preset name (``dcost.planning.traffic_names()``) or a ``dcost.Traffic``
        of one scenario.
      rate: arrivals (requests/s) replacing the traffic's; None: the traffic's own.
      ttft_slo, tpot_slo: ``(seconds, percentile)`` targets, as ``dcost.plan`` takes them.
      mode: "aggregated", "disaggregated" or "best".
      engine: None, an engine name (with a hardware preset name) or a ``dcost.Engine``.
    """

    model: str | Model
    hardware: str | Hardware
    traffic: str | Traffic = "chat"
    rate: float | None = None
    ttft_slo: tuple[float, float] = (2.0, 0.99)
    tpot_slo: tuple[float, float] = (0.05, 0.90)
    mode: str = "best"
    engine: Any = None


def assign(items: int, processes: int, devices: int) -> list[tuple[int, int]]:
    """``(process, local device)`` of each of ``items`` blocks: round robin over processes,
    then over each process's devices.

    >>> assign(5, 2, 2)
    [(0, 0), (1, 0), (0, 1), (1, 1), (0, 0)]
    """
    return [(t % processes, (t // processes) % devices) for t in range(items)]


def _key(value) -> Any:
    """A hashable stand-in for a question's part: names and numbers as they are, objects by
    identity (the same ``Hardware`` object shares a group; equal copies do not)."""
    if value is None or isinstance(value, (str, int, float)):
        return value
    if isinstance(value, tuple):
        return tuple(_key(v) for v in value)
    return ("object", id(value))


def _scenario(i: int, s) -> tuple[Scenario, Traffic]:
    """Scenario ``i`` checked, with its traffic of one scenario (SpecError naming it)."""
    if isinstance(s, dict):
        try:
            s = Scenario(**s)
        except TypeError as err:
            raise ScenarioError(i, f"{err} (fields: {', '.join(Scenario._fields)})") from None
    if not isinstance(s, Scenario):
        raise ScenarioError(i, f"must be a dcost.Scenario or a dict, got {type(s).__name__}")
    overrides = {} if s.rate is None else {"rate": s.rate}
    try:
        if isinstance(s.traffic, str):
            if s.traffic not in traffic_names():
                raise SpecError(
                    f"traffic = {s.traffic!r} is not a traffic preset: choose from "
                    f"{', '.join(traffic_names())}"
                )
            t = traffic_preset(s.traffic, **overrides)
        elif isinstance(s.traffic, Traffic):
            t = s.traffic
            if overrides:
                fields = {f: getattr(t, f) for f in _TRAFFIC_FIELDS}
                t = Traffic(**{**fields, **overrides})
        else:
            raise SpecError(
                f"traffic must be a preset name or a dcost.Traffic, got {type(s.traffic).__name__}"
            )
        if t.prompt_sample is not None or any(np.ndim(getattr(t, f)) for f in _TRAFFIC_FIELDS):
            raise SpecError(
                "traffic must be one scenario of numbers (no sample, no arrays): a sweep's "
                "scenarios are its rows"
            )
        PL._slo("ttft_slo", s.ttft_slo, "plan_sweep")
        PL._slo("tpot_slo", s.tpot_slo, "plan_sweep")
        if not isinstance(s.mode, str) or s.mode not in PL.MODES:
            raise SpecError(f"mode = {s.mode!r} is not allowed: choose from {', '.join(PL.MODES)}")
    except (SpecError, ValueError) as err:
        raise ScenarioError(i, _text(err)) from None
    return s, t


def _text(err: Exception) -> str:
    """An error's message (a KeyError's without the quotes its ``str`` adds)."""
    return str(err.args[0]) if isinstance(err, KeyError) and err.args else str(err)


def _stack(traffics: list[Traffic]) -> Traffic:
    fields = {f: np.asarray([float(getattr(t, f)) for t in traffics]) for f in _TRAFFIC_FIELDS}
    return Traffic(**fields)


_GATHER_TIMEOUT_S = 6 * 3600.0
"""How long a process waits for the others' blocks (they may take hours on a big sweep)."""
_CALLS = [0]  # sweeps this process has gathered: every process calls plan_sweep in one order


def _gather(local: dict[int, Any]) -> dict[int, Any]:
    """Every process's ``{block: results}`` (NumPy trees), in every process: through the
    ``jax.distributed`` coordinator's key-value store (bytes under one key per process and
    sweep), which waits as long as a slow process needs; a collective (``process_allgather``
    over Gloo on CPU) gives up after 30 s when one process reaches it minutes before another."""
    if jax.process_count() == 1:
        return local
    from jax._src import distributed  # the coordinator's client: no public handle in JAX 0.10

    client: Any = distributed.global_state.client
    blob = pickle.dumps(local, protocol=pickle.HIGHEST_PROTOCOL)
    call = _CALLS[0]
    _CALLS[0] += 1
    client.key_value_set_bytes(f"dcost/plan_sweep/{call}/{jax.process_index()}", blob)
    merged: dict[int, Any] = {}
    for p in range(jax.process_count()):
        got = client.blocking_key_value_get_bytes(
            f"dcost/plan_sweep/{call}/{p}", int(_GATHER_TIMEOUT_S * 1000)
        )
        merged.update(pickle.loads(got))
    return merged


def plan_sweep(
    scenarios,
    *,
    block: int = BLOCK,
    devices=None,
    acceptance=None,
    memory_reserve: float = 0.1,
    slot_wait: float = 1e-3,
    max_utilisation: float | None = None,
    options: PL.Options = PL.DEFAULT_OPTIONS,
    settings: S.Settings = S.DEFAULT,
) -> PL.PlanBatch:
    """The cheapest fleet of every scenario (``dcost.plan`` of each), sharded over devices and
    processes (see the module docstring for how, and why the answers are exact).

    Args:
      scenarios: ``dcost.Scenario`` s (or dicts of their fields), one question each.
      block: most scenarios of one unit of work (a power of two >= 16); a group of at most
        ``block`` scenarios gives ``dcost.plan``'s answers for that batch exactly.
      devices: the local devices to use (default ``jax.local_devices()``).
      acceptance, memory_reserve, slot_wait, max_utilisation, options, settings: as
        ``dcost.plan`` takes them, shared by every scenario.

    Returns:
      A ``PlanBatch``: ``batch[i]`` is scenario ``i``'s ``Plan`` (in every process).

    >>> import dcost
    >>> rows = [dcost.Scenario("llama-3.1-8b", "h100-sxm", "chat", rate=r) for r in (5.0, 50.0)]
    >>> sweep = dcost.plan_sweep(rows)
    >>> p = dcost.plan("h100-sxm", "llama-3.1-8b", dcost.traffic("chat", rate=[5.0, 50.0]))
    >>> [s.chips for s in sweep] == [q.chips for q in p], sweep[1].ttft == p[1].ttft
    (True, True)
    """
    if isinstance(block, bool) or not isinstance(block, (int, np.integer)):
        raise SpecError(f"plan_sweep.block = {block!r} is not allowed: a power of two >= 16")
    if block < 16 or block & (block - 1):
        raise SpecError(f"plan_sweep.block = {block!r} is not allowed: a power of two >= 16")
    local = list(jax.local_devices() if devices is None else devices)
    if not local:
        raise SpecError("plan_sweep.devices is empty: give at least one device")
    rows = [_scenario(i, s) for i, s in enumerate(scenarios)]
    groups: dict[Any, list[int]] = {}
    for i, (s, _) in enumerate(rows):
        key = (_key(s.model), _key(s.hardware), s.mode, _key(s.engine), s.ttft_slo, s.tpot_slo)
        groups.setdefault(key, []).append(i)
    common = dict(
        acceptance=acceptance,
        memory_reserve=memory_reserve,
        slot_wait=slot_wait,
        max_utilisation=max_utilisation,
        options=options,
        settings=settings,
        confidence=None,
    )
    prepared = []
    items: list[tuple[int, int, int]] = []  # (group, start, stop) of the padded batch
    for g, members in enumerate(groups.values()):
        s = rows[members[0]][0]
        try:
            prep = PL._prepare(
                s.hardware,
                s.model,
                _stack([rows[i][1] for i in members]),
                s.ttft_slo,
                s.tpot_slo,
                s.mode,
                engine=s.engine,
                **common,
            )
        except (SpecError, ValueError, KeyError) as err:
            raise ScenarioError(members[0], _text(err)) from None
        prepared.append(prep)
        if prep.plans is None:
            width = min(prep.size, block)
            for start in range(0, prep.batch, width):
                items.append((g, start, start + width))
    me, processes = jax.process_index(), jax.process_count()
    places = assign(len(items), processes, len(local))
    one = processes == 1 and len(local) == 1
    # the planner's own per-kind search program (its jit's plain ``jax.jit``, with the XLA
    # options dcost.plan's would use): compiled for each device its inputs are on
    program = PL._search_kind.compiled()
    pending: dict[int, Any] = {}
    placed: dict[tuple[int, int], tuple] = {}
    for t, ((g, start, stop), (proc, dev)) in enumerate(zip(items, places, strict=True)):
        if proc != me:
            continue
        prep = prepared[g]
        kinds, tables, mix, traffic, targets, hardware, model, settings_g = prep.search_arguments()

        def cut(tree, start=start, stop=stop):
            return jax.tree.map(lambda x: x[start:stop] if np.ndim(x) else x, tree)

        width = min(stop - start, PL.WIDTH)
        if one:
            pending[t] = PL._search(
                kinds,
                tables,
                cut(mix),
                cut(traffic),
                cut(targets),
                hardware,
                model,
                settings_g,
                width,
            )
            continue
        device = local[dev]
        if (g, dev) not in placed:
            placed[(g, dev)] = jax.device_put((tables, hardware, model), device)
        tables_d, hardware_d, model_d = placed[(g, dev)]
        pieces = jax.device_put((cut(mix), cut(traffic), cut(targets)), device)
        pending[t] = {
            k: program(k, tables_d[k], *pieces, hardware_d, model_d, settings_g, width)
            for k in kinds
        }
    done = {t: jax.tree.map(np.asarray, jax.device_get(out)) for t, out in pending.items()}
    done = _gather(done)
    answers: list[Any] = [None] * len(rows)
    for g, members in enumerate(groups.values()):
        prep = prepared[g]
        if prep.plans is None:
            parts = [done[t] for t, item in enumerate(items) if item[0] == g]
            found = jax.tree.map(lambda *xs: np.concatenate(xs), *parts)
            batch = PL._answer(prep, found)
        else:
            batch = PL._answer(prep, None)
        for i, p in zip(members, batch, strict=True):
            answers[i] = p
    return PL.PlanBatch(tuple(answers))
