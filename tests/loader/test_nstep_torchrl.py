"""``NStepReturn`` against TorchRL itself: the n-step batch holds what TorchRL's ``MultiStep``
writes (summed rewards, the observation ``k`` steps later, ``steps_to_next_obs = k``), so a TorchRL
value estimator fed an rlds n-step batch bootstraps with ``gamma ** k``, not ``gamma``.

The dataset is written with tensordict (``TensorDict.memmap``) and imported with rlds; TorchRL's
``MultiStep`` runs on the same TensorDict. Skipped when torchrl is not installed.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")
tensordict = pytest.importorskip("tensordict")
pytest.importorskip("torchrl")

from tensordict.nn import TensorDictModule  # noqa: E402
from torchrl.data.postprocs import MultiStep  # noqa: E402
from torchrl.objectives.value import TD0Estimator  # noqa: E402

from rlds_cli.cache import open_dataset  # noqa: E402
from rlds_cli.loader import Loader  # noqa: E402
from rlds_cli.loader.transforms import NStepReturn  # noqa: E402
from rlds_cli.sources.convert import convert  # noqa: E402

N_STEPS, GAMMA = 3, 0.9
#: (length, terminated): a terminated, a short truncated, and a long terminated episode
EPISODES = [(5, True), (2, False), (6, True)]


class InOrder:
    """A sampler returning every step once, in dataset order."""

    def __init__(self, n: int) -> None:
        self.n = n

    def sample(self) -> np.ndarray:
        return np.arange(self.n, dtype=np.int64)


def _ted() -> Any:
    """The episodes as one ``[N]`` TED TensorDict, rewards ``[N, 2]`` (a vector reward)."""
    parts = []
    for e, (length, terminated) in enumerate(EPISODES):
        t = torch.arange(length + 1, dtype=torch.float32)
        obs = torch.stack([t + 10 * e, torch.sin(t + e)], dim=-1)
        done = torch.zeros(length, 1, dtype=torch.bool)
        done[-1] = True
        reward = torch.stack([t[:-1] + 1 + e, -(t[:-1] ** 2)], dim=-1)
        parts.append(
            tensordict.TensorDict(
                {
                    "observation": obs[:-1],
                    "action": torch.zeros(length, 1),
                    "next": {
                        "observation": obs[1:],
                        "reward": reward,
                        "done": done,
                        "terminated": done & terminated,
                        "truncated": done & (not terminated),
                    },
                },
                batch_size=[length],
            )
        )
    return torch.cat(parts)


@pytest.fixture
def pair(tmp_path: Path) -> tuple[Any, Any]:
    """(rlds n-step batch of every step as a TensorDict, TorchRL's MultiStep output)."""
    ted = _ted()
    ted.memmap(tmp_path / "td")
    convert(tmp_path / "td", "nstep")
    ds = open_dataset("nstep")
    loader = Loader(
        ds,
        ds.num_steps,
        sampler=InOrder(ds.num_steps),
        transform=NStepReturn(N_STEPS, GAMMA),
        as_tensordict=True,
    )
    ours = loader.sample()
    theirs = MultiStep(gamma=GAMMA, n_steps=N_STEPS)(ted.clone())
    return ours, theirs


def test_batch_matches_torchrl_multistep(pair: tuple[Any, Any]) -> None:
    ours, theirs = pair
    assert ours["steps_to_next_obs"].dtype == theirs["steps_to_next_obs"].dtype == torch.int64
    torch.testing.assert_close(ours["steps_to_next_obs"], theirs["steps_to_next_obs"].reshape(-1))
    torch.testing.assert_close(ours["next", "observation"], theirs["next", "observation"])
    torch.testing.assert_close(ours["next", "reward"], theirs["next", "reward"])  # both columns
    k = ours["steps_to_next_obs"].unsqueeze(-1).float()
    torch.testing.assert_close(ours["next", "discount"], GAMMA**k)


def _value_net() -> Any:
    torch.manual_seed(0)
    return TensorDictModule(torch.nn.Linear(2, 1), in_keys=["observation"], out_keys=["state_value"])


def test_td0_estimator_bootstraps_with_gamma_to_the_k(pair: tuple[Any, Any]) -> None:
    ours, theirs = pair
    net = _value_net()
    ours = ours.select(
        "observation", "steps_to_next_obs", ("next", "observation"), ("next", "done"), ("next", "terminated")
    )
    ours["next", "reward"] = pair[0]["next", "reward"][:, :1]  # the estimator takes one reward column
    estimator = TD0Estimator(gamma=GAMMA, value_network=net)
    with torch.no_grad():
        target = estimator.value_estimate(ours.clone())
        v_next = net(ours["next"].clone())["state_value"]
    k = ours["steps_to_next_obs"].unsqueeze(-1).float()
    not_terminal = (~ours["next", "terminated"]).float()
    want = ours["next", "reward"] + GAMMA**k * not_terminal * v_next
    torch.testing.assert_close(target, want)
    # without steps_to_next_obs TorchRL discounts the bootstrap by gamma once: wrong for k > 1
    with torch.no_grad():
        one_step = estimator.value_estimate(ours.exclude("steps_to_next_obs").clone())
    longer = (k[:, 0] > 1) & (not_terminal[:, 0] > 0)
    assert longer.any() and not torch.allclose(one_step[longer], want[longer])
    # TorchRL's own MultiStep pipeline gives the same targets where its done flags agree: MultiStep
    # keeps each step's own next/done, rlds moves the flags to the last step summed (so rlds never
    # bootstraps from a terminal state); they agree where that last step is not terminal
    theirs = theirs.clone()
    theirs["next", "reward"] = theirs["next", "reward"][:, :1]
    with torch.no_grad():
        their_target = estimator.value_estimate(theirs)
    agree = (not_terminal[:, 0] > 0) | (k[:, 0] == 1)
    torch.testing.assert_close(their_target[agree], target[agree])
