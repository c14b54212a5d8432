"""ComfyUI's own range and choice checks stay on: a node's VALIDATE_INPUTS names only the inputs it needs.

ComfyUI 0.8 (execution.validate_inputs) skips its min/max/choice checks for every input that
VALIDATE_INPUTS names (all of them when it takes **kwargs), and reports a failed check once per
input it names. `comfy_errors` follows those rules, so one bad knob must give one error.
"""

from __future__ import annotations

import inspect

import pytest

from diffusiongemma import NODE_CLASS_MAPPINGS as NODES
from diffusiongemma.dgemma.errors import InputError
from diffusiongemma.dgemma.knobs import KNOBS

KNOB_VALUES = {name: spec.default for name, spec in KNOBS.items()}
ADVANCED = {"prompt": "What is 1+2?", "scheduler": "entropy_bound", "start_step": 0, "end_step": 1024, "pins": "",
            **KNOB_VALUES}


def comfy_errors(cls, inputs: dict) -> list[tuple[str, str]]:
    """(input, kind) of each error ComfyUI 0.8 reports for these constant inputs."""
    spec = {**cls.INPUT_TYPES()["required"], **cls.INPUT_TYPES().get("optional", {})}
    check = getattr(cls, "VALIDATE_INPUTS", None)
    argspec = inspect.getfullargspec(check) if check else None
    declared, varkw = (argspec.args if argspec else []), (argspec is not None and argspec.varkw is not None)
    errors = []
    for name, value in inputs.items():
        kind, options = spec[name][0], (spec[name][1] if len(spec[name]) > 1 else {})
        if name in declared or varkw:
            continue
        if "min" in options and value < options["min"] or "max" in options and value > options["max"]:
            errors.append((name, "range"))
        elif isinstance(kind, list) and value not in kind:
            errors.append((name, "value_not_in_list"))
    if declared or varkw:
        named = {n: v for n, v in inputs.items() if n in declared or varkw}
        if check(**named) is not True:
            errors += [(n, "custom_validation_failed") for n in named]
    return errors


def test_no_node_switches_comfyuis_checks_off_for_inputs_it_does_not_check():
    for name, cls in NODES.items():
        check = getattr(cls, "VALIDATE_INPUTS", None)
        if check is None:
            continue
        argspec = inspect.getfullargspec(check)
        spec = cls.INPUT_TYPES()
        inputs = {**spec["required"], **spec.get("optional", {})}
        assert argspec.varkw is None, f"{name}.VALIDATE_INPUTS takes **kwargs: ComfyUI then checks no input"
        assert set(argspec.args) - {"cls"} <= set(inputs), name


@pytest.mark.parametrize("change, where", [
    ({"end_step": 0}, ("end_step", "range")),
    ({"scheduler": "ddpm"}, ("scheduler", "value_not_in_list")),
    ({"t_min": 2.0}, ("t_min", "range")),
    ({"confidence": -1.0}, ("confidence", "range")),
])
def test_one_bad_knob_is_reported_once_under_its_own_name(change, where):
    assert comfy_errors(NODES["DGemmaSamplerAdvanced"], {**ADVANCED, **change}) == [where]
    if where[0] in KNOBS:
        sampler = {"prompt": "x", **KNOB_VALUES, **change}
        assert comfy_errors(NODES["DGemmaSampler"], sampler) == [where]


def test_a_bad_log_prefix_is_reported_once():
    cls = NODES["DGemmaRunLogWriter"]
    assert cls.VALIDATE_INPUTS(filename_prefix=["../out"]) != True  # noqa: E712
    assert inspect.getfullargspec(cls.VALIDATE_INPUTS).args == ["cls", "filename_prefix"]


def test_knobs_that_only_conflict_together_are_refused_at_run_start_before_the_model_works():
    node = NODES["DGemmaSampler"]()
    with pytest.raises(InputError) as info:
        node.sample(model=object(), prompt="x", **{**KNOB_VALUES, "t_min": 0.9, "t_max": 0.5})
    assert info.value.name == "t_min" and "swap them" in str(info.value)
