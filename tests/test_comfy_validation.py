"""Each queue-time refusal is listed once, and ComfyUI's own range and choice checks stay on for every input.

ComfyUI 0.8 (execution.validate_inputs) skips its min/max/choice checks for every input that
VALIDATE_INPUTS names (all of them when it takes **kwargs), and reports a failed check once per
input it names. The pack's nodes name only the hidden `queued_check`, which the pack's on-prompt handler
fills before ComfyUI validates (nodes/queue_check.py). `comfy_errors` follows those rules, so one bad
value must give one error.
"""

from __future__ import annotations

import inspect

import pytest

from diffusiongemma import NODE_CLASS_MAPPINGS as NODES
from diffusiongemma.dgemma.errors import InputError
from diffusiongemma.dgemma.inputs.knobs import KNOBS
from diffusiongemma.nodes.queue_check import QUEUED_CHECK, on_prompt

KNOB_VALUES = {name: spec.default for name, spec in KNOBS.items()}
ADVANCED = {"prompt": "What is 1+2?", "scheduler": "entropy_bound", "start_step": 0, "end_step": 1024, "pins": "",
            **KNOB_VALUES}
CUSTOM = "custom_validation_failed"


def queued(cls, inputs: dict, linked=()) -> dict:
    """The node's inputs once the pack's on-prompt handler has run over a prompt holding it, as ComfyUI's
    post_prompt runs it before validating; the linked inputs are links there and left out here."""
    name = next(n for n, c in NODES.items() if c is cls)
    graph = {"1": {"class_type": name, "inputs": {**inputs, **{n: ["0", 0] for n in linked}}}}
    on_prompt(NODES)({"prompt": graph})
    return {n: v for n, v in graph["1"]["inputs"].items() if n not in linked}


def queued_refusal(cls, inputs: dict, linked=()) -> str | None:
    """The refusal the handler wrote for the node (None: it passed)."""
    return queued(cls, inputs, linked).get(QUEUED_CHECK)


def comfy_report(cls, inputs: dict, linked=(), handle=True) -> list[tuple[str, str, str]]:
    """(input, kind, details) of each error ComfyUI 0.8 reports for these constant inputs and these linked ones.

    `handle`: pass them through the pack's on-prompt handler first (False: they already went through it, in a
    whole prompt). As execution.validate_inputs does: a constant reaches VALIDATE_INPUTS as [value] and a linked
    input as (None,), whole for a list node (INPUT_IS_LIST), one item per call otherwise.
    """
    if handle:
        inputs = queued(cls, inputs, linked)
    spec = {**cls.INPUT_TYPES()["required"], **cls.INPUT_TYPES().get("optional", {})}
    hidden = cls.INPUT_TYPES().get("hidden", {})  # passed as given, never type- or range-checked
    check = getattr(cls, "VALIDATE_INPUTS", None)
    argspec = inspect.getfullargspec(check) if check else None
    declared, varkw = (argspec.args if argspec else []), (argspec is not None and argspec.varkw is not None)
    errors = []
    for name, value in inputs.items():
        if name in hidden or name in declared or varkw or name in linked:
            continue
        kind, options = spec[name][0], (spec[name][1] if len(spec[name]) > 1 else {})
        if "min" in options and value < options["min"] or "max" in options and value > options["max"]:
            errors.append((name, "range", name))
        elif isinstance(kind, list) and value not in kind:
            errors.append((name, "value_not_in_list", name))
    if declared or varkw:
        given = {**{n: [v] for n, v in inputs.items()}, **{n: (None,) for n in linked}}
        named = {n: v for n, v in given.items() if n in declared or varkw}
        listed = getattr(cls, "INPUT_IS_LIST", False)
        said = check(**(named if listed else {n: v[0] for n, v in named.items()}))
        if said is not True:
            errors += [(n, CUSTOM, f"{n} - {said}") for n in named]
    return errors


def comfy_errors(cls, inputs: dict, linked=(), handle=True) -> list[tuple[str, str]]:
    """(input, kind) of each error ComfyUI 0.8 reports (comfy_report)."""
    return [(name, kind) for name, kind, _ in comfy_report(cls, inputs, linked, handle)]


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


def test_every_queue_check_names_only_the_hidden_input_the_handler_fills():
    """ComfyUI lists a refusal under each input VALIDATE_INPUTS names: one name, one listing."""
    for name, cls in NODES.items():
        if getattr(cls, "VALIDATE_INPUTS", None) is None:
            continue
        assert inspect.getfullargspec(cls.VALIDATE_INPUTS).args == ["cls", QUEUED_CHECK], name
        assert QUEUED_CHECK in cls.INPUT_TYPES().get("hidden", {}), name
        assert hasattr(cls, "queue_refusal"), name


@pytest.mark.parametrize("change, where", [
    ({"end_step": 0}, ("end_step", "range")),
    ({"scheduler": "ddpm"}, ("scheduler", "value_not_in_list")),
    ({"confidence": -1.0}, ("confidence", "range")),
    ({"gen_length": 0}, ("gen_length", "range")),
    ({"temperature": 5.0}, ("temperature", "range")),
    ({"t_min": 2.0}, ("t_min", "range")),  # ComfyUI's range; t_min against t_max is not checked twice
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
    ({"t_max": 0.0, "t_min": 0.0}, "t_max must be above 0"),
    ({"entropy_bound": 0.0}, "entropy_bound must be above 0"),
    ({"t_max": float("nan")}, "t_max must be between 0.0 and 1.0, got nan"),
])
def test_knob_rules_are_refused_when_the_graph_is_queued(node, change, says):
    """Before the Loader loads: the engine's own message, listed once (under the hidden input the handler
    fills), while every knob keeps ComfyUI's own checks."""
    cls = NODES[node]
    assert comfy_errors(cls, _inputs(node, **change)) == [(QUEUED_CHECK, CUSTOM)]
    assert says in queued_refusal(cls, _inputs(node, **change))


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
    """A node's rules take ComfyUI's list shape too (one value per item, (None,) for a linked input)."""
    says = NODES["DGemmaSampler"].queue_refusal({"t_min": [0.4, 0.9], "t_max": [0.8], "entropy_bound": [0.1]})
    assert says.startswith("list item 1 of 2: t_min must not exceed t_max")
    assert NODES["DGemmaSampler"].queue_refusal({"t_min": [0.4, 0.7], "t_max": [0.8], "entropy_bound": (None,)}) \
        is None


def test_linked_text_inputs_pass_validation():
    assert comfy_errors(NODES["DGemmaPromptList"], {}, linked=("prompts",)) == []
    writer = ("canvas_trace", "run_config", "frames", "canvas_state", "filename_prefix")
    assert comfy_errors(NODES["DGemmaRunLogWriter"], {}, linked=writer) == []
    assert NODES["DGemmaRunLogWriter"].queue_refusal({"filename_prefix": (None,)}) is None


def test_a_bad_log_prefix_is_reported_once():
    cls = NODES["DGemmaRunLogWriter"]
    linked = ("canvas_trace", "run_config", "frames", "canvas_state")
    assert comfy_errors(cls, {"filename_prefix": "../out"}, linked) == [(QUEUED_CHECK, CUSTOM)]


def test_a_value_the_handler_was_sent_for_its_own_input_is_dropped():
    """A client cannot pass or refuse a node by sending the hidden input itself."""
    assert comfy_errors(NODES["DGemmaPromptList"], {"prompts": "a", QUEUED_CHECK: "refused"}) == []
    assert comfy_errors(NODES["DGemmaPromptList"], {"prompts": " ", QUEUED_CHECK: ""}) == [(QUEUED_CHECK, CUSTOM)]


DECIDE = {"prompt": "What colour?", "options": "red\ngreen", "samples": 8, **{
    n: KNOB_VALUES[n] for n in ("seed", "num_inference_steps", "t_min", "t_max", "entropy_bound", "confidence")}}
ENCODE, REMOTE = {"text": "x"}, {"url": "http://127.0.0.1:8190", "token_env": ""}
JOIN = {"format": "separator", "separator": "\\n"}
LOG_LINKS = ("canvas_trace", "run_config", "frames", "canvas_state")


@pytest.mark.parametrize("node, inputs, linked, says", [
    ("DGemmaSampler", _inputs("DGemmaSampler", t_min=0.9, t_max=0.5), (), "t_min must not exceed t_max"),
    ("DGemmaDenoise", _inputs("DGemmaDenoise", entropy_bound=0.0), (), "entropy_bound must be above 0"),
    ("DGemmaSamplerAdvanced", {**ADVANCED, "pins": "1: a\n1: b"}, (), "pins"),
    ("DGemmaDenoise", _inputs("DGemmaDenoise", constraint_type="json_schema", constraint="{not json"), (),
     "not valid JSON"),
    ("DGemmaSamplerAdvanced", {**ADVANCED, "constraint_type": "regex", "constraint": "a\0b"}, (), "NUL character"),
    ("DGemmaDecide", {**DECIDE, "options": "red\ngreen\nred"}, ("model",), "'red' is given twice"),
    ("DGemmaDecide", {**DECIDE, "t_min": 0.9, "t_max": 0.5}, ("model",), "t_min must not exceed t_max"),
    ("DGemmaEncode", {"text": "a\ud800"}, ("model",), "lone surrogate"),
    ("DGemmaJoinTexts", {**JOIN, "separator": "x" * 10**4}, ("text",), "separator is 10000 characters"),
    ("DGemmaPromptList", {"prompts": " \n "}, (), "prompts is empty"),
    ("DGemmaRemoteLoader", {**REMOTE, "url": "ftp://127.0.0.1"}, (), "must be http://host:port"),
    ("DGemmaRunLogWriter", {"filename_prefix": "../out"}, LOG_LINKS, "outside"),
])
def test_each_queue_time_refusal_is_listed_exactly_once(node, inputs, linked, says):
    """One bad value of each kind of rule: one error in the node's report, its text shown once."""
    report = comfy_report(NODES[node], inputs, linked)
    assert [(name, kind) for name, kind, _ in report] == [(QUEUED_CHECK, CUSTOM)], report
    assert says in report[0][2]


def test_knobs_that_only_conflict_together_are_refused_at_run_start_before_the_model_works():
    node = NODES["DGemmaSampler"]()
    with pytest.raises(InputError) as info:
        node.sample(model=object(), prompt="x", **{**KNOB_VALUES, "t_min": 0.9, "t_max": 0.5})
    assert info.value.name == "t_min" and "swap them" in str(info.value)
