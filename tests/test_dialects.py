"""The dialect registry: each dialect recognises its card and builds a Backend; the loader's tooltip, the
refusal of other servers and the README's table follow the registry; and the recipe of
docs/architecture.md ("Adding a remote dialect") followed for a toy dialect on a fake server."""

from __future__ import annotations

import math

import pytest
from conftest import REPO
from executor import call
from fake_engine import engine, sse

from diffusiongemma import NODE_CLASS_MAPPINGS
from diffusiongemma.dgemma.backend import LOCAL, Backend
from diffusiongemma.remote import dialects
from diffusiongemma.remote.connect import not_a_diffusion_engine
from diffusiongemma.remote.http import RemoteError
from diffusiongemma.remote.text import TextBackend

Loader, Sampler = NODE_CLASS_MAPPINGS["DGemmaRemoteLoader"], NODE_CLASS_MAPPINGS["DGemmaSampler"]
KNOBS = dict(seed=7, num_inference_steps=8, t_min=0.4, t_max=0.8, entropy_bound=0.1, confidence=0.005,
             gen_length=64, thinking=False)


@pytest.mark.parametrize("card, dialect", [
    ({"id": "m", "dgemma": {}}, "pack"),
    ({"id": "m", "dgemma": {}, "owned_by": "vllm"}, "pack"),              # the pack's own card comes first
    ({"id": "m", "owned_by": "vLLM"}, "vllm"), ({"id": "m", "owned_by": "sglang"}, "vllm"),
    ({"id": "diffusiongemma-e4b", "owned_by": "vllm"}, "vllm"),           # a signature beats a name
    ({"id": "m", "owned_by": "vllm", "diffusion_canvas": 32}, "vllm"),
    ({"id": "m", "owned_by": "unsloth"}, "diffusion_frame"),
    ({"id": "x", "root": "Diffusion-Gemma-26B"}, "diffusion_frame"), ({"id": "m", "diffusion_canvas": 32},
                                                                       "diffusion_frame"),
    ({"id": "m", "dgemma": "not an object"}, None), ({"id": "qwen", "owned_by": "llamacpp"}, None),
])
def test_each_card_goes_to_the_dialect_surest_of_it(card, dialect):
    found = dialects.dialect_of(card)
    assert (found and found.name) == dialect


def test_every_backend_is_a_backend():
    from diffusiongemma.remote.http import Remote

    remote = Remote("http://127.0.0.1:1", "", "")
    assert isinstance(LOCAL, Backend)
    card = {"id": "m", "max_model_len": 64}
    for dialect in dialects.DIALECTS.values():
        if dialect.name != "pack":  # the pack's model reads the server's token table; its class is checked
            assert isinstance(dialect.model(remote, card, None).backend, Backend)
    from diffusiongemma.remote.pack import PackBackend

    assert isinstance(PackBackend(remote), Backend)


def _table(lines: list[str], header: str) -> list[list[str]]:
    """The cells of a README table's rows below `header`."""
    start = lines.index(header) + 2
    end = next(i for i in range(start, len(lines)) if not lines[i].startswith("|"))
    return [[cell.strip() for cell in line.strip("|").split(" | ")] for line in lines[start:end]]


def test_the_readme_tables_and_the_loader_name_every_registered_dialect_in_order():
    lines = REPO.joinpath("README.md").read_text(encoding="utf-8").splitlines()
    rows = [(server, name.strip("`")) for server, name, _ in _table(lines, "| server | dialect | what you see |")]
    assert rows == [(d.server, d.name) for d in dialects.DIALECTS.values()]
    readings = "| reading | " + " | ".join(f"`{name}`" for name in dialects.DIALECTS) + " |"
    assert _table(lines, readings)  # what each dialect reads: one column each
    tooltip = Loader.OUTPUT_TOOLTIPS[1]
    assert all(f"{d.name} ({d.carries})" in tooltip for d in dialects.DIALECTS.values())


# The recipe, step 1: the backend. A text dialect's backend says what its stream carries and leaves
# unknown, which knobs it sends, and reads each chunk; TextBackend does the request and the result.
class ToyBackend(TextBackend):
    """A toy engine that streams one committed canvas of text per chunk, in a `toy_canvas` field."""

    dialect, committed, canvas = "toy", True, "toy canvas"
    unknown = {"steps": "the toy streams canvases, not steps", "stopped_early": "the toy streams canvases",
               "converged": "the toy says nothing of it", "answer_tokens": "the toy counts no tokens"}
    sent = {"seed": "seed", "gen_length": "max_tokens"}
    not_sent = {name: "the toy has no such knob" for name in ("num_inference_steps", "t_min", "t_max",
                                                               "entropy_bound", "confidence", "thinking")}

    def most_blocks(self, knobs) -> int:
        return math.ceil(knobs.gen_length / 32)

    def take(self, stream, chunk) -> None:
        stream.take(chunk)
        if isinstance(chunk, dict) and isinstance(chunk.get("toy_canvas"), str):
            stream.frame(len(stream.frames), 0, chunk["toy_canvas"])

    def finish(self, stream, trace):
        values = {"converged": None, "committed_fraction": 1.0, "steps_used": None}
        return values, {"canvas_length": "the toy's card gives none"}, {"canvas_length": None}


# Step 2: the row. How its card is recognised (SIGNED: the engine's own mark), the model it builds,
# and the words the README's table, the loader's tooltip and the refusal of other servers use.
TOY = dialects.Dialect("toy", lambda card: dialects.SIGNED if dialects.owner(card) == "toy-engine" else 0,
                       dialects.text_dialect(ToyBackend), server="the toy engine", carries="toy canvases",
                       mark="not the toy engine", serve_with="the toy engine")


def chunk(**fields) -> dict:
    return {"object": "chat.completion.chunk", "model": "toy-model", **fields}


def test_a_toy_dialect_registered_as_the_recipe_says_connects_and_runs(monkeypatch):
    card = {"object": "list", "data": [{"id": "toy-model", "object": "model", "owned_by": "toy-engine"}]}
    stream = sse([chunk(choices=[{"index": 0, "delta": {"content": "seven"}, "finish_reason": None}],
                        toy_canvas="seven, the toy says"),
                  chunk(choices=[{"index": 0, "delta": {"content": "."}, "finish_reason": "stop"}], toy_canvas="."),
                  "[DONE]"])
    with engine(card, stream) as (url, bodies):
        with pytest.raises(RemoteError, match="'toy-model' owned by 'toy-engine'"):  # not registered: refused
            call(Loader, url=url)
        monkeypatch.setitem(dialects.DIALECTS, "toy", TOY)  # step 3: register(TOY) where the pack loads
        (model, dialect), _ = call(Loader, url=url)
        out, _ = call(Sampler, model=model, prompt="What is 3+4?", **KNOBS)
    text, state, trace = out[:3]
    assert dialect == "toy" and isinstance(model.backend, ToyBackend) and not model.vision
    assert text == "seven." and len(trace) == 2 and trace.committed.all()
    assert bodies[0]["seed"] == 7 and bodies[0]["max_tokens"] == 64
    assert "steps" in state.readings.unknown and "toy" in state.readings.engine
    assert "not the toy engine" in str(not_a_diffusion_engine("u", {"id": "x"}))
    assert "toy (toy canvases)" in dialects.carried()
