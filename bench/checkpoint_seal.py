"""Cost of sealing a checkpoint (SHA-256 + fsync of every file, manifest) and of verifying it.

    python bench/checkpoint_seal.py [--gib 1] [--files 4] [--dir /tmp]

Writes `--files` random files totalling `--gib` GiB into a staging dir, then times
manifest.seal (hash + fsync, files on parallel threads) and manifest.check (sizes + hashes),
and reports seconds per GB. The files are in the page cache, as right after a save; the figure
is hashing + fsync, not disk reads. Also times single-threaded hashlib for comparison.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import tempfile
import time

from dagrl.trainer import manifest


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--gib", type=float, default=1.0)
    ap.add_argument("--files", type=int, default=4)
    ap.add_argument("--dir", default=tempfile.gettempdir())
    args = ap.parse_args()
    total = int(args.gib * 2**30)
    block = os.urandom(64 << 20)
    root = tempfile.mkdtemp(dir=args.dir, prefix="seal-bench-")
    try:
        per_file = total // args.files
        for i in range(args.files):
            with open(os.path.join(root, f"shard_{i}.bin"), "wb") as f:
                for off in range(0, per_file, len(block)):
                    f.write(block[: min(len(block), per_file - off)])
        gb = per_file * args.files / 1e9
        start = time.perf_counter()
        manifest.seal(root)
        seal_s = time.perf_counter() - start
        start = time.perf_counter()
        assert manifest.check(root) is None
        check_s = time.perf_counter() - start
        print(f"{gb:.2f} GB in {args.files} files, {os.cpu_count()} cores")
        print(f"seal (sha256 + fsync, threads):  {seal_s:.2f} s = {seal_s / gb:.2f} s/GB")
        print(f"verify (sizes + sha256, threads): {check_s:.2f} s = {check_s / gb:.2f} s/GB")
        data = memoryview(block)
        for name in ("sha256", "blake2b", "md5"):
            h, start = hashlib.new(name), time.perf_counter()
            for off in range(0, len(data), 8 << 20):
                h.update(data[off : off + (8 << 20)])
            print(
                f"{name} one thread, in memory: {(time.perf_counter() - start) / (len(block) / 1e9):.2f} s/GB"
            )
    finally:
        shutil.rmtree(root)


if __name__ == "__main__":
    main()
