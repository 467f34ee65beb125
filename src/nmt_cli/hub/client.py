"""The one wrapper around huggingface_hub's client, for model repositories (pull.py: `hf:` models; push.py: `nmt push`) and
corpus files (data/hub_corpora.py: `nmt prepare NAME`): where the cache is, the one offline rule, and the one mapping of
the client's failures to a `DownloadError` line that names what failed and says what to do.

The offline rule: nmt is offline when HF_HUB_OFFLINE is set or when the hub does not answer within
REACH_TIMEOUT_S (asked through the client's own HTTP session, so its proxies and endpoint apply). Offline, what
the cache holds is used (with a note) and what it lacks is one line saying so.
"""

from __future__ import annotations

import errno
import socket
from dataclasses import dataclass
from pathlib import Path

from nmt_cli.errors import DownloadError

REACH_TIMEOUT_S = 5.0
DISK_ERRORS = {errno.ENOSPC, errno.EDQUOT}
PERMISSION_ERRORS = {errno.EACCES, errno.EROFS, errno.EPERM}


def endpoint() -> str:
    from huggingface_hub import constants

    return constants.ENDPOINT


def cache_dir(override: str | Path | None = None) -> Path:
    """The hub cache nmt reads and writes: `override`, else HF_HUB_CACHE (default HF_HOME/hub)."""
    from huggingface_hub import constants

    return Path(override) if override else Path(constants.HF_HUB_CACHE)


def reachable() -> bool:
    """Whether the hub answers within REACH_TIMEOUT_S, asked through huggingface_hub's own HTTP session (its
    proxies and endpoint apply), so that an offline machine is not kept waiting by the client's retries."""
    from huggingface_hub.utils import get_session

    try:
        get_session().head(endpoint(), timeout=REACH_TIMEOUT_S)
        return True
    except Exception:  # noqa: BLE001 (requests and httpx raise different connection errors)
        return False


OFFLINE_SET = "HF_HUB_OFFLINE is set"  # offline_reason() when the user asked for it


def offline_reason() -> str | None:
    """Why nmt is offline (HF_HUB_OFFLINE, or the hub does not answer), or None when it is online."""
    from huggingface_hub import constants

    if constants.HF_HUB_OFFLINE:
        return OFFLINE_SET
    if not reachable():
        return f"{endpoint()} cannot be reached (check the network or the proxy: HTTPS_PROXY/HTTP_PROXY)"
    return None


@dataclass(frozen=True)
class Target:
    """What a request fetches, for its error line: a file of a repository at a revision. `pinned`: the revision
    and file list are nmt's own (a corpus), so a mismatch is nmt's to fix; otherwise the user named them."""

    repo: str
    filename: str
    revision: str | None = None  # None: the default branch
    pinned: bool = False
    label: str | None = None  # how the user wrote it (hf:ORG/NAME@REV), when that reads better

    @property
    def rev(self) -> str:
        if not self.revision:
            return "main"
        return self.revision[:8] if self.pinned else self.revision

    @property
    def what(self) -> str:
        return self.label or f"{self.filename} of {self.repo} at revision {self.rev}"


def error(exc: BaseException, target: Target, action: str = "download", hint: str = "",
          offline_why: str | None = None) -> DownloadError:
    """One line for any failure of the hub client: what failed and what to do (`hint` ends it: how to do without
    the hub). Raise it `from exc`, so callers can still look at the client's error."""
    from huggingface_hub import utils as hu

    what, repo = target.what, target.repo
    status = getattr(getattr(exc, "response", None), "status_code", None)
    detail = _first_line(exc)
    local_missing = getattr(hu, "LocalEntryNotFoundError", ())
    if local_missing and isinstance(exc, local_missing) and offline_why == OFFLINE_SET:
        return DownloadError(f"{what} is not in the hub cache ({cache_dir()}) and HF_HUB_OFFLINE is set; unset it "
                             "to download it")  # the user chose offline: the one remedy is to go online
    if local_missing and isinstance(exc, local_missing) and offline_why:
        msg = f"{what} is not in the hub cache ({cache_dir()}) and {offline_why}"  # the reason names its remedy
    elif local_missing and isinstance(exc, local_missing):
        msg = (f"{what} is not in the hub cache ({cache_dir()}) and the hub is not asked; download it once while "
               "online (or set HF_HUB_CACHE to a cache that holds it)")
    elif isinstance(exc, hu.OfflineModeIsEnabled):
        msg = f"cannot {action} {what}: HF_HUB_OFFLINE is set; unset it to download"
    elif isinstance(exc, hu.RevisionNotFoundError):
        fix = "please report it" if target.pinned else "give an existing branch, tag or commit"
        msg = f"the hub has no revision {target.rev} of {repo} (HTTP {status}); {fix}"
    elif isinstance(exc, hu.EntryNotFoundError):
        fix = ("nmt's pinned file list does not match the hub; please report it" if target.pinned
               else f"name the file: hf:{repo}/FILE.pt")
        msg = f"the hub has no {target.filename} in {repo} at revision {target.rev} (HTTP {status}); {fix}"
    elif isinstance(exc, hu.GatedRepoError) or status in (401, 403):
        gated = "; the repository is gated: accept its terms on the hub and" if isinstance(exc, hu.GatedRepoError) \
            else ":"
        msg = (f"the hub refused access to {what} (HTTP {status}){gated} log in (`hf auth login` or HF_TOKEN) with "
               "an account that may read it")
    elif isinstance(exc, hu.RepositoryNotFoundError) or status == 404:
        msg = (f"the hub says {repo} does not exist or needs a login (HTTP {status}) while fetching "
               f"{target.filename}: check the name and HF_ENDPOINT, or log in (`hf auth login` or HF_TOKEN)")
    elif status == 429:
        msg = (f"the hub rate-limited the requests for {what} (HTTP 429): wait a few minutes and run again "
               "(finished files stay cached), or log in (HF_TOKEN) for a higher limit")
    elif status is not None:
        msg = f"the hub answered HTTP {status} for {what} ({detail}): try again later (finished files stay cached)"
    elif isinstance(exc, OSError) and exc.errno in DISK_ERRORS:
        msg = (f"the disk is full while downloading {what}; free some space or set HF_HUB_CACHE to a disk with "
               "room, then run again (the download resumes)")
    elif isinstance(exc, OSError) and exc.errno in PERMISSION_ERRORS:
        msg = f"cannot write {what} into the cache ({exc.strerror}); set HF_HUB_CACHE to a writable directory"
    elif is_network_error(exc):
        msg = (f"cannot reach {endpoint()} to {action} {what} ({detail}); check the network or the proxy "
               "(HTTPS_PROXY/HTTP_PROXY), then run again (a partial download resumes)")
    else:
        msg = f"{action} {what} failed ({type(exc).__name__}: {detail})"
    return DownloadError(msg + tail(hint))


def is_network_error(exc: BaseException) -> bool:
    """A connection/timeout error of requests (huggingface_hub < 1) or httpx (>= 1), or a plain socket error."""
    names = {c.__name__ for c in type(exc).__mro__}
    return bool(names & {"ConnectionError", "ConnectError", "Timeout", "TimeoutException", "ProxyError",
                         "NetworkError", "RemoteProtocolError", "ConnectTimeout", "ReadTimeout"}) or \
        isinstance(exc, (ConnectionError, TimeoutError, socket.gaierror))


def tail(hint: str) -> str:
    return f"; or {hint}" if hint else ""


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    line = text[0] if text else type(exc).__name__
    return line if len(line) <= 160 else line[:157] + "..."
