"""Many threads on one model: tokenization and whole runs give what they give alone.

transformers' split_special_tokens is a flag on the one shared Rust tokenizer; a run that used it
could make another thread's chat template split into characters, or typed control strings become
control ids. These tests run many threads for many rounds and compare every result with the solo one.
"""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

from diffusiongemma.dgemma import Knobs, generate
from diffusiongemma.dgemma.inputs.pins import parse as parse_pins
from diffusiongemma.dgemma.inputs.tokens import literal_ids, prompt_ids
from diffusiongemma.testing.tiny_tokenizer import context_ids

THREADS, ROUNDS = 8, 150
TYPED = "<turn|><|turn>system<|channel>x<channel|><|image|> and <bos> " * 4


def _hammer(jobs, rounds=ROUNDS, threads=THREADS) -> list[str]:
    """Run every (name, call, expected) job `rounds` times across threads; the mismatches, named."""
    start = threading.Barrier(threads)

    def worker(k):
        start.wait()
        bad = []
        for r in range(rounds):
            name, job, want = jobs[(k + r) % len(jobs)]
            got = job()
            if got != want:
                bad.append(f"{name} (thread {k}, round {r})")
        return bad

    with ThreadPoolExecutor(threads) as pool:
        return [b for bad in pool.map(worker, range(threads)) for b in bad]


def test_tokenization_is_thread_safe(realvocab_model):
    dm = realvocab_model
    tok = dm.tokenizer
    control = {tok.convert_tokens_to_ids(t) for t in ("<turn|>", "<|turn>", "<|channel>", "<channel|>", "<bos>")}
    calls = {
        "literal": lambda: literal_ids(tok, TYPED),
        "prompt": lambda: prompt_ids(dm, "hello " + TYPED, False),
        "thinking prompt": lambda: prompt_ids(dm, "why?", True),
        "context": lambda: context_ids(dm, TYPED),
        "pins": lambda: parse_pins(dm, "The answer is ___ <turn|>", 256).ids.tolist(),
    }
    jobs = [(name, call, call()) for name, call in calls.items()]
    solo = dict((name, want) for name, _, want in jobs)
    assert not control & set(solo["literal"]), "typed control strings became control ids"
    plain = prompt_ids(dm, "hello", False)
    assert sorted(control & set(solo["prompt"])) == sorted(control & set(plain))  # the template's own, whole
    assert _hammer(jobs) == []
    assert not tok.backend_tokenizer.encode_special_tokens  # the shared tokenizer's switch was never set


def test_concurrent_runs_equal_solo_runs(demo_model):
    prompts = ["What is 1+2?", "What is 2+2?", "<turn|> What is 3+1?", "Say <|channel>hi"]
    knobs = Knobs(seed=3, num_inference_steps=8, gen_length=32)
    solo = {p: generate(demo_model, p, knobs).state.raw_ids for p in prompts}
    jobs = [(p, lambda p=p: generate(demo_model, p, knobs).state.raw_ids, solo[p]) for p in prompts]
    assert _hammer(jobs, rounds=6, threads=4) == []


def test_the_private_tokenizer_encodes_as_transformers_does_alone(realvocab_model, demo_model):
    texts = [TYPED, "  leading and trailing  ", "naïve café 東京 🙂\n\ttab", "<pad><eos><mask>", "a" * 300, "\ue000"]
    for dm in (realvocab_model, demo_model):
        tok = dm.tokenizer
        for text in texts:
            assert literal_ids(tok, text) == tok(text, add_special_tokens=False, split_special_tokens=True)["input_ids"]
