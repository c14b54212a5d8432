"""Compile time and per-step mask time of the three constraint libraries on this pack's tokenizers.

Evidence for decision 0017. Each library compiles the same JSON Schema for the demo model's
tokenizer, the tiny checkpoints' and the real-vocabulary tiny one (262,144 tokens); then the
mask of allowed tokens is computed at every step of one valid answer. Times are CPU seconds of
this process (the median mask over the steps). A library that is not installed is skipped.

    python benchmarks/constraint_libraries.py
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from headless import load_pack  # noqa: E402

load_pack()
from diffusiongemma.dgemma.demo import DEMO_DIR  # noqa: E402
from diffusiongemma.testing.tiny_tokenizer import build_tokenizer  # noqa: E402

SCHEMA = {"type": "object", "properties": {
    "name": {"type": "string", "pattern": "^[a-z]{2,8}$"},
    "age": {"type": "integer", "minimum": 0, "maximum": 120},
    "colour": {"enum": ["red", "green", "blue"]},
    "tags": {"type": "array", "items": {"type": "string", "maxLength": 6}, "minItems": 1, "maxItems": 3},
    "home": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 10}}, "required": ["city"]}},
    "required": ["name", "age", "colour", "tags", "home"], "additionalProperties": False}
ANSWER = '{"name":"ada","age":36,"colour":"red","tags":["x","yz"],"home":{"city":"rome"}}'


def cpu(fn):
    t = time.process_time()
    out = fn()
    return out, time.process_time() - t


def outlines_core_case(tok, ids):
    import outlines_core as oc

    from diffusiongemma.dgemma.constraints.vocab import token_bytes

    def compile_():
        vocab = oc.Vocabulary(tok.eos_token_id, token_bytes(tok))
        return oc.Index(oc.json_schema.build_regex_from_schema(json.dumps(SCHEMA)), vocab)

    index, seconds = cpu(compile_)
    state, masks = index.get_initial_state(), []
    for i in ids:
        masks.append(cpu(lambda s=state: index.get_allowed_tokens(s))[1])
        state = index.get_next_state(state, i)
    return seconds, masks


def llguidance_case(tok, ids):
    import llguidance
    import llguidance.hf
    import llguidance.numpy as lnp

    def compile_():
        lltok = llguidance.hf.from_tokenizer(tok)
        return lltok, llguidance.LLMatcher(lltok, llguidance.LLMatcher.grammar_from_json_schema(json.dumps(SCHEMA)))

    (lltok, matcher), seconds = cpu(compile_)
    mask, masks = lnp.allocate_token_bitmask(1, lltok.vocab_size), []
    for i in ids:
        masks.append(cpu(lambda: lnp.fill_next_token_bitmask(matcher, mask, 0))[1])
        matcher.consume_token(i)
    return seconds, masks


def xgrammar_case(tok, ids):
    import xgrammar as xgr

    def compile_():
        info = xgr.TokenizerInfo.from_huggingface(tok, vocab_size=len(tok))
        return info, xgr.GrammarCompiler(info, max_threads=1).compile_json_schema(json.dumps(SCHEMA))

    (info, compiled), seconds = cpu(compile_)
    matcher, mask, masks = xgr.GrammarMatcher(compiled), xgr.allocate_token_bitmask(1, info.vocab_size), []
    for i in ids:
        masks.append(cpu(lambda: matcher.fill_next_token_bitmask(mask))[1])
        matcher.accept_token(i)
    return seconds, masks


def main() -> None:
    from transformers import AutoTokenizer

    tokenizers = {"demo": AutoTokenizer.from_pretrained(str(DEMO_DIR)), "tiny": build_tokenizer(),
                  "real-vocab": build_tokenizer(262_144)}
    for name, tok in tokenizers.items():
        ids = tok(ANSWER, add_special_tokens=False)["input_ids"]
        for lib, case in (("outlines-core", outlines_core_case), ("llguidance", llguidance_case),
                          ("xgrammar", xgrammar_case)):
            try:
                seconds, masks = case(tok, ids)
            except ImportError as err:
                print(f"{name:10s} {lib:13s} not installed ({err.name})")
                continue
            print(f"{name:10s} {lib:13s} vocab={len(tok):7d} compile_cpu_s={seconds:8.3f} "
                  f"mask_cpu_ms_median={1000 * statistics.median(masks):7.3f} steps={len(masks)}", flush=True)


if __name__ == "__main__":
    main()
