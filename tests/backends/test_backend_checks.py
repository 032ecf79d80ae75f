"""The entry-point checks every backend shares (lmprog.backends.checks): same rules, same
messages, whichever backend received the call."""

from __future__ import annotations

import pytest

from lmprog.backends.checks import check_generate_request
from lmprog.core.protocol import GenerateRequest
from lmprog.core.sampling import SamplingParams


def test_generate_takes_a_request_and_a_callable_stream():
    request = GenerateRequest(prompt="hi", params=SamplingParams(max_tokens=1))
    check_generate_request(request, None)
    check_generate_request(request, print)
    with pytest.raises(TypeError, match="generate takes a GenerateRequest, got str"):
        check_generate_request("hi", None)
    with pytest.raises(TypeError, match="stream must be a callable"):
        check_generate_request(request, "not callable")
