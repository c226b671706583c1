"""Server flags dynspec refuses before serving, each message naming the flag."""

from types import SimpleNamespace as NS

import pytest

from sglang_dynspec.compat import server_args_problems


def sa(**kw):
    base = dict(speculative_algorithm="EAGLE3", enable_dp_attention=False, pp_size=1)
    base.update(kw)
    return NS(**base)


@pytest.mark.parametrize("algo", ["EAGLE", "EAGLE3", "eagle3"])
def test_eagle_accepted(algo):
    assert server_args_problems(sa(speculative_algorithm=algo)) == []


@pytest.mark.parametrize("kw, needle", [
    ({"speculative_algorithm": None}, "speculative_algorithm (--speculative-algorithm): not set"),
    ({"speculative_algorithm": "NGRAM"}, "NGRAM is not supported"),
    ({"speculative_algorithm": "STANDALONE"}, "STANDALONE is not supported"),
    ({"enable_dp_attention": True}, "enable_dp_attention (--enable-dp-attention)"),
    ({"pp_size": 2}, "pp_size (--pipeline-parallel-size)"),
])
def test_refused(kw, needle):
    problems = server_args_problems(sa(**kw))
    assert len(problems) == 1 and needle in problems[0]
