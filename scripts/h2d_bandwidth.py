"""Host-to-device and device-to-host copy bandwidth of pinned memory (the host tier's links).

Times ``torch`` copies between a pinned host buffer and the GPU with CUDA events, per copy
size, median of repeats; sizes include one host chunk of the studied models (a block id's
bytes) and batches of them, as the OffloadingConnector moves them. Prints one JSON line per
size and direction. Needs a CUDA GPU (the project's lent device machine runs it); on a
machine without one it says so and exits 0.

Run: ``python scripts/h2d_bandwidth.py [--out FILE]``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys

#: Bytes per block id (one host chunk) as the project's geometry derives them
#: (``block_geometry``): Qwen3-Next-80B-A3B (544-token blocks) and Nemotron-3-Nano-30B-A3B
#: (2,096-token blocks), bf16 KV.
CHUNKS = {"qwen3-next chunk": 13_369_344, "nemotron-3-nano chunk": 12_877_824}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=None, help="also write the JSON lines here")
    ap.add_argument("--repeats", type=int, default=20)
    args = ap.parse_args(argv)
    import torch

    if not torch.cuda.is_available():
        print("no CUDA device: nothing to measure")
        return 0
    sizes = {"64 KiB": 64 << 10, "1 MiB": 1 << 20, **CHUNKS,
             "16 qwen3-next chunks": 16 * CHUNKS["qwen3-next chunk"], "1 GiB": 1 << 30}
    biggest = max(sizes.values())
    host = torch.empty(biggest, dtype=torch.uint8, pin_memory=True)
    dev = torch.empty(biggest, dtype=torch.uint8, device="cuda")
    host.fill_(1)
    lines = []
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    for name, n in sizes.items():
        for direction in ("h2d", "d2h"):
            src, dst = (host[:n], dev[:n]) if direction == "h2d" else (dev[:n], host[:n])
            for _ in range(3):
                dst.copy_(src, non_blocking=True)
            torch.cuda.synchronize()
            times = []
            for _ in range(args.repeats):
                start.record()
                dst.copy_(src, non_blocking=True)
                end.record()
                end.synchronize()
                times.append(start.elapsed_time(end) / 1e3)
            t = statistics.median(times)
            line = {"size": name, "bytes": n, "direction": direction, "median_s": t,
                    "GB_per_s": n / t / 1e9, "device": torch.cuda.get_device_name(0)}
            lines.append(line)
            print(json.dumps(line), flush=True)
    if args.out:
        with open(args.out, "w") as f:
            f.writelines(json.dumps(x) + "\n" for x in lines)
    return 0


if __name__ == "__main__":
    sys.exit(main())
