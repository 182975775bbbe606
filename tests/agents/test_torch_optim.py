"""``agents.torch_optim``: optimizer steps and state round trips without ``torch._dynamo``, bit-identical
to torch's
own ``optim.step()``. The subject is a process that has not loaded ``torch._dynamo``, so each check runs in a fresh
interpreter (pytest's own process may have loaded it, which turns ``torch_optim.step`` into ``optim.step()``)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import torch

from agents import torch_optim

REPO = Path(__file__).resolve().parents[2]

CHILD = """
import json, sys
import torch
from agents import torch_optim
from agents.nets import make_optim

def run(optim_spec, eager, steps=7):
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(5, 32), torch.nn.ReLU(), torch.nn.Linear(32, 3))
    optim = make_optim(net.parameters(), optim_spec)
    x, y = torch.randn(64, 5), torch.randn(64, 3)
    for i in range(steps):
        for p in net.parameters():
            p.grad = None
        ((net(x) - y) ** 2).mean().backward()
        torch_optim.step(optim) if eager else optim.step()
        if i == 3:  # a state round trip mid-run (as a checkpoint restore does)
            optim.load_state_dict(optim.state_dict())
    return [p.detach().clone() for p in net.parameters()], optim.state_dict()

specs = [{"name": "Adam", "lr": 1e-2}, {"name": "AdamW", "lr": 1e-2, "weight_decay": 0.1},
         {"name": "Adam", "lr": 1e-2, "foreach": True}, {"name": "RMSprop", "lr": 1e-3},
         {"name": "SGD", "lr": 1e-2, "momentum": 0.9}]
out = {"dynamo_after_eager": [], "equal": []}
for spec in specs:
    eager = run(spec, eager=True)
    out["dynamo_after_eager"].append("torch._dynamo" in sys.modules)
    out["equal"].append(all(torch.equal(a, b) for a, b in zip(eager[0], run(spec, eager=False)[0])))
out["dynamo_at_end"] = "torch._dynamo" in sys.modules  # torch's own step (the reference) loaded it
print(json.dumps(out))
"""


def test_eager_steps_equal_torchs_step_bit_for_bit_and_load_no_dynamo():
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    out = subprocess.run([sys.executable, "-c", CHILD], cwd=REPO, env=env, capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    # the first optimizer's eager run (built, stepped, state saved and loaded) came before any torch step
    assert result["dynamo_after_eager"][0] is False
    assert result["dynamo_at_end"] is True  # the reference runs did load it: the check above can fail
    assert result["equal"] == [True] * 5


def test_step_calls_torchs_step_for_a_differentiable_optimizer():
    w = torch.nn.Parameter(torch.tensor([1.0, -2.0]))
    calls = []
    optim = torch.optim.SGD([w], lr=0.5, differentiable=True)
    optim.step = lambda: calls.append("torch")  # torch's wrapper sets grad mode for a differentiable step
    torch_optim.step(optim)
    plain = torch.optim.SGD([w], lr=0.5)
    plain.step = lambda: calls.append("plain")
    w.grad = torch.tensor([0.2, 0.4])
    torch_optim.step(plain)
    assert calls == ["torch"] + (["plain"] if "torch._dynamo" in sys.modules else [])
    if "torch._dynamo" not in sys.modules:
        assert torch.equal(w.detach(), torch.tensor([0.9, -2.2]))  # the class's own step ran


def test_undecorated_step_is_the_classs_own_step():
    assert torch_optim._undecorated_step(torch.optim.Adam).__qualname__ == "Adam.step"
    assert torch_optim._undecorated_step(torch.optim.SGD).__qualname__ == "SGD.step"
