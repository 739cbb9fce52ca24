"""The child processes the commands start (Streamlit, an exporter, the job): how they stop."""

from __future__ import annotations

import subprocess


def stop_process(proc: subprocess.Popen | None, timeout: float = 10.0,
                 kill_wait: float = 5.0) -> None:
    """Terminate a child, then kill it if it does not exit within ``timeout`` seconds and
    wait up to ``kill_wait`` more; nothing for None or a child that already exited."""
    if proc is None or proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(kill_wait)
