"""Adding a scheduler is adding one adapter class: a toy defined here alone runs through the Advanced node."""

from __future__ import annotations

import pytest
import torch
from executor import call

from diffusiongemma import NODE_CLASS_MAPPINGS
from diffusiongemma.dgemma import Knobs
from diffusiongemma.dgemma.errors import InputError
from diffusiongemma.dgemma.inputs.knobs import KnobSpec
from diffusiongemma.dgemma.steps.schedulers import REGISTRY, SchedulerAdapter, Scheduling, StepOutput, unregister

Advanced = NODE_CLASS_MAPPINGS["DGemmaSamplerAdvanced"]
BASE = dict(prompt="What is 3+4?", seed=5, num_inference_steps=4, t_min=0.4, t_max=0.8, entropy_bound=0.1,
            confidence=0.0, gen_length=32, thinking=False, pins="", start_step=0, end_step=1024)


@pytest.fixture
def toy():
    """A greedy scheduler: each step commits the argmax of the next even share of the canvas, left to right."""

    class Greedy(SchedulerAdapter):
        name = "toy_greedy"
        diffusers_name = "ToyGreedyScheduler"
        own_knobs = {"lead": KnobSpec(int, 0, 0, 64, 1, "toy_greedy: extra positions the first step commits "
                                                        "(a count).")}
        summary = "commits the argmax left to right"
        stop_rule = "it never stops early"

        def build(self, canvas_length, device):
            self.L = canvas_length
            return None

        def temperature(self, step):
            return 0.0

        def step(self, logits, step, canvas, generator, forward):
            n = min(self.L, (step + 1) * self.L // self.steps + self.settings["lead"])
            committed = torch.zeros_like(canvas, dtype=torch.bool)
            committed[:, :n] = True
            return StepOutput(torch.where(committed, logits.argmax(-1), canvas), committed, logits)

    yield Greedy
    unregister("toy_greedy")


def test_a_fourth_scheduler_runs_through_the_advanced_node(tiny_model, toy):
    spec = Advanced.INPUT_TYPES()
    assert spec["required"]["scheduler"][0][-1] == "toy_greedy" and "toy_greedy" in spec["required"]["scheduler"][1][
        "tooltip"]
    assert spec["optional"]["lead"][1]["max"] == 64
    assert spec["required"]["scheduler"][1]["dgemma_applies"]["toy_greedy"] == ["lead"]  # the JS shows only it
    (text, state, trace, frames, _, _), _ = call(Advanced, model=tiny_model, scheduler="toy_greedy", lead=3, **BASE)
    L = tiny_model.canvas_length
    assert trace.scheduler_name == "ToyGreedyScheduler"
    assert trace.scheduler_config == {"num_inference_steps": 4, "lead": 3}
    assert trace.committed.sum(axis=1).tolist()[:4] == [L // 4 + 3, L // 2 + 3, 3 * L // 4 + 3, L]
    assert trace.knob_sets[0]["scheduler"] == "toy_greedy" and trace.knob_sets[0]["lead"] == 3
    assert len(frames) == len(trace) and state.steps_used == len(trace)
    # a window and its resume: the toy carries no state, and the chain is the one run
    (_, paused, *_), _ = call(Advanced, model=tiny_model, scheduler="toy_greedy", lead=3, **{**BASE, "end_step": 2})
    (_, resumed, again, *_), _ = call(Advanced, model=tiny_model, scheduler="toy_greedy", lead=3,
                                      canvas_state=paused, **{**BASE, "start_step": 2})
    assert paused.paused and resumed.raw_ids == state.raw_ids and (again.ids == trace.ids).all()


def test_the_toy_leaves_no_trace_once_removed(toy):
    assert "toy_greedy" in REGISTRY
    unregister("toy_greedy")
    with pytest.raises(InputError) as err:
        Scheduling("toy_greedy")
    assert err.value.name == "scheduler"
    with pytest.raises(InputError) as err:
        Scheduling("entropy_bound", lead=3)
    assert err.value.name == "lead"


@pytest.mark.parametrize("name", ["entropy_bound", "block_refinement", "discrete_ddim"])
def test_each_adapter_reads_its_config_back_from_the_built_scheduler(name):
    knobs = Knobs(num_inference_steps=7)
    built = Scheduling(name).build(knobs, 32, "cpu")
    config = built.config()
    kept = built.impl.config
    for key, value in config.items():
        if key in kept and kept[key] is not None:
            assert kept[key] == value, key
    assert built.steps == Scheduling(name).steps(knobs) and built.position(0) == 1.0


def test_a_step_reads_its_temperature_from_the_built_scheduler_and_a_plain_trace_names_the_default():
    from diffusiongemma.dgemma.readouts.trace import Recorder
    from diffusiongemma.dgemma.steps import schedulers

    knobs = Knobs(num_inference_steps=4, t_min=0.4, t_max=0.8)
    built = Scheduling().build(knobs, 32, "cpu")
    assert [built.temperature(s) for s in range(4)] == [knobs.temperature(s) for s in range(4)]
    built.impl.register_to_config(t_min=0.1, t_max=0.9)  # what the scheduler will step with, not the knobs
    assert built.temperature(0) == 0.9 and built.temperature(3) == 0.1 + 0.8 * 0.25
    trace = Recorder(knobs, 32).finish()  # a plain run records no scheduler of its own
    default = schedulers.default()
    assert default is REGISTRY["entropy_bound"] and trace.scheduler_name == default.diffusers_name
    assert list(trace.scheduler_config) == ["entropy_bound", "t_min", "t_max", "num_inference_steps"]


def test_the_schedulers_that_rarely_stop_say_so(tiny_model):
    from diffusiongemma.dgemma import generate
    from diffusiongemma.dgemma.denoising.resume import Advanced as Adv

    knobs = Knobs(seed=1, num_inference_steps=4, gen_length=32)
    assert "unscaled logits" in Advanced.INPUT_TYPES()["required"]["scheduler"][1]["tooltip"]
    trace = generate(tiny_model, "hi", knobs, advanced=Adv(Scheduling("block_refinement"))).trace
    assert "0 of 1 block(s) ended early (its adaptive stop reads the entropy of the unscaled logits" in str(trace)


def test_the_advanced_node_tells_the_page_which_knobs_each_scheduler_reads():
    applies = Advanced.INPUT_TYPES()["required"]["scheduler"][1]["dgemma_applies"]
    assert applies == {"entropy_bound": ["t_min", "t_max", "entropy_bound"],
                       "block_refinement": ["temperature", "threshold", "editing_threshold"],
                       "discrete_ddim": ["temperature", "corrector_steps", "corrector_k"]}
    spec = Advanced.INPUT_TYPES()
    declared = set(spec["required"]) | set(spec["optional"])
    assert {k for knobs in applies.values() for k in knobs} <= declared  # every listed knob is a widget
