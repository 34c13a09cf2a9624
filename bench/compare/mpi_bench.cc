// The Open MPI side of the comparison: MPI_Allreduce / MPI_Allgather / MPI_Bcast on floats,
// timed like tutti-perf (warm-up, a barrier, then the average of -n calls, the slowest rank's).
//   mpirun -np 2 tutti-bench-mpi all_reduce -b 8 -e 64M -f 4
#include <mpi.h>

#include "bench/compare/sweep.h"

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  compare::Sweep s = compare::parseSweep(argc, argv);
  int rank, n;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  for (size_t bytes : compare::sizes(s)) {
    size_t total = std::max<size_t>(bytes / sizeof(float), 1);
    size_t per = s.coll == "all_gather" ? std::max<size_t>(total / size_t(n), 1) : total;
    total = s.coll == "all_gather" ? per * size_t(n) : total;
    std::vector<float> send(per, 1.0f), recv(total, 0.0f);
    auto once = [&] {
      if (s.coll == "all_reduce") {
        MPI_Allreduce(send.data(), recv.data(), int(total), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
      } else if (s.coll == "all_gather") {
        MPI_Allgather(send.data(), int(per), MPI_FLOAT, recv.data(), int(per), MPI_FLOAT,
                      MPI_COMM_WORLD);
      } else {
        MPI_Bcast(recv.data(), int(total), MPI_FLOAT, 0, MPI_COMM_WORLD);
      }
    };
    for (int i = 0; i < s.warmup; ++i) once();
    MPI_Barrier(MPI_COMM_WORLD);
    double t0 = compare::nowSeconds();
    for (int i = 0; i < s.iters; ++i) once();
    double t = (compare::nowSeconds() - t0) / s.iters, worst = 0;
    MPI_Allreduce(&t, &worst, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    if (rank == 0) compare::report("mpi", s, total * sizeof(float), worst, n);
  }
  MPI_Finalize();
  return 0;
}
