"""Whether tests/test_cuda_workspace_turns.py can fail: its tests run with Workspace.turn
switched off (a context that neither waits nor records), each five times; prints how
often each test's answers differed from the lone calls'. Then once more with the turn on.

    PYTHONPATH=. python -W ignore exp/turn_off_race.py [0,1,5]
"""

import contextlib
import types

import indexer.workspace
from tests import test_cuda_workspace_turns as t

TESTS = [("two streams, per-token", lambda: t.test_calls_on_two_streams_sharing_a_workspace_each_give_their_lone_answer(False)),
         ("two streams, grouped", lambda: t.test_calls_on_two_streams_sharing_a_workspace_each_give_their_lone_answer(True)),
         ("prepared replays", t.test_prepared_calls_replayed_on_another_stream_wait_for_the_workspace),
         ("threads", lambda: t.test_threads_on_their_own_streams_sharing_a_workspace_each_give_their_lone_answers("own")),
         ("threads, per-thread default", lambda: t.test_threads_on_their_own_streams_sharing_a_workspace_each_give_their_lone_answers("per-thread default")),
         ("PyTorch operators", t.test_the_pytorch_operators_on_two_torch_streams_share_their_device_workspace_safely)]


# what a switched-off turn gives its `with ... as turn` (PreparedCall reads turn.capturing)
_NO_TURN = types.SimpleNamespace(capturing=None)

def run_all(label):
    for name, test in TESTS:
        failed = 0
        for _ in range(5):
            try:
                test()
            except AssertionError:
                failed += 1
        print(f"{label:9s} {name:24s} differed {failed} / 5")


if __name__ == "__main__":
    import sys

    if len(sys.argv) > 1:  # the tests to run, by their place in TESTS
        TESTS[:] = [TESTS[int(i)] for i in sys.argv[1].split(",")]
    on = indexer.workspace.Workspace.turn
    indexer.workspace.Workspace.turn = lambda self: contextlib.nullcontext(_NO_TURN)
    run_all("turn off")
    indexer.workspace.Workspace.turn = on
    # the racing calls can leave the PyTorch operators' device workspace with counts in its
    # histograms that it believes zero: the turn-on rounds start from a new one
    if "indexer.torch_ops" in sys.modules:
        sys.modules["indexer.torch_ops"]._WORKSPACES.clear()
    run_all("turn on")
