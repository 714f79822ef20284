#!/usr/bin/env python3
"""Write a trace of many tiny events: the worst case of memory per byte of JSON.

    python3 benchmarks/make_tiny_events.py OUT.pt.trace.json [--events 10000000] [--steps 10]

The file (~43 bytes per event: 10M events are ~430 MB, the "10M tiny events" of issues 20
and 39) holds, in time order on one host thread:
- ``--events`` events in all, almost all minimal complete CPU events
  ``{"ph":"X","name":"a","ts":T,"dur":1}`` (no category, pid or tid: the loader takes them
  as CPU ops on one thread), names from eight one-letter names, 2 µs apart;
- ``--steps`` ``ProfilerStep#N`` user annotations splitting the events into equal steps;
- every ``--kernel-every`` events (default 1000) a ``cudaLaunchKernel`` runtime call and its
  kernel (GPU 0, stream 7, linked by ``correlation``), 1 µs later on the GPU.

Metadata: one ``deviceProperties`` entry (an A100-like GPU) so that the GPU analyses run.
Standard library only; writes in blocks, so its own memory stays small. Write it under /tmp
(it is large), never into the repository.
"""
from __future__ import annotations

import argparse
import json

NAMES = "abcdefgh"
DEVICE = {"id": 0, "name": "A100-like", "totalGlobalMem": 42314694656, "computeMajor": 8, "computeMinor": 0,
          "maxThreadsPerBlock": 1024, "maxThreadsPerMultiprocessor": 2048, "regsPerBlock": 65536,
          "regsPerMultiprocessor": 65536, "warpSize": 32, "sharedMemPerBlock": 49152,
          "sharedMemPerMultiprocessor": 167936, "numSms": 108, "sharedMemPerBlockOptin": 166912}


def events(n: int, steps: int, kernel_every: int):
    """The event lines, in time order (count: exactly ``n``)."""
    per_step = max(1, n // max(1, steps))
    made = 0
    i = 0  # index of the next tiny event (its time slot)
    step = 0
    while made < n:
        ts = 2 * i
        if step < steps and i >= step * per_step:
            yield ('{"ph":"X","cat":"user_annotation","name":"ProfilerStep#%d","ts":%d,"dur":%d}'
                   % (step, ts, 2 * per_step - 1))
            step += 1
            made += 1
        elif kernel_every and i % kernel_every == kernel_every - 1 and made + 2 <= n:
            corr = i // kernel_every + 1
            yield ('{"ph":"X","cat":"cuda_runtime","name":"cudaLaunchKernel","ts":%d,"dur":1,'
                   '"args":{"correlation":%d}}' % (ts, corr))
            yield ('{"ph":"X","cat":"kernel","name":"k%s","pid":0,"tid":7,"ts":%d,"dur":1,'
                   '"args":{"device":0,"stream":7,"correlation":%d,"grid":[1,1,1],"block":[128,1,1]}}'
                   % (NAMES[corr % 8], ts + 1, corr))
            made += 2
            i += 1
        else:
            yield '{"ph":"X","name":"%s","ts":%d,"dur":1}' % (NAMES[i % 8], ts)
            made += 1
            i += 1


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out")
    p.add_argument("--events", type=int, default=10_000_000)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--kernel-every", type=int, default=1000, help="a launch and its kernel every N events (0: none)")
    a = p.parse_args(argv)
    with open(a.out, "w", encoding="utf-8") as f:
        f.write('{"schemaVersion":1,"deviceProperties":[%s],"traceEvents":[\n' % json.dumps(DEVICE))
        block = []
        first = True
        for line in events(a.events, a.steps, a.kernel_every):
            block.append(line)
            if len(block) >= 100_000:
                f.write(("" if first else ",\n") + ",\n".join(block))
                first = False
                block = []
        if block:
            f.write(("" if first else ",\n") + ",\n".join(block))
        f.write("\n]}\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
