// tutti-train: data-parallel SGD on Fashion-MNIST over tutti. See trainer.h and --help.
//   tutti-run -n 4 tutti-train --epochs 3          (or torchrun / srun / mpirun)
//   tutti-train --threads 4                        (4 ranks as threads of one process)
#include <unistd.h>

#include <algorithm>
#include <condition_variable>
#include <cstdlib>
#include <mutex>
#include <thread>

#include "examples/trainer/blas_core.h"
#include "examples/trainer/gpu_model.h"
#include "examples/trainer/trainer.h"
#include "tutti.h"

namespace {

bool launchedByLauncher() {
  for (const char* v : {"RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "SLURM_PROCID"}) {
    if (getenv(v)) return true;
  }
  return false;
}

int localRanks() {
  // SLURM_NTASKS_PER_NODE is set only with --ntasks-per-node; SLURM_TASKS_PER_NODE always
  // ("4", "2(x3)" or "3,2": its first figure is a node's, close enough for a thread count).
  for (const char* v : {"LOCAL_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS",
                        "SLURM_NTASKS_PER_NODE", "SLURM_TASKS_PER_NODE"}) {
    const char* s = getenv(v);
    if (s && atoi(s) > 0) return atoi(s);
  }
  return 1;
}

// A communication thread pays only where it has a core of its own: on a machine with fewer
// than two cores per rank it competes with the backward pass it is meant to hide behind.
void chooseOverlap(trainer::Options* o, int local_ranks) {
  if (!o->overlap_auto) return;
  if (o->device == "cuda") {  // the overlap costs no core there: a stream, not a thread
    o->overlap = true;
    return;
  }
  long cores = sysconf(_SC_NPROCESSORS_ONLN);
  o->overlap = cores >= 2L * local_ranks;
  o->overlap_why = "--overlap auto: " + std::to_string(local_ranks) + " local rank" +
                   (local_ranks > 1 ? "s" : "") + " on " + std::to_string(cores) + " cores";
}

// Prints a failed rank's error, once: `printed` holds the errors already reported (ranks of
// one process that fail alike, such as on a batch they do not divide, say it once).
int report(const trainer::TrainResult& r, std::vector<std::string>* printed) {
  if (r.ok) return 0;
  const std::string what = r.error.empty() ? "failed" : r.error;
  if (std::find(printed->begin(), printed->end(), what) == printed->end()) {
    fprintf(stderr, "tutti-train: %s\n", what.c_str());
    printed->push_back(what);
  }
  return 1;
}

int runThreads(trainer::Options o) {
  const int n = o.threads;
  chooseOverlap(&o, n);
  std::vector<ncclComm_t> comms(static_cast<size_t>(n), nullptr);
  std::vector<int> devs(static_cast<size_t>(n), -1);  // -1: a CPU rank
  if (o.device == "cuda") {
    if (std::string err; !trainer::selectGpu(0, &err)) {  // no GPU, or no GPU half
      fprintf(stderr, "tutti-train: %s\n", err.c_str());
      return 1;
    }
    const int gpus = trainer::gpuCount();
    for (int r = 0; r < n; ++r) devs[size_t(r)] = r % gpus;  // several ranks may share a GPU
  }
  if (ncclCommInitAll(comms.data(), n, devs.data()) != ncclSuccess) {
    fprintf(stderr, "tutti-train: ncclCommInitAll failed: %s\n", ncclGetLastError(nullptr));
    return 1;
  }
  trainer::setBlasThreads(1);
  trainer::Dataset data;
  std::string err;
  const bool loaded = trainer::loadDataset(o.data_dir, o.train_limit, o.test_limit, &data, &err);
  if (!loaded) {
    fprintf(stderr, "tutti-train: %s (Debian: apt-get install dataset-fashion-mnist)\n",
            err.c_str());
  }
  std::vector<trainer::TrainResult> results(static_cast<size_t>(n));
  std::vector<std::thread> threads;
  // A rank that fails where the others cannot hear of it (a CUDA or cuBLAS error in mid-step)
  // leaves them waiting for it inside a collective until TUTTI_TIMEOUT. So the first failure
  // aborts every communicator at once: their calls return, the ranks stop, as they would if
  // the failed rank were a process that exited.
  std::mutex mu;
  std::condition_variable cv;
  int finished = 0;
  int firstFailed = -1;  // the rank whose failure stopped the others (-1: none failed)
  if (loaded) {
    for (int r = 0; r < n; ++r) {
      threads.emplace_back([&, r] {
        trainer::TrainResult res = trainer::train(comms[size_t(r)], o, &data);
        std::lock_guard<std::mutex> lock(mu);
        if (!res.ok && firstFailed < 0) firstFailed = r;
        results[size_t(r)] = std::move(res);
        ++finished;
        cv.notify_all();
      });
    }
    {
      std::unique_lock<std::mutex> lock(mu);
      cv.wait(lock, [&] { return finished == n || firstFailed >= 0; });
    }
    if (firstFailed >= 0) {
      for (ncclComm_t c : comms) ncclCommAbort(c);  // safe beside the ranks' own calls
    }
    for (auto& t : threads) t.join();
  }
  int rc = loaded ? 0 : 1;
  std::vector<std::string> printed;
  if (firstFailed >= 0) {  // its error first: the others' follow from it (or from the abort)
    report(results[size_t(firstFailed)], &printed);
    rc = 1;
  }
  for (int r = 0; r < n; ++r) {
    if (loaded && r != firstFailed && report(results[size_t(r)], &printed)) rc = 1;
  }
  if (firstFailed < 0) {
    for (int r = 0; r < n; ++r) {
      ncclComm_t c = comms[size_t(r)];
      if (rc) {
        ncclCommAbort(c);
      } else if (ncclCommDestroy(c) != ncclSuccess) {
        fprintf(stderr, "tutti-train: rank %d: ncclCommDestroy failed: %s\n", r,
                ncclGetLastError(c));
        rc = 1;
      }
    }
  }
  return rc;
}

}  // namespace

int main(int argc, char** argv) {
  trainer::rerunWithBetterBlas(argv);  // first: no thread or communicator exists yet
  trainer::Options o;
  std::string err;
  int p = trainer::parseOptions(argc, argv, &o, &err);
  if (p == 1) {
    fputs(trainer::usage(), stdout);
    return 0;
  }
  if (p < 0) {
    fprintf(stderr, "tutti-train: %s\n%s", err.c_str(), trainer::usage());
    return 2;
  }
  if (o.threads > 0) {
    if (launchedByLauncher()) {  // each launched process would run a job of its own
      fprintf(stderr,
              "tutti-train: --threads starts the ranks itself; under a launcher (tutti-run, "
              "torchrun, srun, mpirun) leave it out: the launcher's processes are the ranks\n");
      return 2;
    }
    return runThreads(o);
  }

  ncclComm_t comm = nullptr;
  ncclResult_t rc;
  int gpu = -1;              // --device cuda: this local rank's GPU
  if (o.device == "cuda") {  // made current before the communicator, which takes it
    const char* lr = getenv("LOCAL_RANK");
    if (!lr) lr = getenv("OMPI_COMM_WORLD_LOCAL_RANK");
    if (!lr) lr = getenv("MPI_LOCALRANKID");  // MPICH's Hydra (PMI), as tuttiCommInitFromEnv
    if (!lr) lr = getenv("SLURM_LOCALID");
    const int local = lr ? atoi(lr) : 0;
    if (std::string err; !trainer::selectGpu(local, &err)) {
      fprintf(stderr, "tutti-train: %s\n", err.c_str());
      return 1;
    }
    gpu = local % trainer::gpuCount();
  }
  if (launchedByLauncher()) {
    rc = tuttiCommInitFromEnv(&comm);
  } else {
    int dev = gpu;
    rc = ncclCommInitAll(&comm, 1, &dev);  // run alone: a one-rank communicator
  }
  if (rc != ncclSuccess) {
    fprintf(stderr, "tutti-train: could not join the communicator: %s: %s\n",
            ncclGetErrorString(rc), ncclGetLastError(nullptr));
    return 1;
  }
  // Share the cores among the ranks on this machine unless the user chose (OPENBLAS_NUM_THREADS).
  if (!getenv("OPENBLAS_NUM_THREADS")) {
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    trainer::setBlasThreads(int(std::max(1L, cores / localRanks())));
  }
  chooseOverlap(&o, launchedByLauncher() ? localRanks() : 1);
  trainer::TrainResult r = trainer::train(comm, o);
  int rank = 0;
  std::vector<std::string> printed;
  // An error every rank makes alike is printed by rank 0 alone, not once per process.
  if (!r.ok && r.same_everywhere && ncclCommUserRank(comm, &rank) == ncclSuccess && rank != 0) {
    printed.push_back(r.error);
  }
  if (report(r, &printed)) {
    ncclCommAbort(comm);
    return 1;
  }
  if ((rc = ncclCommDestroy(comm)) != ncclSuccess) {
    fprintf(stderr, "tutti-train: ncclCommDestroy failed: %s\n", ncclGetLastError(comm));
    return 1;
  }
  return 0;
}
