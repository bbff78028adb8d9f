"""A SQLite file on a network filesystem: SQLite's locks and WAL hold between the processes of
one machine only, so the engine says so when it opens one (engine/backends/sqlite/filesystem.py).

The mount table is the real one of this machine where it can be (no network share is mounted
here), and a copy of one, lines as Linux writes them, where a share has to be in it."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from engine import Engine
from engine.backends.sqlite import filesystem
from engine.backends.sqlite.filesystem import MOUNTINFO, filesystem_at, is_networked

pytestmark = pytest.mark.anyio

# /proc/self/mountinfo of a machine with an NFS share at /mnt/shared and a folder with a space.
MOUNTS = """\
22 1 8:1 / / rw,relatime shared:1 - ext4 /dev/sda1 rw
25 22 0:21 / /dev/shm rw,nosuid,nodev shared:3 - tmpfs tmpfs rw
40 22 0:45 / /mnt/shared rw,relatime shared:20 - nfs4 files:/export rw,vers=4.2,addr=10.0.0.2
41 22 0:46 / /mnt/my\\040files rw,relatime shared:21 - fuse.sshfs me@box:/data rw,user_id=0
"""


def test_the_deepest_mount_holding_a_path_gives_its_filesystem() -> None:
    assert filesystem_at(Path("/mnt/shared/app/blok.db"), MOUNTS) == "nfs4"
    assert filesystem_at(Path("/mnt/shared"), MOUNTS) == "nfs4"
    assert filesystem_at(Path("/mnt/sharedother/blok.db"), MOUNTS) == "ext4"  # by path, not text
    assert filesystem_at(Path("/mnt/my files/blok.db"), MOUNTS) == "fuse.sshfs"
    assert filesystem_at(Path("/home/me/blok.db"), MOUNTS) == "ext4"
    assert [is_networked(k) for k in ("nfs4", "fuse.sshfs", "ext4", "tmpfs", "fuse.lxcfs")] == [
        True,
        True,
        False,
        False,
        False,
    ]


@pytest.mark.skipif(not MOUNTINFO.exists(), reason="no /proc/self/mountinfo (not Linux)")
async def test_a_file_on_a_local_disk_is_opened_without_a_word(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    kind = filesystem_at(tmp_path.resolve(), MOUNTINFO.read_text())
    assert kind is not None and not is_networked(kind), kind
    with caplog.at_level(logging.WARNING, logger="blok.sqlite"):
        async with Engine(database=str(tmp_path / "blok.db")):
            pass
    assert "network filesystem" not in caplog.text


async def test_a_file_on_a_network_share_is_named_when_it_is_opened(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The mount table says the folder is an NFS share (this machine has none to mount)."""
    folder = tmp_path.resolve()
    table = tmp_path / "mountinfo"
    table.write_text(MOUNTS + f"50 22 0:60 / {folder} rw shared:30 - nfs4 files:/blok rw\n")
    monkeypatch.setattr(filesystem, "MOUNTINFO", table)
    database = folder / "blok.db"
    with caplog.at_level(logging.WARNING, logger="blok.sqlite"):
        async with Engine(database=str(database)):
            pass
    [line] = [r.getMessage() for r in caplog.records if "network filesystem" in r.getMessage()]
    assert line.startswith(f"{database} is on a network filesystem (nfs4)")
    assert "PostgreSQL" in line
