"""The NmtError family: errors whose message says what is wrong and what to do.

The CLI turns any NmtError into one red line on stderr and exit code 1. The core raises these
(never typer/rich errors), so every command reports bad input the same way.
"""


class NmtError(Exception):
    """Base class: the message is shown to the user as one line; it should say how to fix the problem."""


class ConfigError(NmtError):
    """An invalid option, preset or combination of settings."""


class DataError(NmtError):
    """Input text or a prepared data directory is missing, malformed or inconsistent."""


class CheckpointError(NmtError):
    """A checkpoint is missing, truncated, foreign, too new or incompatible."""


class DownloadError(NmtError):
    """A corpus or model could not be downloaded (e.g. offline)."""


class DeviceError(NmtError):
    """A requested device or precision is not available on this machine."""


class TrainingError(NmtError):
    """Training diverged (NaN/inf loss) or cannot continue."""
