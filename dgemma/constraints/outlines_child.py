"""outlines-core's work run in a child process: a schema's regex, and a regex's token index.

outlines-core runs in Rust: a call cannot be interrupted, and an allocation it cannot get aborts the
whole process. So each call runs here, in a child Python process that imports only the standard
library and outlines-core, under an address-space limit (RLIMIT_AS) and a CPU-time limit
(RLIMIT_CPU). The index is compiled twice: first a probe against 256 one-byte tokens under tighter
limits (its states are the regex's own), then, when states x the tokenizer's tokens fits the
budget, for the real vocabulary. The parent (`budget.run_child`) kills the child on
Cancel. Windows has no rlimits: there the parent's wall-clock limit and Cancel bound it.

Protocol: a pickled task dict on stdin, a pickled result dict on stdout, the phase on stderr.
"""

import math
import pickle
import sys

END = "\\x{0}"  # the end marker the automaton compiles after the regex (automaton.py)


def _limit(kind: str, soft: float, hard: float) -> None:
    """RLIMIT_AS (bytes) or RLIMIT_CPU (seconds, from the process's start: whole seconds, rounded up)."""
    try:
        import resource
    except ImportError:  # Windows
        return
    which = resource.RLIMIT_AS if kind == "memory" else resource.RLIMIT_CPU
    resource.setrlimit(which, (math.ceil(soft), math.ceil(hard)))


def _cpu_used() -> float:
    try:
        import resource
    except ImportError:
        return 0.0
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _phase(name: str) -> None:
    sys.stderr.write(f"phase {name}\n")
    sys.stderr.flush()


def schema_regex(outlines_core, task: dict) -> dict:
    _limit("cpu", _cpu_used() + task["cpu_s"], _cpu_used() + task["cpu_s"] + 2)
    _limit("memory", task["memory"], task["memory"])
    _phase("regex")
    try:
        return {"regex": outlines_core.json_schema.build_regex_from_schema(task["schema"])}
    except (ValueError, TypeError) as err:
        return {"error": str(err).splitlines()[0][:300] if str(err) else type(err).__name__}


def index(outlines_core, task: dict) -> dict:
    """The probe, the budget check, then the real index (pickled by outlines-core itself)."""
    regex = f"(?:{task['regex']}){END}"
    probe_s, compile_s = task["probe_cpu_s"], task["compile_cpu_s"]
    hard = _cpu_used() + probe_s + compile_s + 3
    _limit("cpu", _cpu_used() + probe_s, hard)
    _limit("memory", task["probe_memory"], task["memory"])
    _phase("probe")
    try:
        probe = outlines_core.Index(regex, outlines_core.Vocabulary(256, {bytes([b]): [b] for b in range(256)}))
    except ValueError as err:
        return {"error": str(err).splitlines()[0][:300]}
    states = len(probe.get_transitions())
    del probe
    if states * len(task["pieces"]) > task["max_work"]:
        return {"too_big": states}
    _limit("cpu", _cpu_used() + compile_s, hard)
    _limit("memory", task["memory"], task["memory"])
    _phase("compile")
    vocab = outlines_core.Vocabulary(task["eos"], task["pieces"])
    try:
        found = outlines_core.Index(regex, vocab)
    except ValueError as err:
        return {"error": str(err).splitlines()[0][:300]}
    moves = found.get_transitions()
    transitions = sum(len(m) for m in moves.values())
    if transitions > task["max_transitions"]:
        return {"too_many": transitions, "states": len(moves)}
    return {"index": found, "states": len(moves), "transitions": transitions, "probe_states": states}


def main() -> None:
    task = pickle.load(sys.stdin.buffer)
    try:
        import outlines_core

        result = {"regex": schema_regex, "index": index}[task["op"]](outlines_core, task)
    except MemoryError:
        result = {"overrun": "memory"}
    _phase("done")
    sys.stdout.buffer.write(pickle.dumps(result))
    sys.stdout.buffer.flush()


if __name__ == "__main__":
    main()
