"""verl log parsing and following.

- ``monitor.logs.parse``: ``LogParser`` (line by line, live), ``parse_file`` (a whole file),
  ``ParseStats``, ``ParsedLog``, ``LogReadError``.
- ``monitor.logs.follow``: ``LogFollower`` (``tail -F``), ``iter_lines`` (streamed lines).
- ``monitor.logs.keys``: ``canonical_phases``, ``normalise_key``, ``guess_version``.
"""
