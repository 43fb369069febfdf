"""Runs one prefill in a fresh process and prints JSON: used for cross-process tests."""

import json
import os
import sys

sys.path.insert(0, os.path.abspath(os.path.join(os.path.dirname(__file__), "..")))
sys.path.insert(0, os.path.dirname(__file__))

from harness_util import engine, prompt, reference  # noqa: E402


def main():
    mode, socket_path, model, kind, seed, n = sys.argv[1:7]
    p = prompt(int(seed), int(n))
    if mode == "vllm":
        e = engine(socket_path, model, kind)
        got = e.prefill(p)
        external = e.steps[0].external_tokens
        e.close()
    else:
        from sglang_util import sglang_prefill
        got, external = sglang_prefill(socket_path, model, p)
    print(json.dumps({"external": external, "diff": (got - reference(p)).abs().max().item()}))


if __name__ == "__main__":
    main()
