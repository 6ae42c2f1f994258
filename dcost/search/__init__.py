"""The search: problems, objectives, the optimizer, the exhaustive grid, and what an optimum says.

``problem`` (objective, free variables, constraints and their ``Limits``), ``objectives`` (what a
search minimizes, as values: ``COST_PER_TOKEN``, ``COST_PER_INPUT_TOKEN``, ``LIFETIME_COST``),
``lifetime_objective`` (pretraining + RL + inference dollars), ``optimize`` (Adam on
the smooth model, then an exact integer search), ``grid`` (every integer design, exact),
``solution`` (the result and its messages), ``kkt`` (multipliers and KKT points), ``sensitivity``
(elasticities of the optimum), ``pareto`` (cost against the latency target). The public names are
re-exported by ``dcost``; the modules keep their own names (``dcost.search.optimize.Settings``).
"""
