"""Where a SQLite file lives: a file on a network filesystem is shared by no lock that holds.

SQLite's locks and its WAL index (the `-shm` file, shared memory) hold between processes of
one machine only; SQLite's own documentation says WAL "does not work over a network
filesystem". A user who outgrows one machine and points a second one's workers at the file on
an NFS share gets no error, only a database two machines write without a lock between them.
So the engine says so, once, when it opens such a file (it does not refuse: one machine alone
on a share may be what the user meant). Across machines, PostgreSQL is the answer.

Linux only: the filesystem is read from /proc/self/mountinfo (elsewhere nothing is said).
"""

from __future__ import annotations

import logging
import os
import re
from pathlib import Path

log = logging.getLogger("blok.sqlite")

MOUNTINFO = Path("/proc/self/mountinfo")
# The kernel writes a space, tab, newline or backslash in a mount point as an octal escape.
_ESCAPED = re.compile(r"\\([0-7]{3})")

# Filesystems whose files other machines may open too: network shares, cluster filesystems on a
# shared disk, and the shares of a VM's host (another kernel, so another machine to SQLite).
NETWORK_FILESYSTEMS = frozenset(
    {
        "9p",
        "afs",
        "beegfs",
        "ceph",
        "cifs",
        "davfs",
        "gfs2",
        "glusterfs",
        "gpfs",
        "lustre",
        "ncpfs",
        "nfs",
        "nfs4",
        "ocfs2",
        "smb3",
        "smbfs",
        "virtiofs",
        "vboxsf",
    }
)
# FUSE filesystems that reach another machine ("fuse.sshfs" and the like).
NETWORK_FUSE = ("sshfs", "s3fs", "rclone", "gcsfuse", "juicefs", "glusterfs", "cephfs", "goofys")


def filesystem_at(path: Path, mountinfo: str) -> str | None:
    """The type of the filesystem that holds `path` (an absolute, resolved path), by the mount
    table `mountinfo` (the text of /proc/self/mountinfo): that of the deepest mount point
    `path` is under (of two at one point, the later: it hides the other). None if no mount
    holds it."""
    best: tuple[int, str] | None = None
    for line in mountinfo.splitlines():
        fields, _, after = line.partition(" - ")
        parts, kinds = fields.split(), after.split()
        if len(parts) < 5 or not kinds:
            continue
        point = _ESCAPED.sub(lambda found: chr(int(found[1], 8)), parts[4])
        if (path == Path(point) or Path(point) in path.parents) and (
            best is None or len(point) >= best[0]
        ):
            best = (len(point), kinds[0])
    return None if best is None else best[1]


def is_networked(kind: str) -> bool:
    if kind.startswith("fuse."):
        return kind.removeprefix("fuse.") in NETWORK_FUSE
    return kind in NETWORK_FILESYSTEMS


def warn_if_networked(path: Path) -> None:
    """A line in the log if the database file `path` is on a network filesystem."""
    try:
        mountinfo = MOUNTINFO.read_text()
    except OSError:
        return  # not Linux, or no /proc: nothing to go by
    folder = Path(os.path.realpath(path)).parent  # where the file is, past any link
    kind = filesystem_at(folder, mountinfo)
    if kind is not None and is_networked(kind):
        log.warning(
            "%s is on a network filesystem (%s): SQLite's locks do not hold between machines, "
            "so two machines writing it can damage it; keep it on a local disk, and share a "
            "database between machines with PostgreSQL (--db postgresql://...)",
            path,
            kind,
        )
