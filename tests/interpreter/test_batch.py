import pytest
from fakes import FakeBackend, within

import lmprog as lp


@lp.function
def qa(s, question, shots=""):
    s += lp.system("Answer briefly.")
    with s.user():
        s += shots + "Q: " + question
    s += lp.assistant(lp.gen("answer", max_tokens=4))


def echo(request):
    return str(request.prompt).split("Q: ")[-1].split("<|im_end|>")[0].upper()


def test_results_come_back_in_input_order():
    questions = [f"q{i}" for i in range(20)]
    states = qa.run_batch(
        [{"question": q} for q in questions], backend=FakeBackend(responder=echo), num_threads=4
    )
    assert [s["answer"] for s in states] == [q.upper() for q in questions]


def test_one_failing_program_does_not_stop_the_others():
    @lp.function
    def prog(s, i):
        if i == 3:
            raise ValueError("program 3 failed")
        s += f"item {'FAIL' if i == 5 else i} " + lp.gen("x", max_tokens=1)

    states = prog.run_batch([{"i": i} for i in range(8)], backend=FakeBackend(fail_on="FAIL"))
    assert isinstance(states[3].error(), ValueError)
    assert isinstance(states[5].error(), lp.BackendError)
    with pytest.raises(lp.BackendError):
        states[5]["x"]
    ok = [i for i in range(8) if i not in (3, 5)]
    assert all(states[i].error() is None and states[i]["x"] for i in ok)


def test_the_constant_prefix_is_cached_once_before_fanning_out():
    backend = FakeBackend()
    qa.run_batch([{"question": f"q{i}"} for i in range(5)], backend=backend)
    assert backend.prefixes == [
        "<|im_start|>system\nAnswer briefly.<|im_end|>\n<|im_start|>user\nQ: "
    ]
    assert all(r.prompt.startswith(backend.prefixes[0]) for r in backend.generations())


def test_arguments_equal_across_the_batch_are_part_of_the_prefix():
    backend = FakeBackend()
    shots = "Q: 1+1\nA: 2\n"
    qa.run_batch([{"question": f"q{i}", "shots": shots} for i in range(3)], backend=backend)
    assert backend.prefixes == [
        f"<|im_start|>system\nAnswer briefly.<|im_end|>\n<|im_start|>user\n{shots}Q: "
    ]


def test_no_prefix_for_a_single_item_or_an_untraceable_program():
    backend = FakeBackend()
    qa.run_batch([{"question": "only"}], backend=backend)

    @lp.function
    def formatted(s, q):
        s += f"{q}?" + lp.gen("a", max_tokens=1)

    formatted.run_batch([{"q": "a"}, {"q": "b"}], backend=backend)
    assert backend.prefixes == []


def test_batch_items_run_concurrently():
    backend = FakeBackend(rendezvous=8)  # each gen fails unless all eight are in flight at once
    states = within(
        30,
        lambda: qa.run_batch(
            [{"question": f"q{i}"} for i in range(8)], backend=backend, num_threads=8
        ),
    )
    assert [s.error() for s in states] == [None] * 8
    assert backend.max_active == 8


def test_sampling_defaults_apply_to_every_item_and_items_may_override():
    backend = FakeBackend()
    qa.run_batch(
        [{"question": "a"}, {"question": "b", "temperature": 0.7}], backend=backend, temperature=0
    )
    temps = sorted(r.params.temperature for r in backend.generations())
    assert temps == [0, 0.7]


def test_bad_batches_raise_at_the_call():
    backend = FakeBackend()
    with pytest.raises(TypeError, match="item 1"):
        qa.run_batch([{"question": "a"}, {"qestion": "b"}], backend=backend)
    with pytest.raises(TypeError, match="item 0"):
        qa.run_batch(["question"], backend=backend)
    with pytest.raises(TypeError, match="list of dicts"):
        qa.run_batch({"question": "a"}, backend=backend)
    for bad in (0, -1, "many", 1.5):
        with pytest.raises(ValueError, match="num_threads"):
            qa.run_batch([{"question": "a"}], backend=backend, num_threads=bad)
    assert backend.requests == []
    assert qa.run_batch([], backend=backend) == []


def test_progress_bar(capsys):
    qa.run_batch(
        [{"question": f"q{i}"} for i in range(6)], backend=FakeBackend(), progress_bar=True
    )
    assert "6/6" in capsys.readouterr().err
