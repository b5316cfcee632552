"""Real TorchRL 0.14 losses on rlds TensorDict batches: importance weights and slice padding
reach them under the keys they read (``priority_weight``, ``("collector", "mask")``).

Each loss runs twice on the same batch with the same random seed: once on the batch as rlds
returns it, once with reduction ``"none"`` on the batch without the weight and mask (the raw
per-step losses). The first must equal the weighted, masked mean computed by hand from the
second: ``sum(l * w * m) / sum(w * m)`` for losses that read priority weights (TD3+BC, DQN),
``sum(l * m) / sum(m)`` for those that read only the mask (IQL, CQL, discrete CQL).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from rlds_cli.cache.dataset import Dataset
from rlds_cli.loader import Loader
from rlds_cli.loader.tensors import drop_padding
from tests.loader_fixtures import TedFactory, make_ted

pytest.importorskip("torchrl")
from tensordict import TensorDict
from tensordict.nn import NormalParamExtractor, TensorDictModule
from torch import nn
from torchrl.data import Bounded, OneHot
from torchrl.modules import MLP, ProbabilisticActor, QValueActor, TanhNormal, ValueOperator
from torchrl.objectives import CQLLoss, DiscreteCQLLoss, DQNLoss, IQLLoss, TD3BCLoss

OBS, ACT, N_DISCRETE = 3, 2, 3
WEIGHT, MASK = "priority_weight", ("collector", "mask")


@pytest.fixture(scope="module")
def batch(ted_dataset: TedFactory) -> Iterator[TensorDict]:
    """Prioritized slices of 4 over episodes of 2, 3, 5 and 7 steps: the short episodes are
    padded (mask False), and uneven priorities make uneven importance weights."""
    ds: Dataset = ted_dataset([2, 3, 5, 7], "tlosses")
    loader = Loader(ds, 24, sampler="prioritized", slice_len=4, short="pad", as_tensordict=True, seed=3)
    loader.update_priority(np.arange(ds.num_steps), np.linspace(0.1, 3.0, ds.num_steps))
    td = loader.sample()
    yield td


def test_batch_has_torchrl_keys(batch: TensorDict) -> None:
    assert batch.batch_size == (6, 4)
    assert batch[WEIGHT].dtype == torch.float32 and batch[MASK].dtype == torch.bool
    assert not batch[MASK].all() and batch[MASK].any()  # some padding, some real steps
    assert batch[WEIGHT].unique().numel() > 1  # uneven weights
    assert not {"weight", "mask"} & set(batch.keys())


def _qvalue() -> ValueOperator:
    return ValueOperator(
        MLP(in_features=OBS + ACT, out_features=1, num_cells=[8]), in_keys=["observation", "action"]
    )


def _stochastic_actor() -> ProbabilisticActor:
    module = TensorDictModule(
        nn.Sequential(MLP(in_features=OBS, out_features=2 * ACT, num_cells=[8]), NormalParamExtractor()),
        in_keys=["observation"],
        out_keys=["loc", "scale"],
    )
    return ProbabilisticActor(
        module,
        in_keys=["loc", "scale"],
        distribution_class=TanhNormal,
        return_log_prob=True,
        spec=Bounded(-1.0, 1.0, (ACT,)),
    )


def _td3bc() -> TD3BCLoss:
    actor = TensorDictModule(
        nn.Sequential(MLP(in_features=OBS, out_features=ACT, num_cells=[8]), nn.Tanh()),
        in_keys=["observation"],
        out_keys=["action"],
    )
    return TD3BCLoss(actor, _qvalue(), action_spec=Bounded(-1.0, 1.0, (ACT,)))


def _iql() -> IQLLoss:
    value = ValueOperator(MLP(in_features=OBS, out_features=1, num_cells=[8]), in_keys=["observation"])
    return IQLLoss(_stochastic_actor(), _qvalue(), value)


def _cql() -> CQLLoss:
    return CQLLoss(_stochastic_actor(), _qvalue(), action_spec=Bounded(-1.0, 1.0, (ACT,)))


def _q_actor() -> QValueActor:
    return QValueActor(
        MLP(in_features=OBS, out_features=N_DISCRETE, num_cells=[8]),
        in_keys=["observation"],
        spec=OneHot(N_DISCRETE),
    )


def _dqn() -> DQNLoss:
    return DQNLoss(_q_actor(), action_space="one-hot")


def _discrete_cql() -> DiscreteCQLLoss:
    return DiscreteCQLLoss(_q_actor(), action_space="one-hot")


# loss factory, the loss terms compared, whether they read priority weights, discrete actions
CASES: dict[str, tuple[Callable[[], Any], tuple[str, ...], bool, bool]] = {
    "td3_bc": (_td3bc, ("loss_actor", "loss_qvalue"), True, False),
    "iql": (_iql, ("loss_actor", "loss_qvalue", "loss_value"), False, False),
    "cql": (_cql, ("loss_actor_bc", "loss_qvalue", "loss_actor", "loss_cql"), False, False),
    "dqn": (_dqn, ("loss",), True, True),
    "discrete_cql": (_discrete_cql, ("loss_qvalue", "loss_cql"), False, True),
}

#: TorchRL 0.14.1's IQLLoss.qvalue_loss reduces over tensordict.select("next", obs, action): the
#: mask is not in it, so the padding counts (rlds_cli.loader.tensors.drop_padding is the way out)
MASK_IGNORED = {("iql", "loss_qvalue")}


def _prepared(batch: TensorDict, discrete: bool) -> TensorDict:
    td = batch.clone()
    td["next", "reward"] = td["next", "reward"] / 10.0  # keep targets small
    if discrete:  # a discrete action derived from the rlds row (the fixture's actions are continuous)
        td["action"] = nn.functional.one_hot(td["index"] % N_DISCRETE, N_DISCRETE)
    else:
        td["action"] = td["action"].tanh()  # inside the action spec
    return td


@pytest.mark.parametrize("name", list(CASES))
def test_weights_and_mask_reach_the_loss(batch: TensorDict, name: str) -> None:
    make, terms, weighted, discrete = CASES[name]
    torch.manual_seed(0)
    loss = make()
    td = _prepared(batch, discrete)
    torch.manual_seed(1)
    got = loss(td.clone())
    raw_td = td.exclude(WEIGHT, MASK)
    loss.reduction = "none"
    torch.manual_seed(1)
    raw = loss(raw_td.clone())
    loss.reduction = "mean"
    torch.manual_seed(1)
    plain = loss(raw_td.clone())
    m = td[MASK].to(torch.float32)
    w = td[WEIGHT] * m if weighted else m
    for term in terms:
        per_step = raw[term]
        assert per_step.shape == td.batch_size, term
        want = (per_step * w).sum() / w.sum()
        if (name, term) in MASK_IGNORED:  # TorchRL drops the mask here: the plain mean
            torch.testing.assert_close(got[term], plain[term], msg=f"{name} {term}")
            continue
        torch.testing.assert_close(got[term], want, msg=f"{name} {term}")
        # and the weights/mask made a difference: the unweighted, unmasked mean is another number
        torch.testing.assert_close(plain[term], per_step.mean(), msg=f"{name} {term} plain")
        assert not torch.isclose(got[term], plain[term]), f"{name} {term}"


def test_drop_padding_masks_every_iql_term(batch: TensorDict) -> None:
    """On ``drop_padding(td)`` (the real steps, flat) every IQL term, ``loss_qvalue`` included,
    is the masked mean of the per-step losses of the whole batch (IQL draws nothing at random)."""
    torch.manual_seed(0)
    loss = _iql()
    td = _prepared(batch, False)
    got = loss(drop_padding(td))
    loss.reduction = "none"
    raw = loss(td.exclude(WEIGHT, MASK))
    m = td[MASK].to(torch.float32)
    assert drop_padding(td).batch_size == (int(m.sum()),)
    for term in CASES["iql"][1]:
        torch.testing.assert_close(got[term], (raw[term] * m).sum() / m.sum(), msg=term)


def test_reduction_sum_weights_without_normalising(batch: TensorDict) -> None:
    """With ``reduction="sum"`` the priority weights multiply each masked step: TD3+BC's
    ``loss_qvalue`` is ``sum(l * w * m)``."""
    torch.manual_seed(0)
    loss = _td3bc()
    td = _prepared(batch, False)
    loss.reduction = "none"
    torch.manual_seed(1)
    raw = loss(td.exclude(WEIGHT, MASK))["loss_qvalue"]
    loss.reduction = "sum"
    torch.manual_seed(1)
    got = loss(td.clone())["loss_qvalue"]
    torch.testing.assert_close(got, (raw * td[WEIGHT] * td[MASK]).sum())


def test_native_batches_keep_rlds_names(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Only TensorDict batches move the extras: a TedBatch keeps ``weight`` and ``mask``."""
    monkeypatch.setenv("RLDS_FSYNC", "0")
    ds = make_ted(tmp_path, "native", [2, 5])
    b = Loader(ds, 8, sampler="prioritized", slice_len=4, short="pad", seed=0).sample()
    assert "weight" in b and "mask" in b and "priority_weight" not in b
