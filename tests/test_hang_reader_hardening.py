"""Issue 30 row 7: the Flight Recorder reader opens only regular files inside its directory,
without following links and without blocking on a FIFO named like a dump; a bad dump (a 400 KB
deeply nested pickle, a truncated file, garbage) fails that rank only and is counted, and the
round goes on with the other ranks. Real FIFOs, links and stand-in rank processes."""

from __future__ import annotations

import json
import os
import pickle
from pathlib import Path

import pytest
from hang_standins import FIXTURES, as_rank, real_dump, start_standin, stop, write_dump
from threads import in_thread

from monitor.hang.dump import DumpError, parse_dump, read_dump_dir
from monitor.hang.localize import localize_dumps
from monitor.hang.request import request_dumps


def deep_pickle(depth: int = 200_000) -> bytes:
    """A real dump whose first entry's ``input_sizes`` is ``depth`` lists inside each other
    (about 400 KB): it loads, then raises RecursionError wherever it is printed or compared."""
    doc = as_rank(real_dump(), 1, 4)
    doc["entries"][-1]["input_sizes"] = "DEEP"
    raw = pickle.dumps(doc, protocol=2)
    marker = b"X\x04\x00\x00\x00DEEP"
    assert raw.count(marker) == 1
    return raw.replace(marker, b"]" * depth + b"a" * (depth - 1))


def test_a_fifo_named_like_a_dump_is_refused_not_waited_on(tmp_path: Path) -> None:
    """Before: open() of the FIFO fr_9 blocked the reader for ever."""
    (tmp_path / "fr_0").write_bytes((FIXTURES / "running" / "fr_0").read_bytes())
    os.mkfifo(tmp_path / "fr_9")
    dumps, problems = in_thread(lambda: read_dump_dir(tmp_path))
    assert sorted(dumps) == [0]
    assert "not a regular file" in problems[9]


def test_links_are_not_followed_out_of_the_dump_directory(tmp_path: Path) -> None:
    """Before: a dump symlink was followed outside --fr-dir (and read)."""
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    (outside / "fr_2").write_bytes((FIXTURES / "running" / "fr_0").read_bytes())
    fr = tmp_path / "fr"
    fr.mkdir()
    (fr / "fr_0").write_bytes((FIXTURES / "running" / "fr_0").read_bytes())
    (fr / "fr_1").symlink_to(outside / "fr_2")
    (fr / "node1").symlink_to(outside, target_is_directory=True)
    dumps, problems = read_dump_dir(fr)
    assert sorted(dumps) == [0]
    assert "symbolic link" in problems[1]
    if 2 in problems:  # reached through the linked folder (where rglob descends into it)
        assert "outside" in problems[2]


def test_a_deeply_nested_pickle_is_a_dump_error_in_words() -> None:
    """Before: it loaded, and the round died of RecursionError when it was printed."""
    try:
        parse_dump(deep_pickle(), 1)
    except DumpError as exc:
        assert "nested deeper" in str(exc)
    else:
        raise AssertionError("a 200,000-deep pickle was taken for a dump")


@pytest.mark.slow  # it starts stand-in ranks and waits for the silent one
def test_bad_dumps_fail_their_rank_only_and_are_counted(tmp_path: Path) -> None:
    """A round with a good rank, a deep pickle, a truncated dump, garbage and a FIFO where a
    dump should be: the good rank is localized, every other is a problem of its own."""
    run = tmp_path / "fr"
    run.mkdir()
    good = write_dump(tmp_path / "d0", as_rank(real_dump(), 0, 4))
    sources = {0: good}
    sources[1] = tmp_path / "d1"
    sources[1].write_bytes(deep_pickle())
    sources[2] = tmp_path / "d2"
    sources[2].write_bytes(good.read_bytes()[: len(good.read_bytes()) // 2])
    sources[3] = tmp_path / "d3"
    sources[3].write_bytes(os.urandom(4096))
    procs = [start_standin(run, rank, path) for rank, path in sources.items()]
    os.mkfifo(run / "pipe_4.pipe")  # rank 4: its FIFO is read, its "dump" is a FIFO too
    hold = os.open(run / "pipe_4.pipe", os.O_RDONLY | os.O_NONBLOCK)
    os.mkfifo(run / "fr_4")
    try:
        got = in_thread(lambda: request_dumps(run, wait_s=3.0), within=30.0)
    finally:
        os.close(hold)
        stop(procs)
    assert sorted(got.dumps) == [0]
    assert sorted(got.bad) == [1, 2, 3, 4] and got.result == "bad_dump"
    assert "nested deeper" in got.problems[1]
    assert "not a whole pickle" in got.problems[2] and "not a whole pickle" in got.problems[3]
    assert "not a regular file" in got.problems[4]
    loc = localize_dumps(got.dumps, got.problems, {})
    json.dumps(loc.to_event(0.0, "n0", got.seconds, {}).to_dict(), default=str)


# --- issue 41 item 2: the py-spy dumps of ``analyze --stacks`` and the hang watch's log tail --

REAL_STACKS = Path(__file__).parent / "fixtures" / "real_verl" / "healthy" / "stacks"


def _stacks_copy(tmp_path: Path) -> Path:
    folder = tmp_path / "stacks"
    folder.mkdir()
    for f in REAL_STACKS.iterdir():
        (folder / f.name).write_bytes(f.read_bytes())
    return folder


def test_a_fifo_or_a_link_out_named_like_a_py_spy_dump_is_not_read(tmp_path: Path) -> None:
    """Round 5 N12 and B2: a FIFO named like a dump hung ``analyze --stacks`` for good; a link
    to a file outside the folder was followed and its frame-like line reached the report."""
    from monitor.hang.stacks import stacks_report

    folder = _stacks_copy(tmp_path)
    before, _ = stacks_report(folder)
    os.mkfifo(folder / "1796162745.500_TaskRunner_1.txt")
    secret = tmp_path / "secret.txt"
    secret.write_text('Process 3: ray::TaskRunner.run\nThread 3 (active): "MainThread"\n'
                      "    TOPSECRET_line (x.py:1)\n")
    (folder / "1796162746.000_TaskRunner_3.txt").symlink_to(secret)
    where, _ = in_thread(lambda: stacks_report(folder))
    assert where["rounds"] == before["rounds"]
    assert "TOPSECRET" not in json.dumps(where)
    said = " ".join(where["problems"])
    assert "a FIFO" in said and "symbolic link" in said


def test_a_stacks_folder_nested_thousands_deep_is_walked_without_recursion(tmp_path: Path
                                                                          ) -> None:
    """Round 5 N11: ``rglob`` recursed; 1,900 levels gave RecursionError and a traceback."""
    import tempfile

    from monitor.hang.stacks import read_stacks_dir

    # outside pytest's temporary folder: its clean-up recurses (shutil.rmtree) and would fail
    root = Path(tempfile.mkdtemp(prefix="verlmon-deep-"))
    try:
        _make_chain(root, 1900, "1796162800.000_TaskRunner_3.txt",
                    (REAL_STACKS / "1796162715.342_TaskRunner_1359.txt").read_bytes())
        rounds = read_stacks_dir(root)  # no RecursionError; the deep dump is not walked to
        assert rounds == []
    finally:
        _remove_chain(root)
        os.rmdir(root)


def _make_chain(root: Path, depth: int, name: str, data: bytes) -> None:
    """``root/d/d/.../d/name``, ``depth`` folders down, made relative to an open folder (the
    whole path is past PATH_MAX)."""
    fd = os.open(root, os.O_RDONLY)
    try:
        for _ in range(depth):
            os.mkdir("d", dir_fd=fd)
            new = os.open("d", os.O_RDONLY, dir_fd=fd)
            os.close(fd)
            fd = new
        out = os.open(name, os.O_WRONLY | os.O_CREAT, 0o644, dir_fd=fd)
        os.write(out, data)
        os.close(out)
    finally:
        os.close(fd)


def _remove_chain(root: Path) -> None:
    """Remove a chain of folders ``d/d/d/...`` too deep for ``shutil.rmtree`` (which recurses:
    pytest's own clean-up of the temporary folder would fail on it)."""
    fds = [os.open(root, os.O_RDONLY)]
    try:
        while "d" in os.listdir(fds[-1]):
            fds.append(os.open("d", os.O_RDONLY, dir_fd=fds[-1]))
        while fds:
            fd = fds.pop()
            for name in os.listdir(fd):
                os.unlink(name, dir_fd=fd)
            os.close(fd)
            if fds:
                os.rmdir("d", dir_fd=fds[-1])
    finally:
        for fd in fds:
            os.close(fd)


def test_a_huge_py_spy_dump_is_not_read_whole(tmp_path: Path) -> None:
    """Round 5 N14: a 300 MB dump took 152 s and 5.7 GB; a real one is 1-10 KB."""
    from monitor.hang.stacks import MAX_STACK_BYTES, stacks_report

    folder = _stacks_copy(tmp_path)
    big = folder / "1796162800.000_TaskRunner_3.txt"
    with open(big, "w") as fh:
        fh.write('Process 3: ray::TaskRunner.run\nThread 3 (active): "MainThread"\n')
        fh.write("    f (x.py:1)\n" * (MAX_STACK_BYTES // 14 + 10))
    where, _ = stacks_report(folder)
    assert any("bytes, over the" in p for p in where["problems"])


def test_the_hang_watch_reads_only_a_regular_logs_tail(tmp_path: Path) -> None:
    """Round 5 N6: with the log a link to /dev/zero the hang watch's ``read_tail`` read without
    end (3.35 GB in 12 s); a FIFO blocked its ``open``. The tail of a regular log is read."""
    from monitor.hang.procs import read_tail

    log = tmp_path / "Z.log"
    log.symlink_to("/dev/zero")
    assert in_thread(lambda: read_tail(log)) == ""
    log.unlink()
    os.mkfifo(log)
    assert in_thread(lambda: read_tail(log)) == ""
    log.unlink()
    log.write_text("a" * 100 + "\n(WorkerDict pid=5) x\n")
    assert read_tail(log, 22) == "\n(WorkerDict pid=5) x\n"
