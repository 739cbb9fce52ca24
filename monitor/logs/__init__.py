"""verl log parsing and following.

- ``monitor.logs.canonical_records``: the public names: ``LogParser`` (line by line, live), ``parse_file``
  (a whole file), ``ParseStats``, ``ParsedLog``, ``LogReadError``; its docstring lists the
  modules the parser is split into (``prefix``, ``console``, ``jsonl``, ``blocks``, ``events``,
  ``vocabulary``, ``parser``, ``files``, ``stats``).
- ``monitor.logs.follow``: ``LogFollower`` (``tail -F``), ``iter_lines`` (streamed lines).
- ``monitor.logs.keys``: ``canonical_phases``, ``normalise_key``, ``guess_version``.
- ``monitor.logs.failure_lines``: failure lines (NCCL, Ray, CUDA, OOM) matched and described.
"""
