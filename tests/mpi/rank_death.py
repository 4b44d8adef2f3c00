"""A rank that dies (without finalising MPI) while the others wait in a
collective: the job must end, with a failure, rather than leave them
waiting. Run by rank_death.sh under mpirun; rank 0 printing "returned"
would mean the allreduce completed without rank 1."""
import os

from lazydag import dist, nd

dist.init()
if dist.rank() == 1:
    os._exit(3)  # dies: no finalize, no collective
x = dist.allreduce(nd.ones((1 << 16,)))
x.wait_to_read()
print("rank 0: allreduce returned without rank 1")
