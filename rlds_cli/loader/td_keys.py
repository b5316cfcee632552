"""Where the sampler's extras go in TensorDict batches: under the keys TorchRL's losses read.

rlds samplers add ``weight`` (prioritized importance weights) and ``mask`` (``False`` on slice
padding) to a batch. Native batches (:class:`~rlds_cli.cache.ted.TedBatch`) keep those names.
TensorDict batches (``as_tensordict=True``) are for TorchRL, whose loss modules (0.14) read the
importance weights from ``"priority_weight"`` (``tensor_keys.priority_weight`` of DQN, DDPG,
TD3, TD3+BC, SAC, discrete SAC, TQC) and the validity mask from ``("collector", "mask")``
(``LossModule.loss_mask_key="auto"``, read by every loss that reduces through
``_reduce_loss``: IQL, CQL, discrete CQL, TD3+BC, DQN, ...), as TorchRL's own
``PrioritizedSampler`` and ``SliceSampler(pad_output=True)`` write them. So a TensorDict batch
carries them there, and a TorchRL loss weights and masks it with no ``set_keys``.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

#: rlds extra -> the TED key (``"/"``-joined) a TensorDict batch carries it under
TORCHRL_KEYS = {"weight": "priority_weight", "mask": "collector/mask"}


def torchrl_paths(keys: Iterable[str], extras: Iterable[str]) -> list[str]:
    """The TED paths a TensorDict batch carries ``keys`` under: the sampler's ``extras`` among
    ``weight``/``mask`` at TorchRL's keys, every other key (a dataset's own ``weight`` or ``mask``,
    not an extra, included) where it is."""
    moved = {name for name in extras if name in TORCHRL_KEYS}
    return [TORCHRL_KEYS[k] if k in moved else k for k in keys]


def drop_padding(td: Any) -> Any:
    """The real steps of a TensorDict batch of slices: its rows where ``("collector", "mask")``
    is True, as a one-dimensional batch (a copy; a batch without the mask is returned as is).

    For losses that do not see the mask: TorchRL 0.14.1's ``IQLLoss.qvalue_loss`` reduces over a
    ``select`` of the batch that leaves the mask out, so its ``loss_qvalue`` counts the padding.
    On ``drop_padding(td)`` every loss term is the masked one (one-step losses do not need the
    slice shape; the importance weights travel with their rows).
    """
    mask = td.get(("collector", "mask"), None)
    return td if mask is None else td[mask].exclude(("collector", "mask"))
