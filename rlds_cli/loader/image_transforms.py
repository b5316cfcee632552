"""Image transforms of a batch's camera frames: :class:`Resize`, :class:`CenterCrop`,
:class:`RandomCrop`, :class:`RandomShift` (DrQ's pad-and-shift) and :class:`ColorJitter`.

Each is a loader transform (``Loader(..., transform=[...])``) changing the frame keys of a whole
batch with torch ops on the batch's device. Frame keys are the dataset's camera frames (``uint8``
images: :func:`rlds_cli.frames.codecs.frame_format`) and their ``next/`` twins, unless ``keys``
names others; ``(H, W, C)`` and ``(C, H, W)`` layouts are read from the dataset. Leading
dimensions (batch, a frame stack's ``k``, a window's time) are kept; a random transform draws one
set of parameters per sample, so a stack's or window's frames move together.

Random draws are seeded from the transform's ``seed``, the key and the batch's ``index``, so a
restored loader applies the same crops and jitters again, and so do two runs with one seed.

Put them after :class:`~rlds_cli.loader.transforms.FrameStack` and before anything reading the
frames as model input (``Normalize`` on frames).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from typing import Any

import numpy as np
import torch

from rlds_cli.cache.dataset import Dataset
from rlds_cli.cache.ted import TedBatch, join_key
from rlds_cli.frames.codecs import frame_format


class ImageTransform:
    """What every image transform shares: which keys are frames, and in which layout.

    Args:
        keys: Frame keys to change (``None``: every camera-frame key of the dataset and its
            ``next/`` twin).
        seed: Seeds the random draws (see the module docstring).
    """

    def __init__(self, keys: Iterable[str | tuple[str, ...]] | None = None, seed: int = 0) -> None:
        self.keys = None if keys is None else [join_key(k) for k in keys]
        self.seed = int(seed)
        #: key -> how its frames lie: ``"hwc"``, ``"chw"`` or ``"hw"`` (gray, no channel axis)
        self._layouts: dict[str, str] = {}
        self._calls = 0

    def bind(self, dataset: Dataset) -> None:
        """Find the frame keys of ``dataset`` and their layout."""
        layouts: dict[str, str] = {}
        for key, spec in dataset.manifest.fields.items():
            fmt = spec.frame_format or frame_format(spec.shape, spec.dtype, "png")
            if fmt is not None:
                layout = "hw" if len(fmt.shape) == 2 else "chw" if fmt.channels_first else "hwc"
                layouts[key] = layouts[f"next/{key}"] = layout
        if not layouts and self.keys is None:
            raise ValueError(
                f"{type(self).__name__}: dataset {dataset.name!r} has no camera frames (uint8 images of at "
                "least 32x32) to transform"
            )
        if self.keys is not None:
            unknown = [k for k in self.keys if k not in layouts]
            if unknown:
                raise ValueError(
                    f"{type(self).__name__}: {unknown} are no camera frames of dataset {dataset.name!r} "
                    f"(its frame keys: {sorted(k for k in layouts if not k.startswith('next/'))})"
                )
            layouts = {k: layouts[k] for k in self.keys}
        self._layouts = layouts

    def __call__(self, batch: TedBatch) -> TedBatch:
        if not self._layouts:
            raise RuntimeError(f"{type(self).__name__} must be bound to a dataset (use it in a Loader)")
        index = batch.get("index")
        for key, layout in self._layouts.items():
            if key not in batch:
                continue
            value = batch[key]
            frames = torch.from_numpy(np.ascontiguousarray(value)) if isinstance(value, np.ndarray) else value
            lead = frames.ndim - len(layout)
            if lead < 1:
                raise ValueError(
                    f"{type(self).__name__}: {key!r} has shape {tuple(frames.shape)}, not a batch of frames"
                )
            # (N, M, C, H, W) with M the dimensions between the batch's and the frame's
            n = frames.shape[0]
            grid = frames.reshape(n, -1, *frames.shape[lead:])
            if layout == "hw":
                grid = grid.unsqueeze(2)
            elif layout == "hwc":
                grid = grid.permute(0, 1, 4, 2, 3)
            out = self.apply(grid, self._generator(key, index, n))
            if layout == "hw":
                out = out.squeeze(2)
            elif layout == "hwc":
                out = out.permute(0, 1, 3, 4, 2)
            out = out.contiguous().reshape(*frames.shape[:lead], *out.shape[2:])
            batch[key] = out.numpy() if isinstance(value, np.ndarray) else out
        return batch

    def _generator(self, key: str, index: Any, n: int) -> np.random.Generator:
        """The generator of this batch's draws for ``key`` (see the module docstring); a batch
        without ``index`` draws from the transform's own count of batches."""
        if index is None:
            self._calls += 1
            steps = np.array([self._calls, n], np.int64)
        else:
            steps = np.asarray(index.cpu() if isinstance(index, torch.Tensor) else index)
        digest = hashlib.blake2b(steps.tobytes() + key.encode(), digest_size=8).digest()
        return np.random.default_rng([self.seed, int.from_bytes(digest, "little")])

    def apply(self, frames: torch.Tensor, rng: np.random.Generator) -> torch.Tensor:
        """The transform of ``frames``, ``(N, M, C, H, W)`` (``N`` samples of ``M`` frames each)."""
        raise NotImplementedError


def _size(size: int | tuple[int, int]) -> tuple[int, int]:
    height, width = (size, size) if isinstance(size, int) else tuple(size)
    if height < 1 or width < 1:
        raise ValueError(f"an image size is positive, not {size!r}")
    return int(height), int(width)


def _crop(frames: torch.Tensor, top: np.ndarray, left: np.ndarray, height: int, width: int) -> torch.Tensor:
    """``frames[n, :, :, top[n]:top[n]+height, left[n]:left[n]+width]`` for every sample ``n``."""
    n = frames.shape[0]
    device = frames.device
    rows = torch.as_tensor(top, device=device)[:, None] + torch.arange(height, device=device)  # (N, h)
    cols = torch.as_tensor(left, device=device)[:, None] + torch.arange(width, device=device)  # (N, w)
    samples = torch.arange(n, device=device)[:, None, None]
    # advanced indices on N, H and W: the result is (N, h, w, M, C)
    picked = frames.permute(0, 3, 4, 1, 2)[samples, rows[:, :, None], cols[:, None, :]]
    return picked.permute(0, 3, 4, 1, 2)


def _check_fits(frames: torch.Tensor, height: int, width: int, what: str) -> None:
    if height > frames.shape[-2] or width > frames.shape[-1]:
        raise ValueError(
            f"{what} of {height}x{width} is larger than the frames ({frames.shape[-2]}x{frames.shape[-1]})"
        )


class Resize(ImageTransform):
    """Frames resized to ``size`` (``(height, width)`` or one side for a square), bilinear with
    antialiasing (what torchvision's ``Resize`` does on tensors), rounded back to ``uint8``."""

    def __init__(self, size: int | tuple[int, int], keys: Iterable[str] | None = None) -> None:
        super().__init__(keys)
        self.size = _size(size)

    def apply(self, frames: torch.Tensor, rng: np.random.Generator) -> torch.Tensor:
        n, m, c, h, w = frames.shape
        flat = frames.reshape(n * m, c, h, w).float()
        out = torch.nn.functional.interpolate(
            flat, size=self.size, mode="bilinear", antialias=True, align_corners=False
        )
        if not frames.dtype.is_floating_point:
            out = out.round_().clamp_(0, 255)
        return out.to(frames.dtype).reshape(n, m, c, *self.size)


class CenterCrop(ImageTransform):
    """The central ``size`` of every frame."""

    def __init__(self, size: int | tuple[int, int], keys: Iterable[str] | None = None) -> None:
        super().__init__(keys)
        self.size = _size(size)

    def apply(self, frames: torch.Tensor, rng: np.random.Generator) -> torch.Tensor:
        height, width = self.size
        _check_fits(frames, height, width, "CenterCrop")
        top, left = (frames.shape[-2] - height) // 2, (frames.shape[-1] - width) // 2
        return frames[..., top : top + height, left : left + width]


class RandomCrop(ImageTransform):
    """A random ``size`` crop of each sample's frames (after ``padding`` pixels of edge
    replication on every side)."""

    def __init__(
        self, size: int | tuple[int, int], padding: int = 0, keys: Iterable[str] | None = None, seed: int = 0
    ) -> None:
        super().__init__(keys, seed)
        self.size = _size(size)
        if padding < 0:
            raise ValueError(f"padding is 0 or more, not {padding}")
        self.padding = int(padding)

    def crop_size(self, frames: torch.Tensor) -> tuple[int, int]:
        """``(height, width)`` of the crop of ``frames`` (padded)."""
        return self.size

    def apply(self, frames: torch.Tensor, rng: np.random.Generator) -> torch.Tensor:
        height, width = self.crop_size(frames)
        if self.padding:
            n, m, c, h, w = frames.shape
            flat = frames.reshape(n * m, c, h, w)
            pad = (self.padding,) * 4
            # replicate needs a float tensor on the CPU (and keeps the values exactly)
            flat = torch.nn.functional.pad(flat.float(), pad, mode="replicate").to(frames.dtype)
            frames = flat.reshape(n, m, c, h + 2 * self.padding, w + 2 * self.padding)
        _check_fits(frames, height, width, "RandomCrop")
        n = frames.shape[0]
        top = rng.integers(0, frames.shape[-2] - height + 1, n)
        left = rng.integers(0, frames.shape[-1] - width + 1, n)
        return _crop(frames, top, left, height, width)


class RandomShift(RandomCrop):
    """DrQ's augmentation: each sample's frames padded by ``pad`` pixels (edge replication) and
    cropped back to their size at a random offset: a shift of up to ``pad`` pixels each way."""

    def __init__(self, pad: int = 4, keys: Iterable[str] | None = None, seed: int = 0) -> None:
        super().__init__(1, padding=pad, keys=keys, seed=seed)
        self.pad = int(pad)

    def crop_size(self, frames: torch.Tensor) -> tuple[int, int]:
        return frames.shape[-2], frames.shape[-1]  # the frames' own size, before the padding


class ColorJitter(ImageTransform):
    """Random brightness, contrast and saturation, one factor of each per sample, drawn uniformly
    in ``[1 - x, 1 + x]`` and applied in this fixed order (torchvision's ``ColorJitter``
    shuffles it), each torchvision's blend (brightness: scaled; contrast: blended with the
    frame's mean gray level; saturation: with its gray image, RGB only), rounded to ``uint8``."""

    def __init__(
        self,
        brightness: float = 0.0,
        contrast: float = 0.0,
        saturation: float = 0.0,
        keys: Iterable[str] | None = None,
        seed: int = 0,
    ) -> None:
        super().__init__(keys, seed)
        for name, value in (("brightness", brightness), ("contrast", contrast), ("saturation", saturation)):
            if not 0 <= value <= 1:
                raise ValueError(f"{name} is a fraction in [0, 1], not {value!r}")
        self.brightness, self.contrast, self.saturation = (
            float(brightness),
            float(contrast),
            float(saturation),
        )

    def apply(self, frames: torch.Tensor, rng: np.random.Generator) -> torch.Tensor:
        if frames.dtype != torch.uint8:
            raise ValueError(
                f"ColorJitter changes uint8 frames (0-255), not {frames.dtype}: put it before Normalize"
            )
        n, _, c = frames.shape[:3]
        x = frames.float()

        def factors(amount: float) -> torch.Tensor:
            drawn = rng.uniform(1 - amount, 1 + amount, n).astype(np.float32)
            return torch.as_tensor(drawn, device=frames.device)[:, None, None, None, None]

        def gray(image: torch.Tensor) -> torch.Tensor:
            if c != 3:
                return image
            weights = torch.tensor([0.299, 0.587, 0.114], device=frames.device)[:, None, None]
            return (image * weights).sum(dim=2, keepdim=True)

        if self.brightness:
            x = (x * factors(self.brightness)).clamp_(0, 255)
        if self.contrast:
            mean = gray(x).mean(dim=(2, 3, 4), keepdim=True)
            x = (mean + (x - mean) * factors(self.contrast)).clamp_(0, 255)
        if self.saturation and c == 3:
            g = gray(x)
            x = (g + (x - g) * factors(self.saturation)).clamp_(0, 255)
        return x.round_().to(torch.uint8)
