"""What a constraint may cost to compile, checked before compiling and enforced while it compiles.

Before: an estimate of the automaton's states from the regex or schema structure (repetition counts,
nesting, alternation width, optional properties), refused over a budget naming the part at fault
and its fix. During: every outlines-core call runs in a child process (`outlines_child.py`) under
CPU-time and memory limits, killed on Cancel; a probe against 256 one-byte tokens counts the states
first, and the real compile runs only when states x the tokenizer's tokens fits (decision 0017).
"""

from __future__ import annotations

import json
import pickle
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from ..errors import Cancelled, InputError

try:
    from re import _constants as _sre
    from re import _parser as _parse
except ImportError:  # Python 3.10
    import sre_constants as _sre
    import sre_parse as _parse

GIB = 1 << 30
MAX_STATES = 20_000  # the structural estimate; a probe of 10,000 states takes about a second
MAX_OPTIONAL = 100  # optional properties of one object: outlines-core's regex grows with their square
MAX_REGEX = 300_000  # characters of a schema's regex
MAX_DEPTH = 32  # nesting of a schema
MAX_WORK = 4096 * 262_144  # probe states x vocabulary: about 50 s of compiling at Gemma's vocabulary
MAX_TRANSITIONS = 4_000_000  # the compiled index's transitions, held in this process (~100 B each)
REGEX_CPU_S, PROBE_CPU_S, COMPILE_CPU_S = 3, 5, 120
REGEX_MEMORY, PROBE_MEMORY, COMPILE_MEMORY = GIB, GIB // 2, 3 * GIB
STRING_CHAR = 10  # states per character of a bounded JSON string (measured)
ANY_CONTAINER = 1600  # an object without properties or an array without items (measured)
SCALAR = {"integer": 5, "number": 10, "boolean": 10, "null": 4, "string": 13}
CHILD = Path(__file__).with_name("outlines_child.py")
# The child imports only what it names: the working directory never shadows a module.
LAUNCH = "import sys; sys.path[:] = [p for p in sys.path if p not in ('', '.')]; import runpy; " \
         "runpy.run_path(sys.argv[1], run_name='__main__')"


@dataclass(frozen=True)
class Part:
    """One costly part of a constraint: its states with what it holds, where, what it is, the fix."""

    cost: int
    where: str
    what: str
    fix: str
    multiplies: bool = True  # a count (repetition, maxLength, maxItems); False: a sum (branches, properties)

    def text(self, estimate: bool = True) -> str:
        at = f" at {self.where if len(self.where) <= 160 else self.where[:159] + '…'}" if self.where else ""
        cost = f" (about {self.cost:,} states with what it holds)" if self.cost and estimate else ""
        return f"{self.what}{at}{cost}; {self.fix}"


# The regex: a walk of Python's parse tree (the same syntax outlines-core takes for these).

def regex_parts(text: str) -> tuple[int, list[Part]]:
    """(estimated states, the costly repetitions) of a regex."""
    parts: list[Part] = []
    try:
        total = _regex_cost(_parse.parse(text), text, parts)
    except (RecursionError, OverflowError, ValueError):
        total = len(text)
    return total, parts


def _regex_cost(items, text: str, parts: list) -> int:
    repeats = {_sre.MAX_REPEAT, _sre.MIN_REPEAT, getattr(_sre, "POSSESSIVE_REPEAT", _sre.MAX_REPEAT)}
    total = 0
    for op, av in items:
        if op in repeats:
            lo, hi, sub = av
            times = lo if hi == _sre.MAXREPEAT else hi
            cost = _regex_cost(sub, text, parts) * max(times, 1)
            if times > 1:
                parts.append(Part(cost, "", f"the repetition {_quote(text, lo, hi)}",
                                  "lower its count, or use + or * where any count will do"))
        elif op is _sre.SUBPATTERN or op is getattr(_sre, "ATOMIC_GROUP", None):
            cost = _regex_cost(av[-1] if op is _sre.SUBPATTERN else av, text, parts)
        elif op is _sre.BRANCH:
            cost = sum(_regex_cost(branch, text, parts) for branch in av[1])
        elif op is _sre.LITERAL:
            cost = len(chr(av).encode("utf-8"))
        else:
            cost = 4 if op in (_sre.ANY, _sre.NOT_LITERAL, _sre.IN) else 1  # a class may take 4 UTF-8 bytes
        total += cost
    return total


def _quote(text: str, lo: int, hi: int) -> str:
    """The repetition as written, with a little of what it repeats."""
    counts = [f"{{{lo}}}"] if lo == hi else [f"{{{lo},{hi}}}", f"{{,{hi}}}"] if hi != _sre.MAXREPEAT \
        else [f"{{{lo},}}"]
    for count in counts:
        at = text.find(count)
        if at >= 0:
            start = max(0, at - 16)
            return "'" + ("…" if start else "") + text[start:at + len(count)] + "'"
    return f"{{{lo},{'' if hi == _sre.MAXREPEAT else hi}}}"


# The schema: states of the regex outlines-core writes for each part.

class SchemaCost:
    """Estimated states of a checked schema, part by part; `refs` resolved as outlines-core inlines them."""

    def __init__(self, root: dict):
        self.root, self.parts, self.memo = root, [], {}

    def value(self, schema, where: str, refs: int = 0) -> int:
        if schema is True or schema == {}:
            raise _refuse(Part(0, where, "a schema that allows any JSON value", "give it a type (with properties "
                               "for an object, items for an array): outlines-core's any-value automaton does not "
                               "compile within the budget"))
        if not isinstance(schema, dict):
            return 1
        if "$ref" in schema:
            return self.ref(schema["$ref"], where, refs)
        if "enum" in schema or "const" in schema:
            return _literals(schema)
        branching = next((k for k in ("anyOf", "oneOf", "allOf") if isinstance(schema.get(k), list)), None)
        if branching is not None:
            return self.branches(schema[branching], branching, where, refs)
        kinds = schema.get("type")
        if isinstance(kinds, list):
            return sum(self.typed(dict(schema, type=k), where, refs) for k in kinds)
        return self.typed(schema, where, refs)

    def ref(self, target, where: str, refs: int) -> int:
        """The referenced schema's cost: outlines-core inlines references, at most 3 deep."""
        key = (target if isinstance(target, str) else "", refs)
        if key not in self.memo:
            self.memo[key] = self.value(self.target(key[0]), where, refs + 1) if refs < 4 else 1
        return self.memo[key]

    def branches(self, schemas: list, key: str, where: str, refs: int) -> int:
        cost = sum(self.value(s, f"{where}/{key}/{i}", refs) for i, s in enumerate(schemas))
        self.note(cost, where, f"{key} of {len(schemas)} branches", "give fewer or simpler branches",
                  multiplies=False)
        return cost

    def typed(self, schema: dict, where: str, refs: int) -> int:
        kind = schema.get("type")
        if kind is None:
            kind = "object" if "properties" in schema else "array" if "items" in schema else \
                "string" if {"pattern", "format", "maxLength", "minLength"} & set(schema) else None
        if kind == "object":
            return self.object(schema, where, refs)
        if kind == "array":
            return self.array(schema, where, refs)
        if kind == "string":
            return self.string(schema, where)
        if kind in SCALAR:
            return SCALAR[kind]
        return self.value({}, where)

    def string(self, schema: dict, where: str) -> int:
        if isinstance(schema.get("pattern"), str):
            return regex_parts(schema["pattern"])[0]
        if "format" in schema:
            return 60
        for key in ("maxLength", "minLength"):
            count = schema.get(key)
            if isinstance(count, int) and count > 1:
                cost = STRING_CHAR * count + 3
                self.note(cost, where, f"{key} {count}", f"lower {key} (each character is about {STRING_CHAR} "
                                                         "states)")
                return cost
        return SCALAR["string"]

    def object(self, schema: dict, where: str, refs: int) -> int:
        props = schema.get("properties")
        extra = schema.get("additionalProperties")
        if not isinstance(props, dict) or not props:
            if isinstance(extra, dict):
                return SCALAR["string"] + self.value(extra, f"{where}/additionalProperties", refs) + 8
            self.note(ANY_CONTAINER, where, "an object without properties (any JSON object)",
                      "list its properties", force=True)
            return ANY_CONTAINER
        required = schema.get("required") if isinstance(schema.get("required"), list) else []
        optional = len([name for name in props if name not in required])
        if optional > MAX_OPTIONAL:
            raise _refuse(Part(0, where, f"an object with {optional} optional properties",
                               f"keep it to {MAX_OPTIONAL} (outlines-core writes each optional property once per "
                               "place it may take): mark the ones always present as required, or split the object"))
        cost = sum(len(name) + 6 + self.value(sub, f"{where}/properties/{name}", refs) for name, sub in props.items())
        if optional > 1:
            self.note(cost, where, f"an object with {optional} optional properties",
                      "mark the ones always present as required, or split the object", multiplies=False)
        return cost + 2

    def array(self, schema: dict, where: str, refs: int) -> int:
        prefix = schema.get("prefixItems")
        items = schema.get("items")
        cost = sum(self.value(s, f"{where}/prefixItems/{i}", refs) + 2 for i, s in enumerate(prefix)) \
            if isinstance(prefix, list) else 0
        if not isinstance(items, dict):
            if prefix:
                return cost + 2
            self.note(ANY_CONTAINER, where, "an array without items (any JSON array)", "give its items",
                      force=True)
            return ANY_CONTAINER
        one = self.value(items, f"{where}/items", refs) + 2
        counts = [schema.get(k) for k in ("maxItems", "minItems") if isinstance(schema.get(k), int)]
        times = max(counts[0] if counts else 1, 1)
        if times > 1:
            key = "maxItems" if "maxItems" in schema else "minItems"
            self.note(one * times, where, f"{key} {times}", f"lower {key}, or simplify its items")
        return cost + one * times + 2

    def target(self, ref) -> dict:
        if not isinstance(ref, str) or not ref.startswith("#"):
            return {"type": "null"}  # outlines-core refuses other references itself
        node = self.root
        for key in [k for k in ref[1:].split("/") if k]:
            node = node.get(key) if isinstance(node, dict) else None
        return node if isinstance(node, dict) else {"type": "null"}

    def note(self, cost: int, where: str, what: str, fix: str, force: bool = False, multiplies: bool = True) -> None:
        if force or cost > 1:
            self.parts.append(Part(cost, where, what, fix, multiplies))


def _literals(schema: dict) -> int:
    """An enum's or a const's states: the JSON of each value."""
    options = schema["enum"] if "enum" in schema else [schema["const"]]
    return sum(len(json.dumps(v)) for v in options) + 1 if isinstance(options, list) else 1


def schema_parts(schema) -> tuple[int, list[Part]]:
    """(estimated states, the costly parts) of a checked schema; refuses outright what never compiles."""
    found = SchemaCost(schema if isinstance(schema, dict) else {})
    return found.value(schema, "#"), found.parts


def _refuse(part: Part, total: int | None = None) -> InputError:
    over = f", over the budget of {MAX_STATES:,}" if total is not None else ""
    return InputError("constraint", f"the constraint is too costly to compile{over}: {part.text()}")


def check(kind: str, parsed) -> None:
    """Refuse a regex (text) or checked schema whose estimated states are over the budget, naming its
    costliest part."""
    total, parts = regex_parts(parsed) if kind == "regex" else schema_parts(parsed)
    if total > MAX_STATES:
        raise _refuse(costliest(parts, total, kind), total)


def costliest(parts: list[Part], total: int, kind: str) -> Part:
    """The part to name: of those over the budget, a count before a sum (a count multiplies what it
    holds), and the one holding no other over it (the count at fault, not every count around it);
    when none is over alone, the costliest count."""
    over = [p for p in parts if p.cost > MAX_STATES]
    pool = [p for p in over if p.multiplies] or over
    pool = [p for p in pool if not any(q is not p and p.where and q.where.startswith(p.where + "/") for q in pool)]
    pool = pool or [p for p in parts if p.multiplies] or parts
    return max(pool, key=lambda p: p.cost, default=Part(total, "", f"the whole {kind}", "simplify it"))


# During: the child process.

def _phases() -> dict:
    """What the child does in each phase, and its limits there."""
    return {"regex": ("writing the schema's regex", REGEX_CPU_S, REGEX_MEMORY),
            "probe": ("counting its automaton's states (against 256 one-byte tokens)", PROBE_CPU_S, PROBE_MEMORY),
            "compile": ("compiling it for this tokenizer", COMPILE_CPU_S, COMPILE_MEMORY)}


def run_child(task: dict, should_cancel=None) -> dict:
    """One outlines-core task in a child process: its result dict, {"overrun": "time"|"memory", "phase"}
    past a limit; the child is killed on Cancel (`should_cancel` true, or raising)."""
    phases = ("regex",) if task["op"] == "regex" else ("probe", "compile")
    wall = 3 * sum(_phases()[p][1] for p in phases) + 10  # CPU limits bound it first, where there are rlimits
    with tempfile.TemporaryFile() as task_file:  # a file, not a pipe: communicate() may be retried
        task_file.write(pickle.dumps(task))
        task_file.seek(0)
        proc = subprocess.Popen([sys.executable, "-c", LAUNCH, str(CHILD)], stdin=task_file,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                creationflags=getattr(subprocess, "CREATE_NO_WINDOW", 0))
    deadline = time.monotonic() + wall
    try:
        while True:
            try:
                out, err = proc.communicate(timeout=0.05)
                break
            except subprocess.TimeoutExpired:
                pass
            if should_cancel is not None and should_cancel():
                raise Cancelled(0)
            if time.monotonic() > deadline:
                proc.kill()
                out, err = proc.communicate()
                return {"overrun": "time", "phase": _phase(err)}
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    if proc.returncode == 0 and out:
        return pickle.loads(out)
    return {"overrun": _overrun_kind(proc.returncode, err), "phase": _phase(err)}


def _phase(err: bytes) -> str:
    phases = [line[6:] for line in err.decode("utf-8", "replace").splitlines() if line.startswith("phase ")]
    return phases[-1] if phases else "regex"


def _overrun_kind(code: int, err: bytes) -> str:
    import signal

    if code == -getattr(signal, "SIGXCPU", 24):
        return "time"
    if code in (-signal.SIGABRT, -getattr(signal, "SIGKILL", 9)) or b"memory allocation" in err \
            or b"MemoryError" in err:
        return "memory"
    last = (err.decode("utf-8", "replace").strip().splitlines() or ["no message"])[-1]
    raise RuntimeError(f"the constraint compiler's child process ({sys.executable}) failed with exit status "
                       f"{code}: {last[:300]}")


def _too_costly(reason: str, blame) -> InputError:
    """A refusal past a limit the estimate did not foresee: it names the costliest part, not its estimate."""
    return InputError("constraint", f"the constraint is too costly to compile: {reason}; its costliest part is "
                                    f"{blame().text(estimate=False)}")


def _overrun(result: dict, blame) -> InputError:
    doing, seconds, memory = _phases().get(result["phase"], _phases()["compile"])
    limit = f"{seconds} s of CPU" if result["overrun"] == "time" else f"{memory >> 20:,} MiB of memory"
    return _too_costly(f"{doing} went past its limit of {limit}", blame)


def schema_regex(text: str, blame) -> str:
    """The regex outlines-core writes for a checked schema's JSON text, within the budget."""
    result = run_child({"op": "regex", "schema": text, "cpu_s": REGEX_CPU_S, "memory": REGEX_MEMORY})
    if "error" in result:
        raise InputError("constraint", f"the JSON Schema cannot be compiled: {result['error']}")
    if "overrun" in result:
        raise _overrun(result, blame)
    if len(result["regex"]) > MAX_REGEX:
        raise _too_costly(f"its regex is {len(result['regex']):,} characters, over {MAX_REGEX:,}", blame)
    return result["regex"]


def compile_index(regex: str, eos: int, pieces: dict, blame, should_cancel=None):
    """outlines-core's Index of `regex` for a vocabulary ({bytes: [ids]}), within the budget."""
    task = {"op": "index", "regex": regex, "eos": eos, "pieces": pieces, "max_work": MAX_WORK,
            "max_transitions": MAX_TRANSITIONS, "probe_cpu_s": PROBE_CPU_S, "compile_cpu_s": COMPILE_CPU_S,
            "probe_memory": PROBE_MEMORY, "memory": COMPILE_MEMORY}
    result = run_child(task, should_cancel)
    if "error" in result:
        raise InputError("constraint", f"the constraint cannot be compiled for this model's tokenizer: "
                                       f"{result['error']}")
    if "overrun" in result:
        raise _overrun(result, blame)
    if "too_big" in result:
        raise _too_costly(f"its automaton has {result['too_big']:,} states, and with this tokenizer's "
                          f"{len(pieces):,} tokens that is over the budget of {MAX_WORK:,} state-token pairs "
                          "(about a minute of compiling)", blame)
    if "too_many" in result:
        raise _too_costly(f"its index has {result['too_many']:,} token transitions, over {MAX_TRANSITIONS:,}",
                          blame)
    return result["index"]
