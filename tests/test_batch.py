"""A list of runs as one batch: each item is its solo run (same seed), only the decoder forward is shared."""

from __future__ import annotations

import pytest
import torch

from diffusiongemma.dgemma import Knobs
from diffusiongemma.dgemma.constraints.constraint import Constraint
from diffusiongemma.dgemma.demo import colour_image
from diffusiongemma.dgemma.denoising.context import encode_context
from diffusiongemma.dgemma.denoising.resume import Advanced
from diffusiongemma.dgemma.denoising.run import prepare, run, run_batch
from diffusiongemma.dgemma.errors import Cancelled, InputError
from diffusiongemma.dgemma.steps.schedulers import Scheduling
from diffusiongemma.testing.batchcheck import differences, entropy_exact

PROMPTS = ("What is 2+2?", "Hi", "What is 13+29?", "Name a colour, and say why you like it in a few words.",
           "What is 7 times 8?", "Spell cat.", "What is 100-1? Answer with the number only, nothing else.", "2+3?")


@pytest.fixture
def forwards(request):
    """Batch size of every decoder forward (solo or batched) of the model the test names."""
    dm = request.getfixturevalue(request.param if hasattr(request, "param") else "demo_model")
    sizes = []
    handle = dm.model.register_forward_hook(lambda mod, args, kwargs, out: sizes.append(
        kwargs["decoder_input_ids"].shape[0]), with_kwargs=True)
    yield sizes
    handle.remove()


def both(dm, specs, max_batch=None, **batch_kw):
    """(solo results, batched results) of (prompt, knobs, options) specs, each prepared afresh."""
    solo = [run(prepare(dm, p, k, **o)) for p, k, o in specs]
    batched = run_batch([prepare(dm, p, k, **o) for p, k, o in specs], max_batch=max_batch, **batch_kw)
    return solo, batched


def assert_items_equal(dm, solo, batched, share=1.0):
    diffs = [differences(a, b, dm.token_strings) for a, b in zip(solo, batched)]
    same = sum(not d for d in diffs)
    assert same >= share * len(solo), [(i, d) for i, d in enumerate(diffs) if d]
    return same, sum(entropy_exact(a, b) for a, b in zip(solo, batched))


def test_a_hundred_mixed_items_equal_their_solo_runs(demo_model, forwards):
    specs = [(PROMPTS[i % 8] + " " * (i // 8 % 3),
              Knobs(seed=i, thinking=bool(i % 2), gen_length=32 * (1 + i % 3), num_inference_steps=8 + i % 5,
                    confidence=0.0 if i % 7 == 0 else 0.005), {}) for i in range(104)]
    solo, batched = both(demo_model, specs[:4], max_batch=8)  # warm, then count
    forwards.clear()
    solo = [run(prepare(demo_model, p, k)) for p, k, _ in specs]
    alone = len(forwards)
    forwards.clear()
    batched = run_batch([prepare(demo_model, p, k) for p, k, _ in specs], max_batch=8)
    same, exact = assert_items_equal(demo_model, solo, batched, share=0.99)
    assert exact == len(specs)  # on the CPU each row's experts run alone: no last-bit drift for self-conditioning
    assert max(forwards) == 8 and len(forwards) < alone / 3, (len(forwards), alone)
    print(f"identical items {same}/{len(specs)}, entropy to the last bit {exact}, forwards {len(forwards)} "
          f"batched vs {alone} solo")


def test_items_on_the_random_tiny_model_with_images(tiny_model):
    red, blue = colour_image("red", 64, 64), colour_image("blue", 48, 80)
    specs = [(PROMPTS[i % 8], Knobs(seed=100 + i, thinking=i % 3 == 0, gen_length=16, num_inference_steps=4,
                                    confidence=0.0), {"image": (None, red, blue)[i % 3]}) for i in range(12)]
    specs.append(("", Knobs(seed=1, gen_length=8, num_inference_steps=3), {"image": red}))  # an image alone
    assert_items_equal(tiny_model, *both(tiny_model, specs))


def test_items_on_kv_contexts_of_any_length(demo_model):
    short = encode_context(demo_model, "Numbers are words.")
    longer = encode_context(demo_model, "The answer follows. " * 20)
    past_window = encode_context(demo_model, "one two three four five six seven " * 90)  # > 512: sliding layers cap
    assert past_window.length > 600
    specs = [(PROMPTS[i % 8], Knobs(seed=i, gen_length=64, num_inference_steps=8),
              {"context": (short, longer, past_window, None)[i % 4], "advance_context": i % 2 == 0})
             for i in range(12)]
    specs.append(("", Knobs(seed=3, gen_length=32, num_inference_steps=6), {"context": longer}))  # pure injection
    solo, batched = both(demo_model, specs)
    assert_items_equal(demo_model, solo, batched)
    for a, b in zip(solo, batched):
        assert (a.context is None) == (b.context is None)
        if a.context is not None:
            assert a.context.token_ids == b.context.token_ids
            follow = [run(prepare(demo_model, "And then?", Knobs(seed=9, gen_length=32), context=c.context))
                      for c in (a, b)]
            assert not differences(*follow)


@pytest.mark.parametrize("forwards", ["tiny_model"], indirect=True)
def test_pins_schedulers_windows_and_mixed_knobs_in_one_batch(tiny_model, forwards):
    ddim = Scheduling("discrete_ddim", corrector_steps=1, temperature=0.7)
    kinds = [Advanced(pins="ab___{2}cd\n20: xyz"), Advanced(Scheduling("block_refinement", threshold=0.5)),
             Advanced(ddim), Advanced(end_step=3), None, Advanced(start_step=2, pins="3: q")]
    specs = [(PROMPTS[i % 8], Knobs(seed=7 * i, gen_length=(8, 16, 40)[i % 3], num_inference_steps=(5, 6)[i % 2],
                                    t_min=0.3 + 0.05 * (i % 3), thinking=i % 4 == 1),
              {"advanced": kinds[i % 6]}) for i in range(12)]
    forwards.clear()
    solo, batched = both(tiny_model, specs)
    assert_items_equal(tiny_model, solo, batched)
    assert max(forwards) > 1  # the mixed knobs ran together
    paused = [(i, r) for i, r in enumerate(batched) if r.state.paused]
    assert paused
    resumed = [(PROMPTS[i % 8], specs[i][1], {"advanced": Advanced(start_step=3, resume=r.state.resume)})
               for i, r in paused]
    assert_items_equal(tiny_model, *both(tiny_model, resumed))


def test_constrained_items_batch_with_free_ones(demo_model):
    yes_no = Constraint("choice", "yes\nno")
    specs = [(PROMPTS[i % 8], Knobs(seed=i, gen_length=32, num_inference_steps=8),
              {"constraint": yes_no if i % 2 else None}) for i in range(6)]
    solo, batched = both(demo_model, specs)
    assert_items_equal(demo_model, solo, batched)
    assert all(r.state.constraint["satisfied"] for r in batched[1::2])


def test_max_batch_splits_a_long_list(demo_model, forwards):
    specs = [(PROMPTS[i], Knobs(seed=i, gen_length=32, num_inference_steps=6, confidence=0.0), {}) for i in range(7)]
    forwards.clear()
    solo, batched = both(demo_model, specs, max_batch=3)
    assert_items_equal(demo_model, solo, batched)
    assert forwards[len(specs) * 6:] == [3] * 6 + [3] * 6 + [1] * 6  # solo first, then 3 + 3 + 1 items


def test_a_batched_forward_groups_each_rows_experts_alone(demo_model, monkeypatch):
    """The experts of a batch compute each row as its solo call does, grouped matmul by grouped matmul; a
    batched grouping (more tokens per expert) rounds otherwise, and the probe refuses it."""
    from diffusiongemma.dgemma.denoising import batch_experts

    assert batch_experts.experts_by_row(demo_model.model)  # as a batched forward gives it (idempotent)
    layer = demo_model.model.model.decoder.layers[0]
    experts, n = layer.experts, demo_model.canvas_length
    gen = torch.Generator().manual_seed(5)
    hidden = torch.randn(8 * n, layer.router.proj.in_features, generator=gen)
    with torch.no_grad():
        _, weights, index = layer.router(hidden * torch.linspace(0.2, 3, 8 * n)[:, None])
        alone = torch.cat([experts(hidden[i:i + n], index[i:i + n], weights[i:i + n]) for i in range(0, 8 * n, n)])
        with batch_experts.rows_of(n):
            grouped = experts(hidden, index, weights)
        assert batch_experts._fast[experts] and torch.equal(grouped, alone)
        batch_experts._fast[experts] = False  # the layer's own forward row by row
        with batch_experts.rows_of(n):
            assert torch.equal(experts(hidden, index, weights), alone)
        del batch_experts._fast[experts]
        monkeypatch.setattr(batch_experts, "_grouped_rows", lambda module, h, i, w, n: module.__class__.forward(
            module, h, i, w))
        # one grouping for all rows is not a row's: the probe's rows (groups of one and two tokens) round
        # otherwise on every CPU seen; whether these random rows do depends on the CPU's kernels
        assert not batch_experts._probe(experts, experts.forward, n)


def test_items_leave_at_once_and_the_next_take_their_place(demo_model, forwards, monkeypatch):
    """A list longer than max_batch streams: an item that ends is read and its cache freed before the next
    step, and a waiting item joins, so the batch stays full and at most max_batch caches are alive."""
    import gc
    import weakref

    from diffusiongemma.dgemma.denoising import run as run_module

    caches, starts = {}, run_module.fresh_start

    def fresh_start(req):
        start = starts(req)
        caches[len(caches)] = weakref.ref(start.cache)
        return start

    monkeypatch.setattr(run_module, "fresh_start", fresh_start)
    specs = [(PROMPTS[i % 8], Knobs(seed=i, gen_length=32 * (1 + i % 2), num_inference_steps=4 + i % 5,
                                    confidence=0.0), {}) for i in range(10)]
    settled, alive, kept = {}, [], []

    def frame(index, _):
        alive.append((index, sum(ref() is not None for ref in caches.values())))
        kept.extend(j for j, clock in settled.items() if clock < len(forwards) and caches[j]() is not None)

    gc.disable()  # what is freed must be freed by reference counting, at once
    try:
        batched = run_batch([prepare(demo_model, p, k) for p, k, _ in specs], max_batch=3, on_frame=frame,
                            on_settled=lambda i: settled.setdefault(i, len(forwards)))
    finally:
        gc.enable()
    assert sorted(settled) == list(range(10)) and list(settled) != sorted(settled)  # short items left first
    assert not kept  # no ended item's cache outlived the next forward
    assert max(n for _, n in alive) <= 3 + 1  # an item that ended this step may be alive still
    last_joined = next(k for k, (i, _) in enumerate(alive) if i == 9)
    assert min(n for _, n in alive[:last_joined]) >= 3  # the batch stayed full until the list ran out
    assert max(forwards) == 3
    assert_items_equal(demo_model, [run(prepare(demo_model, p, k)) for p, k, _ in specs], batched)


def test_interrupt_stops_the_whole_batch_within_one_step(demo_model, forwards):
    reqs = [prepare(demo_model, p, Knobs(seed=i, gen_length=64, num_inference_steps=10)) for i, p in
            enumerate(PROMPTS)]
    frames = []
    forwards.clear()
    with pytest.raises(Cancelled):
        run_batch(reqs, on_frame=lambda i, f: frames.append(i), should_cancel=lambda: len(forwards) >= 3)
    assert len(forwards) == 3 and forwards[0] == len(PROMPTS)  # asked after the third step: no fourth forward
    assert sorted(set(frames)) == list(range(len(PROMPTS))) and len(frames) == 3 * len(PROMPTS)


def test_bad_batches_are_refused_before_any_work(demo_model, tiny_model, no_model_work):
    good = prepare(demo_model, "Hi", Knobs(gen_length=32))
    with pytest.raises(InputError, match="item 1 is a str"):
        run_batch([good, "Hi"])
    with pytest.raises(InputError, match="item 1 uses another model"):
        run_batch([good, prepare(tiny_model, "Hi", Knobs(gen_length=8))])
    for bad in (0, -2, 1.5, True):
        with pytest.raises(InputError, match="max_batch"):
            run_batch([good], max_batch=bad)


def test_one_item_is_exactly_the_solo_path(demo_model):
    req = prepare(demo_model, "What is 2+2?", Knobs(seed=4, gen_length=32))
    (batched,), alone = run_batch([req]), run(prepare(demo_model, "What is 2+2?", Knobs(seed=4, gen_length=32)))
    assert not differences(alone, batched) and entropy_exact(alone, batched)
    assert torch.equal(torch.tensor(batched.state.raw_ids), torch.tensor(alone.state.raw_ids))


def test_the_default_batch_is_what_fits_in_free_memory(demo_model, forwards, monkeypatch):
    from diffusiongemma.dgemma.denoising import batch
    from diffusiongemma.dgemma.loading import preflight

    per_item = batch.item_bytes(demo_model, 100)
    assert per_item >= 26 * demo_model.canvas_length * demo_model.vocab_size  # the device plan's step bytes
    assert batch.item_bytes(demo_model, 1000) > per_item  # the cache counts too
    assert batch.default_max_batch(demo_model, 100, 0) == 1
    assert batch.default_max_batch(demo_model, 100, 10**15) == batch.MAX_BATCH_CAP
    assert batch.default_max_batch(demo_model, 100, int(per_item * 3 / batch.MEMORY_SHARE)) == 3
    monkeypatch.setattr(preflight, "free_ram", lambda: int(batch.item_bytes(demo_model, 200) * 2 / batch.MEMORY_SHARE))
    specs = [(PROMPTS[i], Knobs(seed=i, gen_length=32, num_inference_steps=3, confidence=0.0), {}) for i in range(5)]
    forwards.clear()
    batched = run_batch([prepare(demo_model, p, k) for p, k, _ in specs])
    assert forwards == [2] * 3 + [2] * 3 + [1] * 3
    assert not any(differences(run(prepare(demo_model, p, k)), b) for (p, k, _), b in zip(specs, batched))


def test_half_precision_batches_of_mixed_lengths_are_exact_to_the_bit():
    """A masked batch rounds attention differently and moved tokens at bfloat16; rows attend alone now."""
    from diffusiongemma.dgemma import load_model
    from diffusiongemma.dgemma.demo import DEMO_DIR

    dm = load_model(str(DEMO_DIR), device="cpu", dtype="bfloat16")
    specs = [(PROMPTS[i % 8], Knobs(seed=i, gen_length=32, num_inference_steps=12), {}) for i in range(16)]
    solo, batched = both(dm, specs, max_batch=8)
    same, exact = assert_items_equal(dm, solo, batched)
    assert exact == len(specs)


def test_the_batch_an_item_runs_in_never_changes_it(demo_model):
    """The same 16 requests in batches of 1, 3, 8 and 16: the same tokens and every reading, entropy to the bit."""
    requests = [prepare(demo_model, PROMPTS[i % 8] + " " * (i % 3),
                        Knobs(seed=i, thinking=bool(i % 2), gen_length=32 * (1 + i % 2), num_inference_steps=6 + i % 4))
                for i in range(16)]
    runs = {size: run_batch(requests, max_batch=size) for size in (1, 3, 8, 16)}
    for size in (3, 8, 16):
        for a, b in zip(runs[1], runs[size]):
            assert not differences(a, b, demo_model.token_strings) and entropy_exact(a, b), size
