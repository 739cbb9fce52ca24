"""Hangs: who holds everyone when a job stops making progress.

- ``dump``: read a PyTorch Flight Recorder dump (the pickle a rank writes when asked) into a
  typed summary per process group, without running any code from the file;
- ``request``: ask local ranks for their dumps through their debug-info FIFOs;
- ``pyspy``: the fallback without Flight Recorder, a py-spy stack of each GPU process;
- ``localize``: the cross-rank comparison that names the rank(s) the others wait for.

The ``hang`` detector (``monitor.detect.hang``) opens the flag; the exporter's
``flight_recorder`` collector requests the dumps when it opens and publishes the result.
"""
