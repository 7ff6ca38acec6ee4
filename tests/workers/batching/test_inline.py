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


def test_a_slow_model_does_not_go_inline():
    inline = InlineCompute(below_s=1e-3, warmup=2)
    for _ in range(50):
        inline.took(2e-3)
    assert not inline.inline()


def test_a_slow_model_is_probed_on_the_event_loop_ever_more_rarely():
    inline = InlineCompute(below_s=1e-3, warmup=2, probe_every=16, probe_every_max=256)
    for _ in range(2):
        inline.took(2e-3)
    probes = []
    for n in range(5000):
        on_loop = inline.inline()
        if on_loop:
            probes.append(n)
        inline.took(2e-3, inline=on_loop)
    gaps = [b - a for a, b in zip([-1, *probes], probes)]
    assert gaps[:5] == [16, 32, 64, 128, 256], gaps
    assert set(gaps[5:]) == {256}, gaps


def test_a_model_slow_only_on_the_thread_comes_back_to_the_event_loop_after_a_probe():
    # On the thread, a batch waits for the GIL too: it looks slow there while the loop is busy.
    inline = InlineCompute(below_s=1e-3, warmup=2, probe_every=16)
    for _ in range(2):
        inline.took(6e-3)
    asked = 0
    while not inline.inline():
        inline.took(6e-3)
        asked += 1
    assert asked == 15
    inline.took(1e-4, inline=True)  # what it takes on the loop
    assert all(inline.inline() for _ in range(10))
