"""An error's hint reaches a library user too: a traceback prints it under the message."""

from __future__ import annotations

import pickle
import traceback

import pytest

from rlds_cli.errors import DatasetExistsError, MissingExtraError, RldsError, import_extra


def test_a_traceback_shows_the_hint_under_the_message() -> None:
    """``Loader(..., as_tensordict=True)`` without tensordict said what was missing, not the
    ``pip install`` line, which only the CLI printed."""
    with pytest.raises(MissingExtraError) as info:
        import_extra("rlds_no_such_module", "as_tensordict=True", hint="pip install 'rlds-cli[torchrl]'")
    shown = "".join(traceback.format_exception(info.value))
    assert shown.rstrip().endswith("hint: pip install 'rlds-cli[torchrl]'")
    assert str(info.value) == "as_tensordict=True needs rlds_no_such_module, which is not installed"


def test_a_changed_hint_replaces_the_note_and_survives_pickling() -> None:
    exc = DatasetExistsError("dataset 'x' already exists", hint="open it with mode='append'")
    exc.hint = "give another name"
    assert exc.__notes__ == ["hint: give another name"]
    back = pickle.loads(pickle.dumps(exc))  # from a worker process
    assert (str(back), back.hint, back.__notes__) == (str(exc), exc.hint, exc.__notes__)
    exc.add_note("more")  # what Hypothesis and others add is kept
    exc.hint = ""
    assert exc.__notes__ == ["more"] and not getattr(RldsError("no hint"), "__notes__", None)
