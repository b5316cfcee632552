"""TFDS ``features.json``: the shapes, dtypes and encodings of a TFDS dataset's features.

TFDS writes the ``FeatureConnector`` tree as the JSON form of its ``Feature`` protobuf
(``tensorflow_datasets/core/proto/feature.proto``; lowerCamelCase field names, int64s as
strings). Each node has ``pythonClassName`` and one content field:

* ``featuresDict: {features: {name: node}}``: a ``FeaturesDict``;
* ``sequence: {feature: node, length: "-1"}``: a ``Sequence`` (and RLDS's ``Dataset`` for ``steps``);
* ``tensor: {shape: {dimensions: ["7"]}, dtype: "float32", encoding: "none"}``: a ``Tensor`` or
  ``Scalar`` (``shape: {}``); encoding ``bytes``/``zlib`` stores each value as raw (zlib) bytes;
* ``image: {shape: {dimensions: ["64", "64", "3"]}, dtype: "uint8", encodingFormat: "png"}``;
* ``text: {}``: a string;
* ``classLabel: {numClasses: "10"}``: an int64 scalar.

In the ``tf.train.Example`` a nested feature is named by its ``/``-joined path
(``steps/observation/image``); inside a sequence, all elements' values are concatenated: a
``Tensor`` of shape ``S`` in ``steps`` holds ``T * prod(S)`` values (integers and bools as int64,
floats as float32, strings and encoded images as bytes, one per step).

:func:`parse_features` turns the JSON into :class:`Leaf` s, accepting camelCase and the proto's
snake_case names. The ``{"type": ..., "content": ...}`` form of TFDS before 4.5 is refused with a
message saying so.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rlds_cli.errors import SourceFormatError

TENSOR, IMAGE, TEXT = "tensor", "image", "text"
#: dtype names a ``tensor``/``image`` may have, as TFDS writes them.
NUMERIC_DTYPES = frozenset(
    {
        "bool",
        "int8",
        "int16",
        "int32",
        "int64",
        "uint8",
        "uint16",
        "uint32",
        "uint64",
        "float16",
        "float32",
        "float64",
    }
)
STRING_DTYPES = frozenset({"string", "str", "object", "bytes"})
TENSOR_ENCODINGS = frozenset({"", "none", "bytes", "zlib"})
IMAGE_FORMATS = frozenset({"", "png", "jpeg", "jpg"})
#: Deepest nesting of dicts and sequences read (a hostile file cannot recurse without end).
MAX_DEPTH = 32
#: Most dimensions of one feature, and the most values one element may declare.
MAX_DIMS = 8
MAX_ELEMENT_VALUES = 1 << 31


@dataclass(frozen=True)
class Leaf:
    """One feature with values (not a dict or a sequence).

    Attributes:
        path: Its names from the root (``("steps", "observation", "image")``).
        kind: :data:`TENSOR`, :data:`IMAGE` or :data:`TEXT` (a string tensor is text).
        dtype: numpy dtype name of its values (``None`` for text).
        shape: Shape of one element (one step, for ``steps/*``); ``-1`` is an unknown size.
        encoding: Tensor: ``"none"``, ``"bytes"`` or ``"zlib"``; image: ``"png"``, ``"jpeg"`` or ``""``.
        sequence: Whether it is inside the ``steps`` sequence (one element per step).
        class_name: Its ``pythonClassName`` (for messages).
    """

    path: tuple[str, ...]
    kind: str
    dtype: str | None
    shape: tuple[int, ...]
    encoding: str = "none"
    sequence: bool = False
    class_name: str = ""

    @property
    def name(self) -> str:
        """Its name in the ``Example`` (the path joined with ``/``)."""
        return "/".join(self.path)

    @property
    def known_values(self) -> int:
        """Values one element holds in the ``Example``, ignoring unknown (-1) sizes."""
        if self.kind != TENSOR or self.encoding != "none":
            return 1  # one string, one encoded image, one raw-bytes blob per element
        count = 1
        for dim in self.shape:
            count *= dim if dim >= 0 else 1
        return count


@dataclass
class Features:
    """What :func:`parse_features` found.

    Attributes:
        steps: Leaves inside ``steps`` (one element per step).
        episode: Leaves outside it (one element per episode: ``episode_metadata/*``, ...).
        skipped: ``(name, why)`` for features that are not read.
    """

    steps: list[Leaf] = field(default_factory=list)
    episode: list[Leaf] = field(default_factory=list)
    skipped: list[tuple[str, str]] = field(default_factory=list)


def _get(node: dict[str, Any], camel: str, snake: str) -> Any:
    return node[camel] if camel in node else node.get(snake)


def _int(value: Any, where: Path, what: str) -> int:
    """An int64 of the JSON (a string, as protobuf writes them, or a number)."""
    if isinstance(value, bool):
        raise SourceFormatError(f"{where}: {what} is {value!r}, not an integer")
    if isinstance(value, int):
        return value
    if isinstance(value, str):
        try:
            return int(value.strip())
        except ValueError:
            pass
    raise SourceFormatError(f"{where}: {what} is {value!r}, not an integer")


def _shape(spec: dict[str, Any], where: Path, name: str) -> tuple[int, ...]:
    shape = spec.get("shape") or {}
    if not isinstance(shape, dict):
        raise SourceFormatError(f"{where}: feature {name!r} has the shape {shape!r}, not an object")
    dims = shape.get("dimensions") or []
    if not isinstance(dims, list) or len(dims) > MAX_DIMS:
        raise SourceFormatError(f"{where}: feature {name!r} has the dimensions {dims!r}")
    out = tuple(_int(d, where, f"a dimension of {name!r}") for d in dims)
    if any(d < -1 for d in out):
        raise SourceFormatError(f"{where}: feature {name!r} has the shape {list(out)} (sizes must be >= -1)")
    count = 1
    for d in out:
        count *= max(d, 1)
    if count > MAX_ELEMENT_VALUES:
        raise SourceFormatError(
            f"{where}: feature {name!r} declares the shape {list(out)}, over {MAX_ELEMENT_VALUES:,} values "
            "per element"
        )
    return out


def _dtype(spec: dict[str, Any], where: Path, name: str) -> str:
    dtype = spec.get("dtype")
    if not isinstance(dtype, str):
        raise SourceFormatError(f"{where}: feature {name!r} has no dtype")
    dtype = dtype.lower()
    if dtype in STRING_DTYPES:
        return "string"
    if dtype not in NUMERIC_DTYPES:
        raise SourceFormatError(
            f"{where}: feature {name!r} has the dtype {dtype!r}; rlds reads "
            f"{', '.join(sorted(NUMERIC_DTYPES))} and strings"
        )
    return dtype


class _Parser:
    def __init__(self, where: Path) -> None:
        self.where = where
        self.out = Features()

    def node(self, node: Any, path: tuple[str, ...], sequence: bool, depth: int) -> None:
        name = "/".join(path) or "(root)"
        if depth > MAX_DEPTH:
            raise SourceFormatError(f"{self.where}: features nest over {MAX_DEPTH} levels deep at {name!r}")
        if not isinstance(node, dict):
            raise SourceFormatError(f"{self.where}: feature {name!r} is {type(node).__name__}, not an object")
        if "type" in node and "content" in node and "pythonClassName" not in node:
            raise SourceFormatError(
                f"{self.where} is in the old TFDS 'type'/'content' layout (TFDS before 4.5), which rlds "
                "does not read",
                hint="re-save the dataset's features with a recent tensorflow-datasets "
                "(builder.info.features.save_config)",
            )
        cls = str(_get(node, "pythonClassName", "python_class_name") or "")
        short = cls.rsplit(".", 1)[-1] or "feature"
        fdict = _get(node, "featuresDict", "features_dict")
        if fdict is not None:
            features = fdict.get("features") if isinstance(fdict, dict) else None
            if features is None:
                features = {}
            if not isinstance(features, dict):
                raise SourceFormatError(f"{self.where}: the features of {name!r} are not an object")
            for child, sub in features.items():
                if not isinstance(child, str) or not child:
                    raise SourceFormatError(f"{self.where}: {name!r} has a feature with an empty name")
                self.node(sub, (*path, child), sequence, depth + 1)
            return
        seq = node.get("sequence")
        if seq is not None:
            if not isinstance(seq, dict) or "feature" not in seq:
                raise SourceFormatError(f"{self.where}: the sequence {name!r} has no feature")
            if path == ("steps",):
                self.node(seq["feature"], path, True, depth + 1)
            else:
                why = "a sequence inside steps (ragged values)" if sequence else "a sequence other than steps"
                self.out.skipped.append((name, why))
            return
        leaf = self._leaf(node, path, sequence, cls, short, name)
        if leaf is not None:
            (self.out.steps if sequence else self.out.episode).append(leaf)

    def _leaf(
        self, node: dict[str, Any], path: tuple[str, ...], sequence: bool, cls: str, short: str, name: str
    ) -> Leaf | None:
        where = self.where
        if not path:
            raise SourceFormatError(f"{where}: the top level is a {short}, not a FeaturesDict")
        tensor = node.get("tensor")
        if tensor is not None:
            if not isinstance(tensor, dict):
                raise SourceFormatError(f"{where}: feature {name!r} has a tensor that is not an object")
            shape = _shape(tensor, where, name)
            dtype = _dtype(tensor, where, name)
            encoding = str(tensor.get("encoding") or "none").lower()
            if encoding not in TENSOR_ENCODINGS:
                raise SourceFormatError(
                    f"{where}: feature {name!r} has the encoding {encoding!r} (TFDS writes none, bytes, zlib)"
                )
            encoding = encoding or "none"
            if dtype == "string":
                if shape:
                    self.out.skipped.append(
                        (name, f"strings of shape {list(shape)} (only one string per element is read)")
                    )
                    return None
                return Leaf(path, TEXT, None, (), "none", sequence, cls)
            if sum(d < 0 for d in shape) > 1:
                self.out.skipped.append((name, f"a tensor of dynamic shape {list(shape)}"))
                return None
            if encoding != "none" and any(d < 0 for d in shape):
                self.out.skipped.append((name, f"a {encoding}-encoded tensor of unknown shape {list(shape)}"))
                return None
            return Leaf(path, TENSOR, dtype, shape, encoding, sequence, cls)
        image = node.get("image")
        if image is not None:
            if not isinstance(image, dict):
                raise SourceFormatError(f"{where}: feature {name!r} has an image that is not an object")
            shape = _shape(image, where, name)
            dtype = _dtype(image, where, name)
            fmt = str(_get(image, "encodingFormat", "encoding_format") or "").lower()
            if fmt not in IMAGE_FORMATS:
                raise SourceFormatError(
                    f"{where}: image {name!r} has the encoding {fmt!r}; rlds decodes png and jpeg"
                )
            if len(shape) != 3 or shape[2] not in (1, 3, 4):
                raise SourceFormatError(
                    f"{where}: image {name!r} has the shape {list(shape)}; rlds reads (height, width, "
                    "1, 3 or 4 channels)"
                )
            if dtype not in ("uint8", "uint16") or (dtype == "uint16" and shape[2] != 1):
                raise SourceFormatError(
                    f"{where}: image {name!r} holds {dtype} with {shape[2]} channels; rlds decodes uint8 "
                    "images and single-channel uint16 PNGs"
                )
            return Leaf(path, IMAGE, dtype, shape, "jpeg" if fmt == "jpg" else fmt, sequence, cls)
        if node.get("text") is not None:
            return Leaf(path, TEXT, None, (), "none", sequence, cls)
        label = _get(node, "classLabel", "class_label")
        if label is not None:
            return Leaf(path, TENSOR, "int64", (), "none", sequence, cls)
        bbox = _get(node, "boundingBox", "bounding_box")
        if isinstance(bbox, dict):
            return Leaf(
                path, TENSOR, _dtype(bbox, where, name), _shape(bbox, where, name), "none", sequence, cls
            )
        kinds = sorted(
            k for k in node if k not in ("pythonClassName", "python_class_name", "description", "valueRange")
        )
        self.out.skipped.append(
            (name, f"a {short} ({', '.join(kinds) or 'no content'}), which rlds does not read")
        )
        return None


def parse_features(doc: Any, where: Path) -> Features:
    """The leaves of a ``features.json`` document (already parsed from JSON).

    Raises:
        SourceFormatError: The document is not a ``FeaturesDict`` holding a ``steps`` sequence, or a
            feature is malformed (its name and ``where`` in the message).
    """
    if not isinstance(doc, dict) or _get(doc, "featuresDict", "features_dict") is None:
        if isinstance(doc, dict) and "type" in doc and "content" in doc:
            _Parser(where).node(doc, (), False, 0)  # raises the old-layout message
        raise SourceFormatError(
            f"{where}: the top level is not a FeaturesDict (no 'featuresDict')",
            hint="features.json is the one TFDS writes next to the shards; is this the right file?",
        )
    parser = _Parser(where)
    parser.node(doc, (), False, 0)
    features = parser.out
    if not features.steps:
        top = _get(doc, "featuresDict", "features_dict")
        names = (
            sorted(top.get("features", {}))
            if isinstance(top, dict) and isinstance(top.get("features"), dict)
            else []
        )
        raise SourceFormatError(
            f"{where}: no 'steps' sequence with readable features (top-level features: "
            f"{', '.join(names) or 'none'}); an RLDS dataset holds its steps there"
        )
    return features


# --------------------------------------------------------------------------- writing

#: The module of TFDS's feature classes, as ``pythonClassName`` names them.
FEATURES_MODULE = "tensorflow_datasets.core.features"


def _dims(shape: tuple[int, ...]) -> dict[str, Any]:
    return {"dimensions": [str(d) for d in shape]} if shape else {}


def tensor_node(
    shape: tuple[int, ...], dtype: str, *, encoding: str = "none", doc: str = ""
) -> dict[str, Any]:
    """A ``Tensor`` (a ``Scalar`` for shape ``()``) as TFDS writes it in ``features.json``. ``encoding``
    ``"bytes"`` stores each element as raw little-endian bytes and is always a ``Tensor`` (TFDS's
    ``Scalar`` drops the encoding on load)."""
    cls = "scalar.Scalar" if not shape and encoding == "none" else "tensor_feature.Tensor"
    spec = {"shape": _dims(shape), "dtype": dtype, "encoding": encoding}
    return {"pythonClassName": f"{FEATURES_MODULE}.{cls}", "tensor": spec, "description": doc}


def image_node(
    shape: tuple[int, int, int], codec: str, *, dtype: str = "uint8", doc: str = ""
) -> dict[str, Any]:
    """An ``Image`` of ``(height, width, channels)`` stored as ``codec`` (``png``/``jpeg``) files."""
    spec = {"shape": _dims(shape), "dtype": dtype, "encodingFormat": codec}
    return {"pythonClassName": f"{FEATURES_MODULE}.image_feature.Image", "image": spec, "description": doc}


def text_node(doc: str = "") -> dict[str, Any]:
    """A ``Text`` feature (one UTF-8 string per element)."""
    return {"pythonClassName": f"{FEATURES_MODULE}.text_feature.Text", "text": {}, "description": doc}


def dict_node(features: dict[str, Any]) -> dict[str, Any]:
    """A ``FeaturesDict`` of the named nodes."""
    return {
        "pythonClassName": f"{FEATURES_MODULE}.features_dict.FeaturesDict",
        "featuresDict": {"features": features},
    }


def steps_node(step: dict[str, Any]) -> dict[str, Any]:
    """RLDS's ``steps``: a ``Dataset`` feature (a sequence of unknown length) of ``step``."""
    return {
        "pythonClassName": f"{FEATURES_MODULE}.dataset_feature.Dataset",
        "sequence": {"feature": step, "length": "-1"},
    }
