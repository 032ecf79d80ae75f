"""Checked block files (lmprog.core.blockfile), the disk tier of both backends' KV caches
(issue 34): a process killed while it writes leaves only whole blocks (and at most one
temporary file), every block it left reads back checked, and the next process's BlockDir in
the same folder removes the dead one's files."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import lmprog
from lmprog.core.blockfile import _HEAD, MAGIC, BlockDir, BlockRef

WRITER = """
import sys
from lmprog.core.blockfile import BlockDir
blocks = BlockDir(sys.argv[1])
print(blocks.path, flush=True)
n = 0
while True:
    blocks.write(bytes([n % 251]) * (4 << 20))
    n += 1
    print(n, flush=True)
"""


def test_a_process_killed_mid_write_leaves_whole_blocks_and_the_next_removes_them(tmp_path):
    root = os.path.dirname(os.path.dirname(lmprog.__file__))
    env = {**os.environ, "PYTHONPATH": root + os.pathsep + os.environ.get("PYTHONPATH", "")}
    child = subprocess.Popen(
        [sys.executable, "-c", WRITER, str(tmp_path)], stdout=subprocess.PIPE, text=True, env=env
    )
    try:
        folder = child.stdout.readline().strip()
        while int(child.stdout.readline()) < 3:  # killed while it writes a later block
            pass
        child.send_signal(signal.SIGKILL)
        child.wait(10)
    finally:
        child.kill()
        child.stdout.close()
    names = os.listdir(folder)
    blocks = [n for n in names if n.endswith(".blk")]
    assert len(blocks) >= 3 and len(names) - len(blocks) <= 1  # at most one temporary file
    assert all(n.endswith(".blk.tmp") for n in names if n not in blocks)
    mine = BlockDir(str(tmp_path / "reader"))
    for name in blocks:  # each is whole: its header's size and checksum hold
        path = os.path.join(folder, name)
        with open(path, "rb") as f:
            magic, nbytes, crc = _HEAD.unpack(f.read(_HEAD.size))
        assert magic == MAGIC and nbytes == 4 << 20
        assert mine.read(BlockRef(path, nbytes, crc)) == bytes([int(name[:-4]) % 251]) * nbytes
    mine.close()
    mine = BlockDir(str(tmp_path))  # the next process in the same folder
    try:
        assert not os.path.exists(folder)
        assert sorted(os.listdir(tmp_path)) == sorted([os.path.basename(mine.path), "reader"])
    finally:
        mine.close()
    assert not os.path.exists(mine.path)
