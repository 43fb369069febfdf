"""CacheBlend's quality on the trained model, through the evaluation command.

The model is trained in-tree (kvtier.harness.blend_task) and its weights are
cached outside the clone; .ci/run trains it before the tests when the cache
lacks it, and this test does the same when run on its own. The evaluation
runs as a subprocess so it gets the same BLAS as the documented command.
Only quality is checked here: speed is reported by the command, never
asserted.
"""

import json
import os
import subprocess
import sys

import pytest

from kvtier.harness import blend_task as bt

HERE = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))


@pytest.fixture(scope="module")
def trained():
    path = bt.weights_path(bt.TrainConfig())
    if not os.path.exists(path):
        subprocess.run([sys.executable, "-m", "kvtier.harness.blend_task"], cwd=HERE, check=True, timeout=5400)
    assert os.path.exists(path)
    return path


def test_quality_on_trained_model(trained, kvtier_bin, tmp_path):
    out = tmp_path / "blend.json"
    # Eight queries over documents of 100-250 tokens keep this test to a
    # minute; the documented table uses the full 300-1,000-token workload.
    subprocess.run([sys.executable, "-m", "kvtier.harness.blend_eval", "--queries", "8", "--ratios", "0,15,100",
                    "--doc-min", "100", "--doc-max", "250", "--kvtier-bin", kvtier_bin, "--json", str(out)],
                   cwd=HERE, check=True, timeout=1800)
    res = json.loads(out.read_text())
    rows = {float(k): v for k, v in res["rows"].items()}
    # All tokens recomputed: the machinery adds no error.
    assert rows[100.0]["max_logit_err"] <= 1e-5
    assert rows[100.0]["agree"] == 1.0
    # Reuse without recompute loses the marks other documents put on the
    # asked value: the first token's distribution moves and answers change;
    # recomputing 15% of the reused tokens removes at least half of the KL
    # (the goal; on these eight queries 0.27x at the time of writing,
    # docs/blend.md has the full workload). A model whose documents did not
    # read each other (KL ~0 at 0%) or whose deviation is spread over all
    # tokens (the earlier value-lookup model: 0.70x at 15%) fails here.
    assert rows[0.0]["kl"] > 1e-3
    assert rows[0.0]["agree"] < 1.0
    assert rows[15.0]["kl"] <= 0.5 * rows[0.0]["kl"]
