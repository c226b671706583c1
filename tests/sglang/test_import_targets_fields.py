"""The ServerArgs fields dynspec reads exist in the installed release."""

import inspect

import pytest

pytestmark = pytest.mark.sglang


def test_server_args_fields_exist():
    from sglang.srt.server_args import ServerArgs

    params = inspect.signature(ServerArgs).parameters
    for name in ("speculative_algorithm", "enable_dp_attention", "pp_size", "speculative_num_draft_tokens",
                 "enable_metrics", "disable_overlap_schedule"):
        assert name in params, name
