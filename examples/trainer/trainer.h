// tutti-train: data-parallel SGD on Fashion-MNIST over a tutti (NCCL API) communicator, as
// users know it from PyTorch DDP: parameters broadcast from rank 0, DistributedSampler-style
// disjoint shards of every global batch, bucketed gradient all-reduce (ncclAvg) overlapping the
// backward pass, SGD with momentum and weight decay, checkpoints and per-epoch evaluation.
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "examples/trainer/dataset.h"
#include "nccl.h"

namespace trainer {

struct Options {
  std::string data_dir = "/usr/share/datasets/fashion-mnist";
  std::string device = "cpu";
  int epochs = 3;
  int batch = 128;  // global batch: samples per optimizer step over all ranks
  int accum = 1;    // gradient accumulation steps per optimizer step
  double lr = 0.05, momentum = 0.9, weight_decay = 5e-4;
  ncclDataType_t grad_dtype = ncclFloat32;  // all-reduce wire type: fp32 or bf16
  std::vector<int> hidden = {256, 128};
  uint64_t seed = 1;
  int64_t max_steps = -1;  // stop after this many optimizer steps in all (-1: all epochs)
  int train_limit = 0, test_limit = 0;  // use only the first N samples (0: all)
  std::string checkpoint;               // written by rank 0 after every epoch and at the end
  int64_t save_every = 0;               // ... and every N optimizer steps
  std::string resume;                   // read by rank 0 and broadcast
  // Resume from `checkpoint` where rank 0 finds that file, else start afresh: a job restarted
  // whole (torchrun --max_restarts, a requeued Slurm job) picks up its last checkpoint. Across
  // hosts the file must be where every host sees it (a restart may put rank 0 elsewhere).
  bool auto_resume = false;
  size_t bucket_bytes = 256 * 1024;
  bool overlap = true;       // all-reduce buckets during backward (on a communication thread)
  bool overlap_auto = true;  // main program: decide from cores per local rank (--overlap auto)
  std::string overlap_why;   // printed beside the choice
  int threads = 0;           // main program only: N ranks as threads of this process
  FILE* out = stdout;        // rank 0's progress lines; nullptr for none
};

// Parses the command line into *o. Returns 0 to go on, 1 after printing --help, -1 on a bad
// argument (with *error saying which).
int parseOptions(int argc, char** argv, Options* o, std::string* error);
const char* usage();

struct EpochStats {
  int epoch = 0;  // 1-based
  int64_t steps = 0;
  double train_loss = 0, train_acc = 0, test_loss = 0, test_acc = 0;
  double seconds = 0, samples_per_s = 0, comm_share = 0, exposed_share = 0;
};

struct TrainResult {
  bool ok = false;
  std::string error;  // what went wrong on this rank, when !ok
  // The error is one every rank finds alike by itself (a batch the ranks do not divide): one
  // report of it is enough.
  bool same_everywhere = false;
  int64_t steps = 0;  // optimizer steps taken in all (including those before a resume)
  std::vector<float> params, momentum;
  std::vector<EpochStats> epochs;
};

// Runs training on this rank. Every rank of comm must call it with the same options. data may
// be shared by ranks in one process; when null, the rank loads o.data_dir itself. Failures on
// any rank during set-up end the run on every rank with a message.
TrainResult train(ncclComm_t comm, const Options& o, const Dataset* data = nullptr);

// Sets OpenBLAS's thread count when the BLAS is OpenBLAS (a no-op otherwise).
void setBlasThreads(int n);

}  // namespace trainer
