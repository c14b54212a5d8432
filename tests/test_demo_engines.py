"""The demo checkpoint as other engines need it: vLLM's config field, a GGUF-convertible tokenizer,
and not one token id moved by either."""

from __future__ import annotations

import hashlib
import importlib.util
import json
import shutil

from conftest import REPO
from transformers import AutoTokenizer

from diffusiongemma.dgemma.demo import DEMO_DIR, IMAGE_QUESTION, WORDS

IDS_BEFORE = "a3b50ea5784c8be9"  # sha256 of the ids below, taken with the tokenizer before the merge was added


def demo_texts() -> list[str]:
    texts = []
    for a in range(10):
        for b in range(10):
            thought = f"<|channel>thought\n{a}+{b}={a + b}<channel|>{WORDS[a + b]}"
            texts += [f"What is {a}+{b}?", f"a={a}, b={b}.", thought, WORDS[a + b]]
    return texts + ["What is a+b?", IMAGE_QUESTION, "What is 3+4?", "Paris is the capital of France.",
                    "The answer is ___.", "hello  world\n\n x"]


def test_the_demo_token_ids_did_not_move():
    tok = AutoTokenizer.from_pretrained(str(DEMO_DIR))
    texts = demo_texts()
    ids = [tok.encode(t, add_special_tokens=False) for t in texts]
    for thinking in (False, True):
        for t in texts[:40:4] + ["What is a+b?", IMAGE_QUESTION]:
            ids.append(tok.apply_chat_template([{"role": "user", "content": t}], add_generation_prompt=True,
                                               tokenize=True, return_dict=True, enable_thinking=thinking)["input_ids"])
    assert hashlib.sha256(json.dumps(ids).encode()).hexdigest()[:16] == IDS_BEFORE
    assert len(tok) == 466  # the model's vocabulary: no id was added


def test_the_merge_exists_and_can_never_apply():
    spec = json.loads((DEMO_DIR / "tokenizer.json").read_text())
    vocab, merges = spec["model"]["vocab"], spec["model"]["merges"]
    assert merges and all(a in vocab and b in vocab and a + b in vocab for a, b in merges)
    tok = AutoTokenizer.from_pretrained(str(DEMO_DIR))
    for a, b in merges:  # its halves are special tokens: split out before the BPE model sees any text
        assert tok.encode(a + b, add_special_tokens=False) == [vocab[a], vocab[b]]


def test_vllm_reads_the_soft_tokens_per_image():
    config = json.loads((DEMO_DIR / "config.json").read_text())
    soft = json.loads((DEMO_DIR / "preprocessor_config.json").read_text())["max_soft_tokens"]
    assert config["vision_config"]["default_output_length"] == soft


def test_the_tool_is_idempotent(tmp_path):
    spec = importlib.util.spec_from_file_location("demo_for_engines", REPO / "tools" / "demo_for_engines.py")
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    copy = shutil.copytree(DEMO_DIR, tmp_path / "demo", ignore=shutil.ignore_patterns("*.safetensors"))
    tool.main([str(copy)])
    for name in ("config.json", "tokenizer.json", "tokenizer_config.json"):
        assert (copy / name).read_text() == (DEMO_DIR / name).read_text(), name
