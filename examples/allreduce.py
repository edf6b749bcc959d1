"""Every rank contributes its rank number; allreduce sums them. Run with:

tnt-launch -n 2 -- examples/allreduce.py
"""

import numpy as np
import tnt_comm

rank, size = tnt_comm.rank(), tnt_comm.size()
x = np.full(4, rank, dtype=np.float32)
total = tnt_comm.allreduce(x)
print(f"rank {rank} of {size}: transports {tnt_comm.transports()}, sum of ranks = {total[0]:g}")
assert total[0] == size * (size - 1) / 2
