"""ComfyUI's own range and choice checks stay on for every input a node's VALIDATE_INPUTS does not name.

ComfyUI 0.8 (execution.validate_inputs) skips its min/max/choice checks for every input that
VALIDATE_INPUTS names (all of them when it takes **kwargs), and reports a failed check once per
input it names. `comfy_errors` follows those rules, so one bad knob must give one error.
"""

from __future__ import annotations

import inspect

import pytest

from diffusiongemma import NODE_CLASS_MAPPINGS as NODES
from diffusiongemma.dgemma.errors import InputError
from diffusiongemma.dgemma.inputs.knobs import KNOBS

KNOB_VALUES = {name: spec.default for name, spec in KNOBS.items()}
ADVANCED = {"prompt": "What is 1+2?", "scheduler": "entropy_bound", "start_step": 0, "end_step": 1024, "pins": "",
            **KNOB_VALUES}


def comfy_errors(cls, inputs: dict, linked=()) -> list[tuple[str, str]]:
    """(input, kind) of each error ComfyUI 0.8 reports for these constant inputs and these linked ones.

    As execution.validate_inputs does: a constant reaches VALIDATE_INPUTS as [value] and a linked input as
    (None,), whole for a list node (INPUT_IS_LIST), one item per call otherwise.
    """
    spec = {**cls.INPUT_TYPES()["required"], **cls.INPUT_TYPES().get("optional", {})}
    hidden = cls.INPUT_TYPES().get("hidden", {})  # passed as given, never type- or range-checked
    check = getattr(cls, "VALIDATE_INPUTS", None)
    argspec = inspect.getfullargspec(check) if check else None
    declared, varkw = (argspec.args if argspec else []), (argspec is not None and argspec.varkw is not None)
    errors = []
    for name, value in inputs.items():
        if name in hidden or name in declared or varkw:
            continue
        kind, options = spec[name][0], (spec[name][1] if len(spec[name]) > 1 else {})
        if "min" in options and value < options["min"] or "max" in options and value > options["max"]:
            errors.append((name, "range"))
        elif isinstance(kind, list) and value not in kind:
            errors.append((name, "value_not_in_list"))
    if declared or varkw:
        given = {**{n: [v] for n, v in inputs.items()}, **{n: (None,) for n in linked}}
        named = {n: v for n, v in given.items() if n in declared or varkw}
        listed = getattr(cls, "INPUT_IS_LIST", False)
        if check(**(named if listed else {n: v[0] for n, v in named.items()})) is not True:
            errors += [(n, "custom_validation_failed") for n in named]
    return errors


def test_no_node_switches_comfyuis_checks_off_for_inputs_it_does_not_check():
    for name, cls in NODES.items():
        check = getattr(cls, "VALIDATE_INPUTS", None)
        if check is None:
            continue
        argspec = inspect.getfullargspec(check)
        spec = cls.INPUT_TYPES()
        inputs = {**spec["required"], **spec.get("optional", {}), **spec.get("hidden", {})}
        assert argspec.varkw is None, f"{name}.VALIDATE_INPUTS takes **kwargs: ComfyUI then checks no input"
        assert set(argspec.args) - {"cls"} <= set(inputs), name


@pytest.mark.parametrize("change, where", [
    ({"end_step": 0}, ("end_step", "range")),
    ({"scheduler": "ddpm"}, ("scheduler", "value_not_in_list")),
    ({"confidence": -1.0}, ("confidence", "range")),
    ({"gen_length": 0}, ("gen_length", "range")),
    ({"temperature": 5.0}, ("temperature", "range")),
])
def test_one_bad_knob_is_reported_once_under_its_own_name(change, where):
    """ComfyUI checks the range of every knob the samplers' VALIDATE_INPUTS does not name."""
    assert comfy_errors(NODES["DGemmaSamplerAdvanced"], {**ADVANCED, **change}) == [where]
    if where[0] in KNOBS:
        sampler = {"prompt": "x", **KNOB_VALUES, **change}
        assert comfy_errors(NODES["DGemmaSampler"], sampler) == [where]


SAMPLERS = ("DGemmaSampler", "DGemmaDenoise", "DGemmaSamplerAdvanced")


def _inputs(node: str, **change) -> dict:
    return {**(ADVANCED if node == "DGemmaSamplerAdvanced" else {"prompt": "x", **KNOB_VALUES}), **change}


@pytest.mark.parametrize("node", SAMPLERS)
@pytest.mark.parametrize("change, says", [
    ({"t_min": 0.9, "t_max": 0.5}, "t_min must not exceed t_max, got t_min=0.9 > t_max=0.5; swap them"),
    ({"t_min": 2.0}, "t_min must be between 0.0 and 1.0, got 2.0"),
    ({"t_max": 0.0, "t_min": 0.0}, "t_max must be above 0"),
    ({"entropy_bound": 0.0}, "entropy_bound must be above 0"),
    ({"t_max": float("nan")}, "t_max must be between 0.0 and 1.0, got nan"),
])
def test_knob_rules_are_refused_when_the_graph_is_queued(node, change, says):
    """Before the Loader loads: the engine's own message, listed under each input the check names (ComfyUI's
    way), while the inputs it does not name keep ComfyUI's own checks."""
    cls = NODES[node]
    errors = comfy_errors(cls, _inputs(node, **change))
    given = _inputs(node, **change)  # ComfyUI lists the failure under each named input the prompt holds
    named = [n for n in inspect.getfullargspec(cls.VALIDATE_INPUTS).args if n != "cls" and n in given]
    assert errors == [(n, "custom_validation_failed") for n in named]
    given = {n: [v] for n, v in _inputs(node, **change).items() if n in named}
    assert says in cls.VALIDATE_INPUTS(**given)


@pytest.mark.parametrize("node", SAMPLERS)
def test_a_linked_knob_is_checked_when_the_node_runs(node):
    """ComfyUI hands a linked input over as (None,): its partners are checked against any value it may take."""
    cls = NODES[node]
    assert comfy_errors(cls, _inputs(node, t_max=0.5), linked=("t_min",)) == []
    assert comfy_errors(cls, _inputs(node, t_min=0.9), linked=("t_max", "entropy_bound")) == []
    assert comfy_errors(cls, _inputs(node, t_min=2.0), linked=("t_max",)) != []
    if node == "DGemmaSamplerAdvanced":
        assert comfy_errors(cls, ADVANCED, linked=("pins",)) == []


def test_a_list_of_knobs_is_checked_item_by_item():
    says = NODES["DGemmaSampler"].VALIDATE_INPUTS(t_min=[0.4, 0.9], t_max=[0.8], entropy_bound=[0.1])
    assert says.startswith("list item 1 of 2: t_min must not exceed t_max")
    assert NODES["DGemmaSampler"].VALIDATE_INPUTS(t_min=[0.4, 0.7], t_max=[0.8], entropy_bound=(None,)) is True


def test_linked_text_inputs_pass_validation():
    assert NODES["DGemmaPromptList"].VALIDATE_INPUTS(prompts=None) is True
    assert NODES["DGemmaRunLogWriter"].VALIDATE_INPUTS(filename_prefix=(None,)) is True


def test_a_bad_log_prefix_is_reported_once():
    cls = NODES["DGemmaRunLogWriter"]
    assert cls.VALIDATE_INPUTS(filename_prefix=["../out"]) != True  # noqa: E712
    assert inspect.getfullargspec(cls.VALIDATE_INPUTS).args == ["cls", "filename_prefix"]


def test_knobs_that_only_conflict_together_are_refused_at_run_start_before_the_model_works():
    node = NODES["DGemmaSampler"]()
    with pytest.raises(InputError) as info:
        node.sample(model=object(), prompt="x", **{**KNOB_VALUES, "t_min": 0.9, "t_max": 0.5})
    assert info.value.name == "t_min" and "swap them" in str(info.value)
