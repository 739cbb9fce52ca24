"""Advice names only real verl config keys (VERL_SIGNALS.md section 6), never invented ones."""

from monitor.detect.flag_advice import ADVICE, INVENTED_KEYS, REAL_KEYS, advice_for, named_keys
from monitor.records import FLAG_KINDS


def test_every_flag_kind_has_advice():
    for kind in FLAG_KINDS:
        assert advice_for(kind), kind


def test_advice_names_only_real_keys():
    for kind, sentences in ADVICE.items():
        for sentence in sentences:
            for key in named_keys(sentence):
                assert key in REAL_KEYS, f"{kind}: {key} is not a real verl key"


def test_advice_never_names_invented_keys():
    for sentences in ADVICE.values():
        text = " ".join(sentences)
        for key in INVENTED_KEYS:
            assert key not in text


def test_most_kinds_name_at_least_one_lever():
    with_keys = [k for k, v in ADVICE.items() if any(named_keys(s) for s in v)]
    assert set(with_keys) == set(FLAG_KINDS)


def test_key_finder_sees_keys_and_ignores_prose():
    assert named_keys("raise data.dataloader_num_workers, e.g. to 16") == [
        "data.dataloader_num_workers"
    ]
    assert named_keys("set trainer.engine_type=x") == ["trainer.engine_type"]
