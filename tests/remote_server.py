"""A real `python -m serve` process on loopback for the remote tests and the benchmark."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from contextlib import contextmanager
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def _files_limit(files: int):
    def limit():
        import resource

        resource.setrlimit(resource.RLIMIT_NOFILE, (files, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
    return limit


@contextmanager
def served(*args: str, env: dict | None = None, files: int | None = None, warm: bool = False):
    """Start the server on a free port (with at most `files` open files, if given); yields its URL and the
    process; stops it afterwards. No constraints compile at start unless `warm`: they would take the CPU
    the tests and benchmarks measure."""
    more = () if warm else ("--no-warm",)
    proc = subprocess.Popen([sys.executable, "-m", "serve", "--port", "0", *more, *args], cwd=REPO,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env={**os.environ, **(env or {})}, preexec_fn=files and _files_limit(files))
    try:
        url = None
        for line in proc.stdout:
            found = re.search(r"serving on (http://\S+)", line)
            if found:
                url = found.group(1)
                break
        if url is None:
            raise RuntimeError(f"the server did not start (exit {proc.wait()})")
        yield url, proc
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
