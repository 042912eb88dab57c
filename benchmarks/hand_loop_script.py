"""overhead.py's hand-written DDP loop as a script for `raytrainer.launch` (paired.py's variant h): it runs on the
ranks of a raytrainer worker group, in the process group Ray Train set up there.

    hand_loop_script.py STAMPS_PATH STEPS
"""

import os
import sys
import time

import torch.distributed as dist

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import overhead  # noqa: E402

if __name__ == "__main__":
    entered = time.time()
    overhead.hand_loop(overhead.Config(steps=int(sys.argv[2])), dist.get_rank(), dist.get_world_size(), sys.argv[1],
                       entered=entered)
