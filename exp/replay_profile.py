"""Where a prepared call's graph replay spends its host time (batch 1, 262,144 entries,
k 1024, CuPy arrays, out= given): the whole replay's median host time, the graph launch
alone, then cProfile's busiest functions over 3,000 replays.

    PYTHONPATH=. python exp/replay_profile.py
"""

import cupy as cp

import indexer
from host_timing import batch1, host_us, profile, replaying


def main():
    dev, out = batch1()
    step, graph = replaying(dev, out, indexer.Workspace())
    stream = cp.cuda.get_current_stream()
    for _ in range(3):
        print(f"replay {host_us(lambda: step(*dev, out=out), n=300):6.1f} us   graph.launch alone "
              f"{host_us(lambda: graph.launch(stream), n=300):6.1f} us")
    profile(lambda: step(*dev, out=out), 3000, 20, 30)


if __name__ == "__main__":
    main()
