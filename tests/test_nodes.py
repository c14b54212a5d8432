"""Every node called as ComfyUI's executor calls it, against the real demo and tiny models."""

from __future__ import annotations

import html
import json
import re
from types import SimpleNamespace

import fakecomfy
import pytest
import torch
from conftest import REPO
from executor import call

from diffusiongemma import NODE_CLASS_MAPPINGS, NODE_DISPLAY_NAME_MAPPINGS, WEB_DIRECTORY
from diffusiongemma.dgemma.inputs.tokens import frame_texts
from diffusiongemma.dgemma.readouts.images import Asked, render_images
from diffusiongemma.nodes import host
from diffusiongemma.nodes.decide import DECIDE_OUTPUTS
from diffusiongemma.nodes.loader import model_choices
from diffusiongemma.nodes.sampler import SAMPLER_OUTPUTS
from diffusiongemma.nodes.schema import Output

Loader, Sampler, Denoise = (NODE_CLASS_MAPPINGS[n] for n in ("DGemmaLoader", "DGemmaSampler", "DGemmaDenoise"))
Encode, Trace, RunLog = (NODE_CLASS_MAPPINGS[n] for n in ("DGemmaEncode", "DGemmaTrace", "DGemmaRunLogWriter"))
Advanced, Decide = NODE_CLASS_MAPPINGS["DGemmaSamplerAdvanced"], NODE_CLASS_MAPPINGS["DGemmaDecide"]
KNOBS = dict(seed=3, num_inference_steps=48, t_min=0.4, t_max=0.8, entropy_bound=0.1, confidence=0.005,
             gen_length=32, thinking=False)


def test_registry_keeps_the_original_names_and_documents_every_socket():
    assert set(NODE_CLASS_MAPPINGS) == {"DGemmaLoader", "DGemmaSampler", "DGemmaDenoise", "DGemmaEncode",
                                        "DGemmaTrace", "DGemmaRunLogWriter", "DGemmaSamplerAdvanced",
                                        "DGemmaRemoteLoader", "DGemmaPromptList", "DGemmaDecide",
                                        "DGemmaJoinTexts", "DGemmaLoraLoader"}
    assert set(NODE_DISPLAY_NAME_MAPPINGS) == set(NODE_CLASS_MAPPINGS)
    assert (REPO / WEB_DIRECTORY / "live_view.js").is_file()
    for name, cls in NODE_CLASS_MAPPINGS.items():
        assert cls.CATEGORY == "DiffusionGemma" and cls.DESCRIPTION, name
        assert len(cls.OUTPUT_TOOLTIPS) == len(cls.RETURN_TYPES) == len(cls.RETURN_NAMES), name
        spec = cls.INPUT_TYPES()
        for group in ("required", "optional"):
            for inp, (_kind, *opts) in spec.get(group, {}).items():
                assert opts and opts[0].get("tooltip"), f"{name}.{inp} has no tooltip"
    assert Sampler.RETURN_TYPES == ("STRING", "DGEMMA_CANVAS_STATE", "DGEMMA_CANVAS_TRACE", "STRING", "IMAGE",
                                    "DGEMMA_RUN_CONFIG")
    assert Sampler.RETURN_NAMES == ("text", "canvas_state", "canvas_trace", "frames", "images", "run_config")
    assert Denoise.RETURN_TYPES[:6] == Sampler.RETURN_TYPES
    required = Sampler.INPUT_TYPES()["required"]
    assert list(required) == ["model", "prompt", "seed", "num_inference_steps", "t_min", "t_max", "entropy_bound",
                              "confidence", "gen_length", "thinking"]
    assert required["seed"][1]["max"] == 2**64 - 1 and required["num_inference_steps"][1]["default"] == 48
    assert list(Loader.INPUT_TYPES()["required"]) == ["quant"]


# Saved workflows link outputs by slot: a slot keeps its name (pinned above) and its row's getter reads what
# that name says, so a socket that moved, or a getter that reads another field, fails here.
READS = {"text": "text", "canvas_state": "state", "canvas_trace": "trace", "run_config": "config",
         "kv_cache": "context"}
DECIDE_NAMES = ("choice", "probabilities", "chart", "trace", "canvas_state", "canvas_trace", "frames", "run_config")


def test_every_output_slot_reads_what_its_name_says():
    result = SimpleNamespace(**{field: f"<{field}>" for field in READS.values()})
    for node in (Sampler, Denoise, Advanced):
        assert node.RETURN_NAMES[:6] == Sampler.RETURN_NAMES and node.RETURN_NAMES[6:] == (
            ("kv_cache",) if node is Denoise else ())
        assert tuple(row.name for row in node.OUTPUTS) == node.RETURN_NAMES
        assert node.ON_DEMAND == ("frames", "images")
        for slot, row in enumerate(node.OUTPUTS):
            if not row.on_demand:
                assert row.get(None, result) == f"<{READS[row.name]}>", (node.__name__, slot, row.name)
    assert Decide.RETURN_NAMES == DECIDE_NAMES
    decision = SimpleNamespace(choice="<choice>", run=result)
    model = SimpleNamespace(token_strings=())
    for slot, name in ((0, "choice"), (4, "state"), (5, "trace"), (7, "config")):
        assert DECIDE_OUTPUTS[slot].get(model, decision) == f"<{name}>", slot


@pytest.fixture(scope="module")
def demo(demo_model):
    return demo_model


def test_loader_defaults_to_the_demo_model_without_real_weights():
    assert model_choices()[0] == "diffusiongemma-demo"
    (model,), _ = call(Loader, quant="none")
    assert model.source.endswith("demo_model") and model.device == "cpu"
    with pytest.raises(ValueError, match="single folder name"):
        call(Loader, quant="none", model="../secrets")
    with pytest.raises(ValueError, match="not a folder with config.json"):
        call(Loader, quant="none", model="missing-folder")


def test_loader_lists_checkpoint_folders_under_the_model_folder(tmp_path, tiny_dir):
    with fakecomfy.installed(tmp_path) as comfy:
        host.register_model_folder()
        root = comfy.models_dir / "diffusiongemma"
        (root / "real-26b").mkdir(parents=True)
        (root / "real-26b" / "config.json").write_text("{}")
        (root / "not-a-checkpoint").mkdir()
        (root / "tiny").symlink_to(tiny_dir)
        choices = Loader.INPUT_TYPES()["optional"]["model"][0]
        assert choices[:3] == ["real-26b", "tiny", "diffusiongemma-demo"]
        (model,), _ = call(Loader, quant="none", model="tiny")
        assert model.source == str(root / "tiny")


def test_sampler_outputs_match_their_declaration(demo):
    (text, state, trace, frames, images, config), _ = call(Sampler, model=demo, prompt="What is 3+4?", **KNOBS)
    assert text == "seven" and state.turn_closed and state.finished_honestly
    assert len(frames) == len(trace) == images.shape[0] == state.steps_used > 1
    assert frames[-1].startswith("seven<turn|><eos>")
    assert config.knobs.seed == 3 and config.model_source == demo.shown
    assert frames == frame_texts(trace, demo.token_strings)  # the on-demand slots, made: what their names say
    assert torch.equal(images, render_images(trace, demo.token_strings, Asked.of("What is 3+4?", None)))


def test_a_new_output_socket_is_one_row(demo):
    """The recipe of docs/architecture.md ("An output socket"), followed for a toy output."""
    row = Output("STRING", "steps_used", "Steps the run took.", False, lambda call, result: str(len(result.trace)))

    class Toy(Sampler):
        OUTPUTS = SAMPLER_OUTPUTS + (row,)

    out, _ = call(Toy, model=demo, prompt="What is 3+4?", **KNOBS)
    assert Toy.RETURN_NAMES == (*Sampler.RETURN_NAMES, "steps_used") and Toy.ON_DEMAND == Sampler.ON_DEMAND
    assert out[0] == "seven" and out[6] == str(len(out[2])) == str(out[1].steps_used)


def test_denoise_without_a_cache_is_the_sampler(demo):
    plain, _ = call(Sampler, model=demo, prompt="What is 4+4?", **KNOBS)
    denoised, _ = call(Denoise, model=demo, prompt="What is 4+4?", **KNOBS)
    assert denoised[0] == plain[0] and denoised[1] == plain[1]
    assert (denoised[2].ids == plain[2].ids).all() and denoised[3] == plain[3]
    assert denoised[6].length == len(plain[1].raw_ids) + len(demo_prompt_ids(demo, "What is 4+4?"))


def demo_prompt_ids(dm, prompt):
    from diffusiongemma.dgemma.inputs.tokens import prompt_ids

    return prompt_ids(dm, prompt, thinking=False)


def test_events_progress_and_payload_size(tmp_path, tiny_model):
    with fakecomfy.installed(tmp_path) as comfy:
        knobs = {**KNOBS, "confidence": 0.0, "num_inference_steps": 5, "gen_length": 256}
        (text, state, *_), _ = call(Sampler, model=tiny_model, prompt="hello", **knobs)
        assert "dgemma.done" not in [e for e, _, _ in comfy.events]  # done once ComfyUI holds the outputs
        comfy.registry.finish_progress("17")
    kinds = [e for e, _, _ in comfy.events]
    assert kinds[0] == "dgemma.start" and kinds[-1] == "dgemma.done"
    steps = comfy.steps()
    assert len(steps) == state.steps_used == 5 and all(sid == "client-1" for *_, sid in comfy.events)
    assert all(d["node"] == "17" and len(d["tokens"]) == 256 == len(d["state"]) for d in steps)
    assert max(len(json.dumps(d).encode()) for d in steps) <= 16 * 1024
    assert [v for v, _ in comfy.progress] == [1, 2, 3, 4, 5, 5] and comfy.progress[0][1] == 5


def test_the_progress_bar_moves_by_a_two_hundredth_or_a_tenth_of_a_second_and_always_ends(tmp_path):
    with fakecomfy.installed(tmp_path) as comfy:  # a long list: ten thousand steps in well under a second
        bar = host.Progress(10_000, "17")
        for value in range(1, 10_001):
            bar.to(value)
    values = [v for v, _ in comfy.progress]
    assert values[-1] == 10_000 and values == sorted(values) and 200 <= len(values) <= 230


def test_progress_text_under_the_node_each_step_then_the_answer(tmp_path, demo, monkeypatch):
    monkeypatch.setattr(host.ProgressText, "every", 0.0)  # no rate limit: one text per step
    advanced = NODE_CLASS_MAPPINGS["DGemmaSamplerAdvanced"]
    with fakecomfy.installed(tmp_path) as comfy:
        (text, state, *_), _ = call(Sampler, model=demo, prompt="What is 3+4?", **KNOBS)
        comfy.registry.finish_progress("17")
        lines = [shown(t) for node, t in comfy.text if node == "17"]
        assert len(lines) == state.steps_used + 1
        assert lines[0].startswith("block 1/≤1  step 1/≤48  T ") and "  committed " in lines[0].split("\n")[0]
        rate = f"{state.tokens_per_forward:.2f} tokens/forward"
        assert lines[-1] == f"done · {state.steps_used} steps · {rate}\n{text}" and text == "seven"
        comfy.text.clear()
        window = dict(KNOBS, scheduler="entropy_bound", pins="")
        (_, paused, *_), _ = call(advanced, model=demo, prompt="What is 3+4?", start_step=0, end_step=4, **window)
        comfy.registry.finish_progress("17")
        assert paused.paused and shown(comfy.text[-1][1]).startswith("paused after 4 steps")


def shown(markup: str) -> str:
    """What the frontend shows of a progress text: its span's text, markup decoded, line breaks kept."""
    inner = re.fullmatch(r'<span style="word-break:normal;overflow-wrap:anywhere">(.*)</span>', markup, re.S)
    assert inner and "<" not in inner[1] and ">" not in inner[1], markup  # nothing the page reads as a tag
    return html.unescape(inner[1].replace("  \n", "\n"))


def test_progress_text_wraps_at_spaces_and_shows_tokens_as_written(tmp_path, demo, monkeypatch):
    """ComfyUI 0.8 renders progress text as HTML in a break-all box (classic) or as Markdown (Vue): the
    text must restore word wrapping, escape what reads as markup and end each line in a hard break."""
    monkeypatch.setattr(host.ProgressText, "every", 0.0)
    with fakecomfy.installed(tmp_path) as comfy:
        (text, state, *_), _ = call(Sampler, model=demo, prompt="What is 3+4?", **KNOBS)
        comfy.registry.finish_progress("17")
        markup = [t for node, t in comfy.text if node == "17"]
    assert any("&lt;pad&gt;" in t for t in markup) and all("<pad>" not in t for t in markup)
    assert all(t.count("\n") == t.count("  \n") for t in markup)  # Markdown keeps only hard breaks
    rate = f"{state.tokens_per_forward:.2f} tokens/forward"
    assert shown(markup[-1]) == f"done · {state.steps_used} steps · {rate}\n{text}"
    odd = host.node_text("a *b* _c_ `d` [e](f) #g \\h ~i~ <eos> & 1 < 2\nline two")
    assert shown(odd) == "a *b* _c_ `d` [e](f) #g \\h ~i~ <eos> & 1 < 2\nline two"
    bare = re.sub(r"&#?\w+;", "", odd.split(">", 1)[1].rsplit("<", 1)[0])  # the text less its references
    assert not set(bare) & set("*_`[]~#\\<>&")  # nothing Markdown or HTML would read as syntax


def test_interrupt_stops_within_a_step_and_the_rerun_is_whole(tmp_path, demo):
    knobs = {**KNOBS, "confidence": 0.0, "num_inference_steps": 10}
    full, _ = call(Sampler, model=demo, prompt="What is 2+2?", **knobs)
    with fakecomfy.installed(tmp_path) as comfy:
        comfy.interrupt_after_steps = 3
        with pytest.raises(fakecomfy.InterruptProcessingException):
            call(Sampler, model=demo, prompt="What is 2+2?", **knobs)
        assert len(comfy.steps()) == 3
        assert comfy.events[-1][:2] == ("dgemma.done", {"node": "17", "status": "interrupted",
                                                       "message": "", "steps_used": 3})
        again, _ = call(Sampler, model=demo, prompt="What is 2+2?", **knobs)
    assert again[1] == full[1] and len(again[3]) == 10


def test_a_refused_run_leaves_the_view_alone_and_a_failing_run_says_so(tmp_path, demo, monkeypatch):
    with fakecomfy.installed(tmp_path) as comfy:
        with pytest.raises(ValueError, match="prompt is empty"):
            call(Sampler, model=demo, prompt="  ", **KNOBS)
        assert comfy.events == []  # refused before the start event: the view keeps the last run
        import diffusiongemma.dgemma.denoising.run as run

        def broken(*args, **kwargs):
            raise RuntimeError("CUDA out of memory")

        monkeypatch.setattr(run, "drive", broken)
        with pytest.raises(RuntimeError):
            call(Sampler, model=demo, prompt="What is 2+2?", **KNOBS)
    assert [e for e, _, _ in comfy.events] == ["dgemma.start", "dgemma.done"]
    assert comfy.events[-1][1]["status"] == "error" and "CUDA out of memory" in comfy.events[-1][1]["message"]


def test_encode_and_denoise_compose(demo):
    (cache,), _ = call(Encode, model=demo, text="Numbers are words.")
    out, _ = call(Denoise, model=demo, prompt="What is 3+4?", kv_cache=cache, **KNOBS)
    assert out[1].steps_used >= 1 and out[6].length > cache.length
    assert out[5].context["length"] == cache.length
    with pytest.raises(ValueError, match="text is empty"):
        call(Encode, model=demo, text="  ")


def test_trace_node_both_modes(demo):
    (_, _, trace, *_), _ = call(Sampler, model=demo, prompt="What is 1+1?", **KNOBS)
    for mode in ("commit", "entropy"):
        (image, summary), _ = call(Trace, canvas_trace=trace, mode=mode, cell_px=2)
        assert image.shape[0] == 1 and "EntropyBoundScheduler" in summary


def test_run_log_writer_writes_into_the_output_folder(tmp_path, demo):
    (_, state, trace, frames, _, config), _ = call(Sampler, model=demo, prompt="What is 5+1?", **KNOBS)
    with fakecomfy.installed(tmp_path) as comfy:
        (path,), ui = call(RunLog, canvas_trace=trace, run_config=config, frames=frames, canvas_state=state,
                           filename_prefix="runs/dgemma")
    assert ui == {"text": ["output/runs/dgemma_00001.jsonl"]}  # shown relative to the output folder
    assert path.startswith(str(comfy.output_dir / "runs" / "dgemma_00001"))
    rows = [json.loads(line) for line in open(path, encoding="utf-8")]
    assert rows[0]["record_type"] == "header" and rows[-1]["text"] == "six"


def test_display_names_are_short_and_say_what_the_node_is():
    """The node library shows them in a narrow column: short enough not to wrap, and not the pack's name again
    (the category says it)."""
    for name, shown in NODE_DISPLAY_NAME_MAPPINGS.items():
        assert len(shown) <= 20 and "Gemma" not in shown, (name, shown)
    assert len(set(NODE_DISPLAY_NAME_MAPPINGS.values())) == len(NODE_DISPLAY_NAME_MAPPINGS)
