"""``dynspec proof``: run real SGLang servers and check what dynspec promises.

Three checks, each against servers this package starts itself with weight-free models (a
``config.json``-only target and EAGLE-3 draft, ``--load-format dummy``):

* **equivalence**: greedy outputs with speculation off, always on, and switched by the dynspec
  threshold are token-identical at every concurrency level;
* **crossings**: a load ramp inside one server lifetime crosses the threshold both ways many
  times, with no error in the server log and no failed request;
* **throughput**: with simulated acceptance, dynspec follows the upper envelope of plain decode
  and always-on speculation.

Everything here uses the standard library only, except ``command`` (click) and ``plot``
(matplotlib, optional), so the package runs on a GPU machine that has neither libcst nor
GitPython. Importing ``patcher.proof`` imports nothing else.

On the GPU machine, with the SGLang to test importable (e.g. ``PYTHONPATH=/tmp/site:$REPO``)::

    python3 -m patcher proof --out $OUT/proof                       # equivalence + crossings
    python3 -m patcher proof --checks throughput --out $OUT/tput    # 3 more servers, 8B shape
    python3 -m patcher.proof ...                                    # the same, without the rest of the CLI
    python3 -m patcher proof --checks throughput --threshold 32 --upstream-adaptive  # SGLang 0.5.17+

``--upstream-adaptive`` (throughput only; a usage error if the SGLang under test has no
``--speculative-adaptive``) starts a 4th server, ``upstream-adaptive-sim``: always-on EAGLE-3 plus
``--speculative-adaptive --speculative-adaptive-config OUT/upstream-adaptive.json`` with
``{"1": {"candidate_steps": [3]}, "<N+1>": {"candidate_steps": [0]}}``. The report adds
``throughput.upstream_adaptive`` and ``throughput.dynspec_over_upstream``; throughput fails where
dynspec / upstream adaptive < ``--min-upstream-ratio`` (default 2) at a level above N.

Each server takes 1-3 minutes to start; keep one call to three servers when calls are timed.
Modules: ``client`` (HTTP), ``servers`` (process groups), ``launch`` (command lines),
``detect`` (SGLang and GPU), ``ramp``, ``logscan``, ``run`` (the checks), ``report``, ``plot``.
"""
