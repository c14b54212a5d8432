"""Every field of an OpenAI chat request, and what this server does with it: honoured, accepted and
meaningless here, or refused by name.

A refused field passes when it holds its no-op value (`presence_penalty: 0`, `tools: []`, null),
since the server then does what was asked. With `--lenient` the refusals become a warning header
instead (for clients that always send them). The README's field table says the same.
"""

from __future__ import annotations

from ..dgemma.errors import InputError

# Read by serve/requests.py, serve/structured.py and serve/messages.py.
HONOURED = ("messages", "model", "stream", "seed", "max_tokens", "max_completion_tokens", "n", "stop", "logprobs",
            "top_logprobs", "response_format", "structured_outputs", "guided_choice", "guided_regex", "guided_json",
            "chat_template_kwargs", "dgemma")
# Accepted and meaningless here: they change nothing a client can see.
IGNORED = {
    "user": "an end-user id for abuse monitoring; nothing is monitored or stored",
    "safety_identifier": "an end-user id for abuse monitoring; nothing is monitored or stored",
    "metadata": "tags for stored completions; nothing is stored",
    "prompt_cache_key": "a prompt-cache routing hint; contexts are cached by handle (dgemma.context)",
    "prompt_cache_retention": "a prompt-cache hint; contexts are cached by handle (dgemma.context)",
    "prompt_cache_options": "a prompt-cache hint; contexts are cached by handle (dgemma.context)",
    "service_tier": "a billing tier; one local engine serves every request",
    "parallel_tool_calls": "only means something with tools, which are refused",
    "stream_options": "a stream always ends with a usage chunk, include_usage or not",
}
# Refused unless the value is one of the no-ops listed (None always passes).
REFUSED = {
    "tools": ("tool calling is not implemented", ([],)),
    "tool_choice": ("tool calling is not implemented", ("none",)),
    "functions": ("function calling is not implemented", ([],)),
    "function_call": ("function calling is not implemented", ("none",)),
    "logit_bias": ("token biases are not implemented", ({},)),
    "presence_penalty": ("penalties are not implemented", (0,)),
    "frequency_penalty": ("penalties are not implemented", (0,)),
    "temperature": ("a run's temperature is a schedule, t_max on the first step annealed to t_min on the last: set "
                    "dgemma.knobs.t_max and t_min (0..1; defaults 0.8 and 0.4)", ()),
    "top_p": ("nucleus sampling is not implemented: the schedule samples from the whole distribution (top_p 1)",
              (1,)),
    "reasoning_effort": ("thinking is on or off: send chat_template_kwargs.enable_thinking", ()),
    "verbosity": ("there is no verbosity control", ()),
    "audio": ("audio output is not implemented", ()),
    "prediction": ("predicted outputs are not implemented", ()),
    "web_search_options": ("web search is not implemented", ()),
    "moderation": ("moderation is not implemented", ()),
    "store": ("nothing is stored", (False,)),
    "guided_grammar": ("grammars are not implemented: use a JSON Schema or a regex", ()),
    "modalities": ("the model writes text only", (["text"],)),
}


def _same(value, noop) -> bool:
    """JSON equality: 0 and 0.0 are the same number, false is no number."""
    if isinstance(value, bool) or isinstance(noop, bool):
        return value is noop
    if isinstance(noop, (int, float)):
        return isinstance(value, (int, float)) and value == noop
    return type(value) is type(noop) and value == noop


def unsupported(body: dict, lenient: bool) -> list[str]:
    """Refuse (InputError naming it) the first field the server does not implement; with `lenient`,
    return them instead, each with the reason, for the warning header."""
    found = []
    for key in body:
        if key in HONOURED or key in IGNORED:
            continue
        if key in REFUSED:
            why, noops = REFUSED[key]
            if body[key] is None or any(_same(body[key], n) for n in noops):
                continue
            found.append((key, f"{key} is not supported here: {why}"))
        else:
            found.append((key, f"{str(key)[:60]!r} is not a chat completion field this server knows"))
    if found and not lenient:
        key, why = found[0]
        raise InputError(str(key)[:60], f"{why}; leave it out (or start the server with --lenient to ignore it "
                                        "with a warning)")
    return [why for _, why in found]
