"""The lmprog frontend language: primitives, IR, tracing. No threads, no I/O.

Programs are plain Python functions whose first parameter is the state `s`; appending to
it (`s += ...`) builds IR nodes (`lmprog.lang.ir`). The interpreter executes those nodes;
the tracer records them into a `Graph`. Design: docs/design/frontend.md.
"""

from lmprog.lang.choices import (
    ChoiceDecision,
    ChoicesMethod,
    greedy_token_selection,
    token_length_normalized,
    unconditional_likelihood_normalized,
)
from lmprog.lang.fork import ForkGroup
from lmprog.lang.frontend import FrontendState
from lmprog.lang.ir import Graph
from lmprog.lang.primitives import (
    REGEX_BOOL,
    REGEX_FLOAT,
    REGEX_INT,
    REGEX_STR,
    assistant,
    assistant_begin,
    assistant_end,
    gen,
    gen_int,
    gen_string,
    image,
    select,
    system,
    system_begin,
    system_end,
    user,
    user_begin,
    user_end,
    video,
)
from lmprog.lang.program import Program, ProgramCall
from lmprog.lang.reasoning import separate_reasoning
from lmprog.lang.tracer import Arg, TracerState

__all__ = [
    "REGEX_BOOL",
    "REGEX_FLOAT",
    "REGEX_INT",
    "REGEX_STR",
    "Arg",
    "ChoiceDecision",
    "ChoicesMethod",
    "ForkGroup",
    "FrontendState",
    "Graph",
    "Program",
    "ProgramCall",
    "TracerState",
    "assistant",
    "assistant_begin",
    "assistant_end",
    "gen",
    "gen_int",
    "gen_string",
    "greedy_token_selection",
    "image",
    "select",
    "separate_reasoning",
    "system",
    "system_begin",
    "system_end",
    "token_length_normalized",
    "unconditional_likelihood_normalized",
    "user",
    "user_begin",
    "user_end",
    "video",
]
