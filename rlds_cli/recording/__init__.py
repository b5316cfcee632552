"""Recording from a gymnasium environment into an rlds dataset.

``rlds_cli.record`` and ``rlds_cli.RecordEpisodes`` (:mod:`rlds_cli.recording.recorder`) are the
public entry points; :mod:`.episode` maps spaces to TED keys and assembles episodes,
:mod:`.torchrl` cuts TorchRL rollouts into episodes. Nothing here imports gymnasium or torch until
it is used.
"""
