"""Cheap batches are computed on the event loop; slow ones, and any after a slow one, on the thread."""

from workers.batching.inline import InlineCompute


def test_nothing_is_inline_before_the_warmup_has_measured_the_model():
    inline = InlineCompute(below_s=1e-3, warmup=3)
    for _ in range(2):
        inline.took(1e-5)
        assert not inline.inline()
    inline.took(1e-5)
    assert inline.inline()


def test_one_slow_batch_sends_the_next_ones_to_the_thread_until_the_average_comes_down():
    inline = InlineCompute(below_s=1e-3, warmup=1)
    inline.took(1e-4)
    assert inline.inline()
    inline.took(0.05)
    assert not inline.inline()
    steps = 0
    while not inline.inline():
        inline.took(1e-4)
        steps += 1
    assert 10 <= steps <= 20


def test_a_slow_model_never_goes_inline():
    inline = InlineCompute(below_s=1e-3, warmup=2)
    for _ in range(50):
        inline.took(2e-3)
    assert not inline.inline()
