"""Persistence and hysteresis: flags open late enough and never flap."""

from monitor.detect.persistence import Episode, episodes


def test_opens_only_after_the_condition_persists():
    cond = [False, True, True, False, True, True, True, False, False, False]
    eps = episodes(cond, open_after=3, close_after=2)
    assert eps == [Episode(onset=4, opened=6, last=6, closed=8)]


def test_a_single_false_inside_an_open_flag_does_not_close_it():
    cond = [True, True, False, True, False, True, True]
    eps = episodes(cond, open_after=2, close_after=2)
    assert len(eps) == 1
    assert eps[0].closed is None  # still open at the end
    assert eps[0].last == 6


def test_flapping_condition_with_hysteresis_gives_one_episode():
    cond = [True, False] * 10
    assert len(episodes(cond, open_after=1, close_after=2)) == 1
    assert len(episodes(cond, open_after=1, close_after=1)) == 10


def test_unknown_points_keep_the_state():
    cond = [True, None, True, float("nan"), True, False, None, False]
    eps = episodes(cond, open_after=3, close_after=2)
    assert eps == [Episode(onset=0, opened=4, last=4, closed=7)]


def test_empty_and_never_true():
    assert episodes([], 1, 1) == []
    assert episodes([False] * 5, 1, 1) == []
